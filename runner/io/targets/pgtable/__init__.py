"""The PostgreSQL table target (issue 29): leads delivered into a table of the user's own
database, ``--target postgresql://USER@HOST:PORT/DB --target-table NAME``.

* :mod:`.names`: where it delivers (the DSN and the table name, checked; no driver);
* :mod:`.shape`: the table's columns, the shape check, and the identity in its comment;
* :mod:`.classify`: a driver failure as runner's verdict (one pure function);
* :mod:`.session`: blocking calls over asyncpg (a private loop, one session kept);
* :mod:`.target`: the adapter, :class:`~.target.PgTableTarget` (a session of its own);
* ``queries.sql``: its SQL by name (``{t}`` is the quoted table).

The page ``docs/how-to/postgresql-target.md`` is its user's guide.
"""

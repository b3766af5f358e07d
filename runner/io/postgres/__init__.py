"""The PostgreSQL adapter (SPEC K1), through asyncpg, an optional dependency.

Nothing here imports asyncpg until a ``postgresql://`` store is opened, so SQLite-only
commands never load it, and a missing driver is one clear line instead of a traceback.

::

    connection.py   the session (name, keepalives), error translation, migrations, scope pin
    schema.py       DDL, triggers and versioned migrations, in a schema of its own
                    (with *_schema.py: the versions of the outbox, candidates, pipeline …)
    lock.py         the worker lock: a session advisory lock, and the in-flight fence
    base.py         one session per store, statement helper, consistent reads
    queries.sql     every statement by name (runner.io.engine runs them)
    delivery.py, pipeline.py, …   the few hooks where PostgreSQL's algorithm differs
    store.py        the Store: the engine's operations and the hooks, and opening one
"""

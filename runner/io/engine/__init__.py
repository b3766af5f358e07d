"""The store engine: domain operations written once over a small connection port.

Each dialect (``runner.io.sqlite``, ``runner.io.postgres``) supplies the port (``Db``:
named statements, a transaction, a read snapshot) and a ``queries.sql`` of named SQL; the
operations here decide, the adapters only return rows.
"""

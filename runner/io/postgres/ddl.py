"""What the PostgreSQL DDL modules (``schema.py``, ``outbox_schema.py``,
``pipeline_schema.py``) share: a trigger function that refuses whatever fired it, which is
how the database keeps a row or a table unchanged."""

from __future__ import annotations


def refuse(name: str, message: str) -> str:
    """A trigger function that refuses whatever fired it."""
    return f"""
CREATE FUNCTION {{s}}.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '{message}' USING ERRCODE = 'integrity_constraint_violation';
END $$;
"""

-- The PostgreSQL table target's SQL, by name (runner.io.engine.queries).  {t} is the
-- target table, quoted and qualified ("schema"."table"), {m} its mark table (the same,
-- for "<table>_runner_mark") and {k} the name of its key index (quoted), put in when the
-- adapter loads this file; parameters are :name.  Every read of the catalog is read-only.

-- the table and its schema, as the shape check needs them: whether the schema exists,
-- the table (absent: NULL), its kind, its comment (the identity), whether the schema
-- holds a runner store, and whether write_id has a key ON CONFLICT (write_id) can use
-- name: inspect_table
SELECT n.oid IS NOT NULL AS has_schema,
       c.oid AS table_oid,
       c.relkind::text AS kind,
       obj_description(c.oid, 'pg_class') AS comment,
       EXISTS (SELECT 1 FROM pg_catalog.pg_class m
               WHERE m.relnamespace = n.oid AND m.relname = 'schema_migrations'
                 AND m.relkind = 'r') AS store_schema,
       EXISTS (SELECT 1 FROM pg_catalog.pg_index i
               JOIN pg_catalog.pg_attribute a
                 ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate
                 AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
                 AND i.indnkeyatts = 1 AND a.attname = 'write_id') AS keyed
FROM (SELECT 1) AS one
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = :schema::name
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = :table::name

-- name: table_columns
SELECT a.attname::text AS name,
       a.atttypid::regtype::text AS type,
       a.attnotnull AS not_null,
       (a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '') AS has_default
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = :table_oid::oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- what runner's role may do with the table (column privileges count), and whether the
-- server takes writes at all (a standby does not)
-- name: table_privileges
SELECT coalesce(bool_and(has_column_privilege(:table_oid::oid, col, 'INSERT'))
                FILTER (WHERE col <> 'status'), false) AS can_insert,
       coalesce(bool_and(has_column_privilege(:table_oid::oid, col, 'SELECT')), false)
           AS can_select,
       pg_is_in_recovery() AS read_only
FROM unnest(ARRAY['write_id', 'tenant', 'source', 'source_lead_id', 'is_test',
                  'contact_alias', 'status']) AS col

-- creating or adopting a table is one transaction under this lock (keyed by the table):
-- two processes preparing one table at once end with one identity
-- name: lock_table
SELECT pg_advisory_xact_lock(:key::bigint)

-- the documented columns; every other column a user adds needs a default or NULL
-- name: create_table
CREATE TABLE {t} (
    write_id       text PRIMARY KEY,
    tenant         text NOT NULL,
    source         text NOT NULL,
    source_lead_id text NOT NULL,
    is_test        boolean NOT NULL,
    contact_alias  text,
    status         text NOT NULL DEFAULT 'new',
    created_at     timestamptz NOT NULL DEFAULT now()
)

-- COMMENT takes no parameters: the server quotes the names and the text (%I, %L)
-- name: comment_statement
SELECT format('COMMENT ON TABLE %I.%I IS %L', :schema::text, :table::text, :comment::text)

-- one statement per batch, atomic; a write_id the table holds already (or twice in the
-- batch) adds no row.  It answers with the batch's rows as stored: the rows it made (as
-- RETURNING gives them, after any trigger of the table) and the rows the table held
-- already, looked up for the batch's write_ids it did not make (the outer SELECT reads
-- the statement's snapshot, which the rows it makes are not in).  A write_id with no row
-- in the answer (a row another session committed after the snapshot) leaves the answer
-- incomplete: the adapter then has the batch read back
-- name: insert_rows
WITH made AS (
    INSERT INTO {t} (write_id, tenant, source, source_lead_id, is_test, contact_alias)
    SELECT * FROM unnest(:write_ids::text[], :tenants::text[], :sources::text[],
                         :source_lead_ids::text[], :is_tests::boolean[], :aliases::text[])
    ON CONFLICT (write_id) DO NOTHING
    RETURNING write_id, tenant, source, source_lead_id, is_test, contact_alias, status
)
SELECT * FROM made
UNION ALL
SELECT write_id, tenant, source, source_lead_id, is_test, contact_alias, status
FROM {t} WHERE write_id = ANY(ARRAY(SELECT unnest(:write_ids::text[])
                                    EXCEPT SELECT write_id FROM made))

-- name: read_rows
SELECT write_id, tenant, source, source_lead_id, is_test, contact_alias, status
FROM {t} WHERE write_id = ANY(:write_ids::text[])

-- every row of the given business keys (tenant, source_lead_id), whatever its write_id
-- (a rewind's readback, issue 30): the two arrays are the keys' two halves, in order
-- name: read_by_keys
SELECT t.write_id, t.tenant, t.source, t.source_lead_id, t.is_test, t.contact_alias,
       t.status
FROM {t} AS t
JOIN (SELECT DISTINCT * FROM unnest(:tenants::text[], :source_lead_ids::text[])
      AS k(tenant, source_lead_id)) AS k
  ON t.tenant = k.tenant AND t.source_lead_id = k.source_lead_id

-- the index read_by_keys uses, made with a table runner creates (a user's table is read
-- without it if it has none)
-- name: create_key_index
CREATE INDEX {k} ON {t} (tenant, source_lead_id)

-- the batch mark (issue 30): one row, the owner (the store that marked the last batch
-- applied, NULL before any) and its seq (epoch << 32 | counter); made with the table, or
-- on the first marked write to a table made before marks
-- name: create_mark_table
CREATE TABLE IF NOT EXISTS {m} (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    owner      text,
    seq        bigint NOT NULL DEFAULT 0 CHECK (seq >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
)

-- its one row (an emptied mark table gets it back: a mark of no owner)
-- name: insert_mark_row
INSERT INTO {m} (one) VALUES (true) ON CONFLICT (one) DO NOTHING

-- the mark table's columns (none: it is not there), for its shape check
-- name: mark_columns
SELECT a.attname::text AS name, a.atttypid::regtype::text AS type
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = to_regclass(:mark_table::text) AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY a.attnum

-- whether runner's role may read and write the mark table
-- name: mark_privileges
SELECT has_table_privilege(:mark_table::text, 'SELECT')
       AND has_table_privilege(:mark_table::text, 'INSERT')
       AND has_table_privilege(:mark_table::text, 'UPDATE')

-- name: read_mark
SELECT owner, seq FROM {m}

-- in a marked batch's transaction, first: the row every marked writer locks, so that
-- concurrent writers serialise on it (the second waits, then reads the first's mark)
-- name: lock_mark
SELECT owner, seq FROM {m} FOR UPDATE

-- a marked batch's rows and its new mark, in one statement (the transaction holds the
-- mark's row lock since lock_mark), answering with the rows as insert_rows does (the
-- mark's UPDATE runs to its end though the answer does not read it)
-- name: insert_rows_marked
WITH made AS (
    INSERT INTO {t} (write_id, tenant, source, source_lead_id, is_test, contact_alias)
    SELECT * FROM unnest(:write_ids::text[], :tenants::text[], :sources::text[],
                         :source_lead_ids::text[], :is_tests::boolean[], :aliases::text[])
    ON CONFLICT (write_id) DO NOTHING
    RETURNING write_id, tenant, source, source_lead_id, is_test, contact_alias, status
), marked AS (
    UPDATE {m} SET owner = :owner::text, seq = :seq::bigint, updated_at = now()
)
SELECT * FROM made
UNION ALL
SELECT write_id, tenant, source, source_lead_id, is_test, contact_alias, status
FROM {t} WHERE write_id = ANY(ARRAY(SELECT unnest(:write_ids::text[])
                                    EXCEPT SELECT write_id FROM made))

-- the fence alone (raise_mark)
-- name: set_mark
UPDATE {m} SET owner = :owner::text, seq = :seq::bigint, updated_at = now()

-- name: read_statuses
SELECT write_id, status FROM {t} WHERE write_id = ANY(:write_ids::text[])

-- name: ping
SELECT 1

-- After the body: the SQL-only flavour's version, kept in the database as
-- pg_extension keeps the extension's. Not part of the body that pg_tle
-- would register: there pg_extension keeps it. One row; loom migrate
-- --sql-only reads it to choose the update steps, and the client checks it
-- as it checks extversion. Readable by every role that may use schema loom
-- (loom_grant_access gives USAGE), writable by the owner alone.
CREATE TABLE loom.sql_only (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version text NOT NULL,
    -- The schema holding loom's functions (the extension's schema).
    function_schema name NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE loom.sql_only IS
'The version of loom''s SQL-only flavour installed in this database (psql -f loom.sql, or loom migrate --sql-only), and the schema of its functions. Absent when loom is the native extension.';
INSERT INTO loom.sql_only (version, function_schema) VALUES ('@version@', '@schema_name@');
GRANT SELECT ON loom.sql_only TO PUBLIC;

-- As CREATE EXTENSION runs a script: only WARNINGs and errors reach the
-- client (psql -f prints no NOTICE of a step that did its work).
SET LOCAL client_min_messages = warning;

-- Before the body: refuse a database that has loom already, whichever
-- flavour, rather than fail halfway on the first object that exists.
DO $loom$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'loom') THEN
        RAISE EXCEPTION 'loom is installed in this database as an extension'
            USING ERRCODE = 'duplicate_object',
                  HINT = 'update it with ALTER EXTENSION loom UPDATE, or loom migrate';
    END IF;
    -- Every object is its installer's, and loom's SECURITY DEFINER
    -- functions run as it: only the database's owner may install, so that
    -- they run as a role that can already do all they do. Installed by a
    -- superuser in a schema the owner controls (public, on 15+), the
    -- owner could replace a function they call and gain the superuser.
    -- As itself: not a session that logged in as another role and set
    -- this one (nor one a `role` setting on the database set).
    IF current_user OPERATOR(pg_catalog.<>) session_user
       OR current_user OPERATOR(pg_catalog.<>) (SELECT pg_catalog.pg_get_userbyid(d.datdba)
            FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) THEN
        RAISE EXCEPTION 'loom''s SQL-only flavour is installed by the database''s owner, and % is not it', current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'connect as the owner of this database (on a managed service, the role that created it)';
    END IF;
    -- Nor in a schema another role may create in (a database made from an
    -- old template leaves CREATE on public to PUBLIC): an overload planted
    -- beside loom's functions would be called in their place, by every
    -- role that calls them.
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_namespace n
                   WHERE n.oid OPERATOR(pg_catalog.=) '@schema_oid@'::pg_catalog.regnamespace
                     -- public's owner on 15+ is pg_database_owner: the
                     -- database's owner, whom the check above requires.
                     AND n.nspowner OPERATOR(pg_catalog.=) ANY (ARRAY[
                         (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user),
                         'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid])) THEN
        RAISE EXCEPTION 'schema % is not owned by %: loom''s functions go in a schema of the installer''s own', '@schema_oid@', current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'CREATE SCHEMA <name>, and install into it (MigrateOptions::schema)';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
               WHERE n.oid OPERATOR(pg_catalog.=) '@schema_oid@'::pg_catalog.regnamespace
                 AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE' AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner) THEN
        RAISE EXCEPTION 'other roles may create in schema %, where loom''s functions would go', '@schema_oid@'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'REVOKE CREATE ON SCHEMA ' OPERATOR(pg_catalog.||) '@schema_oid@' OPERATOR(pg_catalog.||) ' FROM PUBLIC (and any other role that has it), or install into a schema of your own';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'loom') THEN
        RAISE EXCEPTION 'schema loom exists in this database: loom''s SQL-only flavour is installed, or another schema has its name'
            USING ERRCODE = 'duplicate_schema',
                  HINT = 'SELECT version FROM loom.sql_only says which version; loom migrate --sql-only upgrades it';
    END IF;
END
$loom$;

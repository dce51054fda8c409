-- loom's functions name each other by the extension's schema
-- (@extschema@, written into their bodies as text when they are created),
-- and the C write path names it too: names, which another role could take
-- over. On PostgreSQL 15 and later a database's owner owns public, loom's
-- usual schema; renaming it and creating a public of its own would hand
-- every call loom makes, those of its SECURITY DEFINER functions included,
-- to that role's functions (issue 25). So while loom is installed neither
-- its schema nor schema loom may be renamed, by anyone: the extension is
-- not relocatable either, and nothing of loom's would work under another
-- name. An event trigger, because only it sees every role's DDL; it reads
-- the catalog after the command, and its ERROR undoes the rename.
CREATE FUNCTION loom.loom_keep_schema_names()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                   WHERE e.extname = 'loom' AND quote_ident(n.nspname) = '@extschema@')
       OR to_regnamespace('loom') IS NULL THEN
        RAISE EXCEPTION 'loom''s schemas cannot be renamed while loom is installed (@extschema@ and loom)'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'loom''s functions name their schema: under another name, another role''s schema could take its place.';
    END IF;
END
$$;
COMMENT ON FUNCTION loom.loom_keep_schema_names() IS
'Event trigger function: refuses (0A000) a rename of the extension''s schema or of schema loom, by any role, while loom is installed; loom''s functions name both.';
CREATE EVENT TRIGGER loom_keep_schema_names ON ddl_command_end
    WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION loom.loom_keep_schema_names();
COMMENT ON EVENT TRIGGER loom_keep_schema_names IS
'Refuses a rename of loom''s schemas (the extension''s and loom) while loom is installed: loom''s functions name them, and a database''s owner could otherwise put its own schema under the name.';

-- Nor may anyone but a superuser drop them (issue 34): on 15 and later a
-- database's owner owns public, and DROP SCHEMA public CASCADE would drop
-- loom with it; a public of the owner's, with procedures named as loom's,
-- would then take the calls a superuser's documented statements and
-- scheduled jobs make, however exactly typed. At ddl_command_start and
-- in C (loom_pg/src/drop_guard.rs): a trigger dropped with the extension
-- would not fire at sql_drop, and only the parse tree says, before
-- anything is dropped, which schemas a DROP SCHEMA names or a DROP OWNED
-- reaches.
CREATE FUNCTION loom.loom_refuse_drops()
RETURNS event_trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'loom_refuse_drops';
COMMENT ON FUNCTION loom.loom_refuse_drops() IS
'Event trigger function: refuses (42501) a DROP SCHEMA of the extension''s schema or of schema loom, or a DROP OWNED BY their owner, by any role but a superuser, while loom is installed.';
CREATE EVENT TRIGGER loom_refuse_drops ON ddl_command_start
    WHEN TAG IN ('DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION loom.loom_refuse_drops();
COMMENT ON EVENT TRIGGER loom_refuse_drops IS
'Refuses, to every role but a superuser, dropping loom''s schemas (the extension''s and loom) while loom is installed: a database''s owner owns public, and could otherwise drop loom with it and put its own functions under loom''s names.';

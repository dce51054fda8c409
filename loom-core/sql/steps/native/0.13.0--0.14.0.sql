-- loom 0.13.0 -> 0.14.0, what only the extension adds (issue 34): its
-- guard against a database's owner dropping loom's schemas, as
-- loom-core/sql/native/schema_names.sql creates it for a fresh install.
-- Installed after ../0.13.0--0.14.0.sql, in one file with it (the
-- Makefile's install_scripts): its search_path is pinned there.

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

-- The native extension's write path and read of a log's tail, in C
-- (loom_pg/src/append.rs, executions_index.rs, execution_stripes.rs,
-- read_events.rs), run after ../log_api.sql. That file's PL/pgSQL twin of
-- each function is the contract: the signature, parameter names, defaults,
-- return type, attributes, SQLSTATEs and messages every flavour of loom
-- keeps (the SQL-only flavour, for managed PostgreSQL without loom.so,
-- stops at the twins). Here each is replaced with the C that serves it
-- faster (the write path is loom's measured bottleneck: ADR 0108 D2,
-- issue 18), and with stripe locks on a lock tag no SQL function reaches.
--
-- CREATE OR REPLACE, not DROP and CREATE: the function keeps its OID,
-- owner, ACL (privileges.sql's REVOKEs, loom_grant_access's GRANTs),
-- comment, extension membership and the triggers on loom.events that
-- call it; and it refuses a changed return type or parameter names, so a
-- declaration here that drifted from its twin fails the install rather
-- than change the contract. Every clause is restated (the SET search_path
-- of the twin goes with it: C resolves nothing through the search_path).
-- A COMMENT follows only where the twin's says something of the PL/pgSQL
-- alone (its advisory lock key).

CREATE OR REPLACE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb, metadata jsonb DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'loom_append_event_with_metadata_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[], metadata jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'loom_append_events_with_metadata_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.loom_executions_tracked_by_trigger()
RETURNS boolean
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'loom_executions_tracked_by_trigger_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.loom_lock_execution_for_delete(execution_id text)
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'loom_lock_execution_for_delete_wrapper';
COMMENT ON FUNCTION @extschema@.loom_lock_execution_for_delete(text) IS
'Takes, to the end of the transaction, the exclusive lock on the stripe of an execution id that appends hold shared: what loom_delete_events and loom_delete_execution take before they delete, and loom_track_emptied before it looks for events left. Advisory lock (classid 1819242349, objid the stripe 0-63, objsubid 3) in pg_locks. Executable by writers.';

CREATE OR REPLACE FUNCTION @extschema@.loom_lock_executions_for_delete(execution_ids text[])
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'loom_lock_executions_for_delete_wrapper';
COMMENT ON FUNCTION @extschema@.loom_lock_executions_for_delete(text[]) IS
'Takes, to the end of the transaction, the exclusive locks on the stripes of many execution ids at once, in ascending stripe order as a delete statement does: what a retention batch and a repair batch take, so they cannot deadlock with appends over several stripes. The owner''s alone.';

CREATE OR REPLACE FUNCTION @extschema@.loom_lock_execution_for_write(execution_id text)
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'loom_lock_execution_for_write_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.loom_events_track_executions()
RETURNS trigger
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'loom_events_track_executions_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.loom_read_events(execution_id text, after_sequence bigint DEFAULT NULL, max_events integer DEFAULT 1000)
RETURNS TABLE(sequence bigint, kind text, payload jsonb, created_at timestamptz, metadata jsonb)
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'loom_read_events_with_metadata_wrapper';

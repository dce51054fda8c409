-- loom 0.14.0 -> 0.15.0 (issue 36): the server's hints and comments name
-- the client by its published name, pgloom (they said loom-client, a
-- name the crate registry had already given to another crate). The
-- routines are rerun from the current parts (pgloom_core::sql::render_step);
-- the extension leaves out the bodies it has in C, and keeps their
-- comments.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.15.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25): every loom object is named by @extschema@ or loom.
SET LOCAL search_path = pg_catalog, pg_temp;

-- @rerun log_api: loom_append_event, loom_append_events
-- @rerun collation_migration: loom_convert_column_to_c, loom_migrate_collations, loom_drop_events_id_index, loom_ensure_event_metadata
-- @rerun frames: loom_zstd_frame_walk, loom_snapshot_state_text, loom_snapshot_frame, loom_snapshot_frame_info
-- @rerun snapshot_api: loom_ensure_snapshot_zstd

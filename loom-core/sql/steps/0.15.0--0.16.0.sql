-- loom 0.15.0 -> 0.16.0 (issue 37): delta snapshot frames (0x03), read
-- and written in the server. New: loom_frame_format (every reader's first
-- check, once), loom_snapshot_base_sequence, loom_snapshot_state_text and
-- loom_snapshot_state with a keyframe, loom_snapshot_delta_frame, and
-- loom_snapshot_row_state with a keyframe; loom.snapshots_decoded joins
-- each delta's keyframe; loom_save_snapshot takes codec 'delta', and it
-- and pgloom store through loom_store_snapshot, which keeps a keyframe
-- that deltas name; loom_delete_snapshots deletes each
-- keyframe after its deltas; loom_resume returns a delta's keyframe
-- (base_z); loom_status counts keyframes and deltas.
-- The routines are rerun from the current parts; the extension's three
-- new C bodies come first.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.16.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25): every loom object is named by @extschema@ or loom.
SET LOCAL search_path = pg_catalog, pg_temp;

-- @native: the C bodies of the three new frame functions, before the
-- routines rerun below name them
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_state_text(frame bytea, base bytea) RETURNS text
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_state_text_with_base_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_state(frame bytea, base bytea) RETURNS jsonb
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_state_with_base_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_delta_frame(state text, base_sequence bigint, base bytea, deltas_since integer)
    RETURNS bytea
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_delta_frame_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_get_text(frame bytea, base bytea, VARIADIC path text[]) RETURNS text
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_get_text_with_base_wrapper';
-- @end native

-- @rerun frames: loom_frame_format, loom_snapshot_base_sequence, loom_snapshot_state_text, loom_snapshot_state, loom_snapshot_delta_frame, loom_snapshot_frame_info, loom_snapshot_get_text, loom_snapshot_get
-- loom_resume returns a delta's keyframe too (base_z): a new result
-- column, which CREATE OR REPLACE cannot add.
DROP FUNCTION @extschema@.loom_resume(text);
-- @rerun snapshot_api: loom_snapshot_row_state, loom_define_snapshots_decoded, loom_snapshot_keyframe, loom_store_snapshot, loom_save_snapshot, loom_delete_snapshots, loom_resume
-- @rerun status: loom_status
SELECT @extschema@.loom_define_snapshots_decoded();

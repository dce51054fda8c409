-- The native extension's bodies for the snapshot-frame functions: the
-- portable definitions in ../frames.sql are the contract (signatures,
-- parameter names, defaults, attributes, comments); these replace only the
-- bodies of the nine that loom.so implements, with the C functions, which
-- also inflate and write zstd frames (0x02) and deltas (0x03). CREATE OR
-- REPLACE keeps each function's OID, owner, ACL and comment (and so
-- loom_snapshot_get and loom_snapshot_frame(jsonb, text), whose bodies
-- call them), drops the portable SET search_path, and is refused by
-- PostgreSQL if a result type, a parameter name or a default changed: the
-- flavours cannot drift apart.
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_state_text(frame bytea) RETURNS text
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_state_text_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_state(frame bytea) RETURNS jsonb
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_state_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_frame(state text, codec text DEFAULT 'zstd') RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_frame_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_frame_info(frame bytea)
    RETURNS TABLE(format text, stored_bytes integer, declared_bytes bigint, has_checksum boolean)
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_frame_info_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_get_text(frame bytea, VARIADIC path text[]) RETURNS text
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_get_text_wrapper';
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

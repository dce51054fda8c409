-- loom 0.2.0 -> 0.3.0: zstd snapshot frames (ADR 0141 D2, D5, D6).
\echo Use "ALTER EXTENSION loom UPDATE TO '0.3.0'" to load this file. \quit

-- Nothing below resolves a name through a schema another role can create
-- in (issue 25; PostgreSQL's CVE-2020-14350 class): the extension's schema
-- (public by default) belongs to the database's owner, whose operator or
-- function with exact argument types would beat a built-in needing a cast,
-- and run as the superuser applying this script. Every loom object is named
-- by @extschema@ or loom, so only pg_catalog is searched; the setting ends
-- with the script.
SET LOCAL search_path = pg_catalog, pg_temp;

-- The codec argument is new: the old signature goes, the new one comes.
DROP FUNCTION @extschema@.loom_save_snapshot(text, text, bigint, text);

-- Snapshots (ADR 0141 D2, D5, D6): a row holds JSONB in state, or a frame
-- in state_z and the sentinel in state. Every reader decodes.

CREATE FUNCTION @extschema@.loom_snapshot_row_state(state jsonb, state_z bytea)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF state_z IS NOT NULL THEN
        RETURN @extschema@.loom_snapshot_state(state_z);
    END IF;
    -- The sentinel without its frame (the column dropped or nulled) is
    -- corruption: never hand it out as a state.
    IF state = '{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb THEN
        RAISE EXCEPTION 'loom snapshot row holds the frame sentinel but no frame in state_z'
            USING ERRCODE = 'data_corrupted',
                  HINT = 'restore the row from a backup or re-save the snapshot; the event log is the audit record';
    END IF;
    RETURN state;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_snapshot_row_state(jsonb, bytea) IS
'The decoded state of a loom.snapshots row: its frame when state_z is set, else its JSONB; a sentinel without a frame is data_corrupted (XX001).';

-- The view decodes state_z only where the column exists: it is (re)defined
-- whenever loom_ensure_snapshot_zstd adds the column.
CREATE FUNCTION @extschema@.loom_define_snapshots_decoded()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    frame_column text := CASE WHEN EXISTS (
            SELECT 1 FROM pg_attribute a
            JOIN pg_class t ON t.oid = a.attrelid
            JOIN pg_namespace n ON n.oid = t.relnamespace
            WHERE n.nspname = 'loom' AND t.relname = 'snapshots' AND a.attname = 'state_z'
              AND NOT a.attisdropped)
        THEN 's.state_z' ELSE 'NULL::bytea' END;
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE VIEW loom.snapshots_decoded AS
             SELECT s.id, s.execution_id, s.workflow_id, s.sequence, s.created_at,
                    %s.loom_snapshot_row_state(s.state, %s) AS state
             FROM loom.snapshots s',
        -- @extschema@ arrives already quoted where it needs to be.
        '@extschema@', frame_column);
    COMMENT ON VIEW loom.snapshots_decoded IS
        'loom.snapshots with state decoded for every row whatever its format, so state->''x'' works from psql.';
END
$$;
COMMENT ON FUNCTION @extschema@.loom_define_snapshots_decoded() IS
'(Re)defines the view loom.snapshots_decoded for the columns loom.snapshots has now.';

CREATE FUNCTION @extschema@.loom_ensure_snapshot_zstd(lock_timeout_ms integer DEFAULT 200)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    has_column boolean;
    has_check boolean;
BEGIN
    SELECT EXISTS (SELECT 1 FROM pg_attribute a
                   JOIN pg_class t ON t.oid = a.attrelid
                   JOIN pg_namespace n ON n.oid = t.relnamespace
                   WHERE n.nspname = 'loom' AND t.relname = 'snapshots'
                     AND a.attname = 'state_z' AND NOT a.attisdropped),
           EXISTS (SELECT 1 FROM pg_constraint c
                   JOIN pg_class t ON t.oid = c.conrelid
                   JOIN pg_namespace n ON n.oid = t.relnamespace
                   WHERE n.nspname = 'loom' AND t.relname = 'snapshots'
                     AND c.conname = 'snapshots_frame_sentinel')
      INTO has_column, has_check;
    -- Every call after the first takes no table lock.
    IF has_column AND has_check THEN
        RETURN true;
    END IF;
    BEGIN
        -- One short wait for one ACCESS EXCLUSIVE lock: snapshot reads, and
        -- so resume, queue behind it for at most this long.
        PERFORM set_config('lock_timeout', least(lock_timeout_ms, 200) || 'ms', true);
        LOCK TABLE loom.snapshots IN ACCESS EXCLUSIVE MODE;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        -- Catalog-only statements: a nullable column without a default is
        -- no rewrite, a NOT VALID check scans nothing.
        IF NOT has_column THEN
            ALTER TABLE loom.snapshots ADD COLUMN state_z bytea;
            -- A frame is already compressed: the server must not try again.
            ALTER TABLE loom.snapshots ALTER COLUMN state_z SET STORAGE EXTERNAL;
        END IF;
        IF NOT has_check THEN
            ALTER TABLE loom.snapshots ADD CONSTRAINT snapshots_frame_sentinel
                CHECK (state_z IS NULL OR state = '{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb) NOT VALID;
        END IF;
        PERFORM @extschema@.loom_define_snapshots_decoded();
        RETURN true;
    EXCEPTION
        WHEN lock_not_available OR insufficient_privilege OR deadlock_detected OR query_canceled THEN
            RAISE WARNING 'loom: could not add the snapshot frame column: % (SQLSTATE %)', SQLERRM, SQLSTATE
                USING DETAIL = 'Snapshots keep being written as JSONB, which is correct, only larger.',
                      HINT = 'Call SELECT loom_ensure_snapshot_zstd(); again: it retries, and takes no lock once done.';
            RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_snapshot_zstd(integer) IS
'Provisions zstd snapshot frames (ADR 0141 D5): adds loom.snapshots.state_z (bytea, STORAGE EXTERNAL) and the NOT VALID check snapshots_frame_sentinel under one ACCESS EXCLUSIVE lock waited for at most least(lock_timeout_ms, 200) ms. True when both exist (then it takes no lock at all); false, with one WARNING, on a lock timeout, missing privilege, deadlock or cancel. Retry later.';

CREATE FUNCTION @extschema@.loom_save_snapshot(execution_id text, workflow_id text, sequence bigint, state text, codec text DEFAULT 'none')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    saved bigint;
    has_frame_column boolean := EXISTS (
        SELECT 1 FROM pg_attribute a
        JOIN pg_class t ON t.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = 'loom' AND t.relname = 'snapshots' AND a.attname = 'state_z' AND NOT a.attisdropped);
BEGIN
    IF codec = 'zstd' THEN
        IF NOT has_frame_column THEN
            RAISE EXCEPTION 'loom.snapshots has no state_z column for zstd frames'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'SELECT loom_ensure_snapshot_zstd(); adds it (or save with codec ''none'')';
        END IF;
        INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
        VALUES ($1, $2, $3, '{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb,
                @extschema@.loom_snapshot_frame($4, 'zstd'))
        ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
            SET workflow_id = excluded.workflow_id, state = excluded.state,
                state_z = excluded.state_z, created_at = now()
        RETURNING s.id INTO saved;
    ELSIF codec = 'none' THEN
        IF has_frame_column THEN
            -- A re-save over a frame row clears the frame: no stale frame.
            INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
            VALUES ($1, $2, $3, $4::jsonb, NULL)
            ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
                SET workflow_id = excluded.workflow_id, state = excluded.state,
                    state_z = NULL, created_at = now()
            RETURNING s.id INTO saved;
        ELSE
            INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state)
            VALUES ($1, $2, $3, $4::jsonb)
            ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
                SET workflow_id = excluded.workflow_id, state = excluded.state, created_at = now()
            RETURNING s.id INTO saved;
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown snapshot codec %: expected "none" or "zstd"', quote_literal(codec)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN saved;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_save_snapshot(text, text, bigint, text, text) IS
'Saves the state (JSON text) of an execution at a sequence and returns the row id: as JSONB with codec ''none'' (the default), as a zstd frame in state_z beside the sentinel with ''zstd''. A re-save of the same (execution_id, sequence) replaces the row in the format asked and clears the other column.';

CREATE OR REPLACE FUNCTION @extschema@.loom_load_snapshot(execution_id text, at_sequence bigint DEFAULT NULL)
RETURNS TABLE(id bigint, execution_id text, workflow_id text, sequence bigint, created_at timestamptz, state jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Two branches, one of which a one-time filter switches off: the
    -- latest by an index scan backward, or exactly $2.
    (SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
     FROM loom.snapshots_decoded d WHERE $2 IS NULL AND d.execution_id = $1
     ORDER BY d.sequence DESC LIMIT 1)
    UNION ALL
    SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
    FROM loom.snapshots_decoded d WHERE $2 IS NOT NULL AND d.execution_id = $1 AND d.sequence = $2
$$;
COMMENT ON FUNCTION @extschema@.loom_load_snapshot(text, bigint) IS
'The latest snapshot of an execution, or the one at exactly at_sequence (never a neighbour), decoded whatever its row format. No row when there is none.';

-- The decoded view. The frame column is opt-in (ADR 0141 D5, D9): no DDL
-- here, where it would also extend the locks of the 0.1.0 -> 0.2.0
-- conversions when both steps run in one ALTER EXTENSION. An operator or a
-- zstd store calls loom_ensure_snapshot_zstd() after the update committed.
SELECT @extschema@.loom_define_snapshots_decoded();

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

-- A row whose frame may be a delta, with its keyframe's frame (NULL for a
-- keyframe, or where the keyframe is missing): what loom.snapshots_decoded
-- reads. A keyframe takes the one-argument path (the native jsonb
-- builder); a delta whose keyframe is missing raises there, XX001.
CREATE FUNCTION @extschema@.loom_snapshot_row_state(state jsonb, state_z bytea, base_z bytea)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A delta goes to the reader that takes its keyframe even when none
    -- was found: there a missing keyframe is XX001.
    IF state_z IS NOT NULL
       AND (base_z IS NOT NULL OR substring(state_z FROM 1 FOR 1) = decode('03', 'hex')) THEN
        RETURN @extschema@.loom_snapshot_state(state_z, base_z);
    END IF;
    RETURN @extschema@.loom_snapshot_row_state(state, state_z);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_snapshot_row_state(jsonb, bytea, bytea) IS
'The decoded state of a loom.snapshots row whose frame may be a delta (0x03), given the frame of the keyframe it names (base_z; NULL for a keyframe): what loom.snapshots_decoded reads. A delta whose keyframe is missing is data_corrupted (XX001); the SQL-only flavour refuses a delta (0A000).';

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
                    %1$s.loom_snapshot_row_state(s.state, %2$s, %3$s) AS state
             FROM loom.snapshots s%4$s',
        -- @extschema@ arrives already quoted where it needs to be.
        '@extschema@', frame_column,
        -- A delta''s keyframe, by the primary key: same execution (so the
        -- same Citus shard), the sequence its header names.
        CASE WHEN frame_column = 's.state_z' THEN 'b.state_z' ELSE 'NULL::bytea' END,
        CASE WHEN frame_column = 's.state_z' THEN '
             LEFT JOIN loom.snapshots b ON b.execution_id = s.execution_id
                   AND b.sequence = @extschema@.loom_snapshot_base_sequence(s.state_z)' ELSE '' END);
    COMMENT ON VIEW loom.snapshots_decoded IS
        'loom.snapshots with state decoded for every row whatever its format, so state->''x'' works from psql.';
    -- The rows as stored, with a state_z column whether or not the table
    -- has one yet: what loom_resume reads, so that a client can decode a
    -- frame itself, and a function over it stays valid when the column
    -- comes.
    EXECUTE format(
        'CREATE OR REPLACE VIEW loom.snapshots_stored AS
             SELECT s.id, s.execution_id, s.workflow_id, s.sequence, s.created_at, s.state,
                    %s AS state_z
             FROM loom.snapshots s',
        frame_column);
    COMMENT ON VIEW loom.snapshots_stored IS
        'loom.snapshots as stored (a frame row holds the sentinel in state and the frame in state_z), with state_z NULL on every row while the frame column does not exist.';
END
$$;
COMMENT ON FUNCTION @extschema@.loom_define_snapshots_decoded() IS
'(Re)defines the views loom.snapshots_decoded and loom.snapshots_stored for the columns loom.snapshots has now.';

-- Whether loom.snapshots has the frame column and its check, from the
-- catalog alone: a peer may have added them.
CREATE FUNCTION @extschema@.loom_snapshot_frame_catalog(OUT has_column boolean, OUT has_check boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame_catalog() IS
'Whether loom.snapshots has the frame column state_z and the check snapshots_frame_sentinel (ADR 0141 D2), read from the catalog.';

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
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- Every call after the first takes no lock at all, not even the
    -- migration lock.
    SELECT * INTO has_column, has_check FROM @extschema@.loom_snapshot_frame_catalog();
    IF has_column AND has_check THEN
        RETURN true;
    END IF;
    -- Only the table's owner can add the column: anyone else would take
    -- the migration lock and the table's exclusive lock (a writer may),
    -- stalling every snapshot read, before failing.
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'loom.snapshots'::regclass), 'USAGE') THEN
        RAISE WARNING 'loom: could not add the snapshot frame column: % does not own loom.snapshots', current_user
            USING DETAIL = 'Snapshots keep being written as JSONB, which is correct, only larger.',
                  HINT = 'Have the extension''s owner run SELECT @extschema@.loom_ensure_snapshot_zstd(); (or pgloom''s migrate() with the zstd codec).';
        RETURN false;
    END IF;
    BEGIN
        -- Replicas booting together all get here. One at a time, under the
        -- migration lock (ADR 0141 D5), and each looks again once
        -- it holds it: a peer that went first has done the work.
        PERFORM @extschema@.loom_take_migration_lock();
        SELECT * INTO has_column, has_check FROM @extschema@.loom_snapshot_frame_catalog();
        IF has_column AND has_check THEN
            RETURN true;
        END IF;
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
        RAISE NOTICE 'loom: added the snapshot frame column loom.snapshots.state_z and its check';
        RETURN true;
    EXCEPTION
        WHEN lock_not_available OR insufficient_privilege OR deadlock_detected OR query_canceled THEN
            RAISE WARNING 'loom: could not add the snapshot frame column: % (SQLSTATE %)', SQLERRM, SQLSTATE
                USING DETAIL = 'Snapshots keep being written as JSONB, which is correct, only larger.',
                      HINT = 'Call SELECT @extschema@.loom_ensure_snapshot_zstd(); again: it retries, and takes no lock once done.';
            RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_snapshot_zstd(integer) IS
'Provisions zstd snapshot frames (ADR 0141 D5), opt-in: adds loom.snapshots.state_z (bytea, STORAGE EXTERNAL) and the NOT VALID check snapshots_frame_sentinel. True at once, taking no lock, when both exist. Otherwise it queues on loom''s migration lock (so replicas booting together do it once), looks again, and takes one ACCESS EXCLUSIVE lock waited for at most least(lock_timeout_ms, 200) ms (at least 1). False, with one WARNING, on a lock timeout, missing privilege, deadlock or cancel: snapshots stay JSONB; retry later.';

-- The keyframe a delta saved at a sequence is written against, as
-- loom_save_snapshot and pgloom's delta stores find it.
CREATE FUNCTION @extschema@.loom_snapshot_keyframe(execution_id text, sequence bigint,
    OUT keyframe_sequence bigint, OUT keyframe bytea, OUT deltas_since integer, OUT is_keyframe boolean)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A row that deltas name stays a keyframe, whatever is saved over it.
    is_keyframe := EXISTS (SELECT 1 FROM loom.snapshots d
                           WHERE d.execution_id = $1 AND d.sequence > $2
                             AND @extschema@.loom_snapshot_base_sequence(d.state_z) = $2);
    IF is_keyframe THEN
        RETURN;
    END IF;
    -- The latest keyframe before the sequence, held until the transaction
    -- ends: FOR SHARE conflicts with a save over it (loom_store_snapshot's
    -- FOR NO KEY UPDATE), and after waiting for one the row is checked
    -- again, so a keyframe saved over as a delta or as JSONB is passed
    -- over for the next older one.
    SELECT k.sequence, k.state_z INTO keyframe_sequence, keyframe FROM loom.snapshots k
    WHERE k.execution_id = $1 AND k.sequence < $2 AND k.state_z IS NOT NULL
      AND substring(k.state_z FROM 1 FOR 1) IN (decode('01', 'hex'), decode('02', 'hex'))
    ORDER BY k.sequence DESC LIMIT 1
    FOR SHARE;
    IF FOUND THEN
        SELECT count(*) INTO deltas_since FROM loom.snapshots d
        WHERE d.execution_id = $1 AND d.sequence > keyframe_sequence AND d.sequence < $2
          AND @extschema@.loom_snapshot_base_sequence(d.state_z) = keyframe_sequence;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_snapshot_keyframe(text, bigint) IS
'The keyframe a delta saved at sequence is written against: the latest keyframe (0x01 or 0x02 frame) of the execution before it, held FOR SHARE, and how many deltas name it already; none, and is_keyframe, when deltas name the row at sequence, which stays a keyframe. What loom_save_snapshot(..., ''delta'') and pgloom''s delta stores encode against.';

-- Where every save ends, the client's as well as loom_save_snapshot's:
-- the JSON text as JSONB (frame NULL), or a frame beside the sentinel.
-- A keyframe that deltas name is only saved over with the same frame, and
-- the check holds under concurrency: the row is locked (FOR NO KEY
-- UPDATE, which a delta save's FOR SHARE on its keyframe conflicts with)
-- before the deltas naming it are counted, in a statement of its own. A delta
-- is stored only beside the keyframe it names (below).
CREATE FUNCTION @extschema@.loom_store_snapshot(execution_id text, workflow_id text, sequence bigint, state text, frame bytea,
                                                base_digest bytea DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    saved bigint;
    has_frame_column boolean := (@extschema@.loom_snapshot_frame_catalog()).has_column;
    deltas_on_it bigint;
    base_sequence bigint;
    keyframe bytea;
BEGIN
    IF (state IS NULL) = (frame IS NULL) THEN
        RAISE EXCEPTION 'a snapshot is stored as JSON text or as a frame, one of the two'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF frame IS NOT NULL AND NOT has_frame_column THEN
        RAISE EXCEPTION 'loom.snapshots has no state_z column for zstd frames'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'SELECT @extschema@.loom_ensure_snapshot_zstd(); adds it (or save with codec ''none'')';
    END IF;
    -- As an append does: a sweep deleting the execution waits for this
    -- snapshot, and deletes it with the rest, rather than miss it; and a
    -- delete of its snapshots (loom_delete_snapshots) cannot take a
    -- keyframe from under a delta saved here.
    PERFORM @extschema@.loom_lock_execution_for_write(execution_id);
    IF has_frame_column THEN
        PERFORM 1 FROM loom.snapshots o WHERE o.execution_id = $1 AND o.sequence = $3
            FOR NO KEY UPDATE;
        IF FOUND AND current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'a snapshot can only be saved over in READ COMMITTED transactions, not %',
                    current_setting('transaction_isolation')
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'A keyframe is checked against the deltas naming it with a fresh snapshot per statement, which one snapshot for the whole transaction cannot give: save in READ COMMITTED (the default).';
        END IF;
        SELECT count(*) INTO deltas_on_it FROM loom.snapshots d
        WHERE d.execution_id = $1 AND d.sequence > $3
          AND @extschema@.loom_snapshot_base_sequence(d.state_z) = $3;
        IF deltas_on_it > 0 THEN
            IF frame IS NULL OR frame IS DISTINCT FROM (
                    SELECT o.state_z FROM loom.snapshots o WHERE o.execution_id = $1 AND o.sequence = $3) THEN
                RAISE EXCEPTION 'snapshot % of execution % is the keyframe of % delta snapshots: saved over with another state, none of them would decode',
                        $3, quote_literal($1), deltas_on_it
                    USING ERRCODE = 'object_in_use',
                          HINT = 'Save the same state again, or delete the execution''s snapshots first (loom_delete_snapshots deletes each keyframe after its deltas).';
            END IF;
        END IF;
    END IF;
    IF substring(frame FROM 1 FOR 1) = decode('03', 'hex') THEN
        -- A delta is stored only beside the keyframe it names, held until
        -- this transaction ends: FOR SHARE conflicts with a save over it
        -- and with its delete (loom_delete_snapshots waits on the lock
        -- taken above, then sees this delta and keeps its keyframe).
        base_sequence := @extschema@.loom_snapshot_base_sequence(frame);
        IF base_sequence IS NULL OR base_sequence >= $3 THEN
            RAISE EXCEPTION 'a delta snapshot at sequence % must name a keyframe before it, not %',
                    $3, coalesce(base_sequence::text, 'a malformed header')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'a snapshot can only be saved as a delta in READ COMMITTED transactions, not %',
                    current_setting('transaction_isolation')
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'A delta''s keyframe is checked with a fresh snapshot per statement, which one snapshot for the whole transaction cannot give: save in READ COMMITTED (the default).';
        END IF;
        SELECT k.state_z INTO keyframe FROM loom.snapshots k
        WHERE k.execution_id = $1 AND k.sequence = base_sequence
        FOR SHARE;
        -- A writer that names the keyframe it read (base_digest, as pgloom
        -- does) lost a race to a peer that saved over or deleted it: a
        -- conflict to retry (40001). Without it, a delta made by hand that
        -- names no keyframe: retrying would not help (55000).
        IF keyframe IS NULL OR substring(keyframe FROM 1 FOR 1) NOT IN (decode('01', 'hex'), decode('02', 'hex')) THEN
            RAISE EXCEPTION 'the delta snapshot at sequence % of execution % names %, which is not a keyframe (a 0x01 or 0x02 frame) of it',
                    $3, quote_literal($1), base_sequence
                USING ERRCODE = CASE WHEN base_digest IS NULL THEN 'object_not_in_prerequisite_state' ELSE 'serialization_failure' END,
                      HINT = 'Encode the state again against the execution''s latest keyframe (loom_snapshot_keyframe), or save it as a keyframe.';
        END IF;
        -- The writer names the keyframe it encoded against by its frame's
        -- SHA-256: one saved over since (none of this delta's bytes would
        -- decode against it) is a conflict to retry, never a stored delta
        -- no reader can decode.
        IF base_digest IS NOT NULL AND pg_catalog.sha256(keyframe) <> base_digest THEN
            RAISE EXCEPTION 'the keyframe at sequence % of execution % changed since the delta at % was encoded against it',
                    base_sequence, quote_literal($1), $3
                USING ERRCODE = 'serialization_failure',
                      HINT = 'Encode the state again against the keyframe as it is now.';
        END IF;
    END IF;
    IF frame IS NOT NULL THEN
        INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
        VALUES ($1, $2, $3, '{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb, frame)
        ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
            SET workflow_id = excluded.workflow_id, state = excluded.state,
                state_z = excluded.state_z, created_at = excluded.created_at
        RETURNING s.id INTO saved;
    ELSIF has_frame_column THEN
        -- A re-save over a frame row clears the frame: no stale frame.
        INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
        VALUES ($1, $2, $3, $4::jsonb, NULL)
        ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
            SET workflow_id = excluded.workflow_id, state = excluded.state,
                state_z = NULL, created_at = excluded.created_at
        RETURNING s.id INTO saved;
    ELSE
        INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state)
        VALUES ($1, $2, $3, $4::jsonb)
        ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
            SET workflow_id = excluded.workflow_id, state = excluded.state, created_at = excluded.created_at
        RETURNING s.id INTO saved;
    END IF;
    RETURN saved;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_store_snapshot(text, text, bigint, text, bytea, bytea) IS
'Stores a snapshot as given, with the lock appends hold: state (JSON text) as JSONB when frame is NULL, else the frame beside the sentinel. A keyframe that deltas name is saved over only with the same frame (55006 otherwise), and only in READ COMMITTED (0A000). A delta frame is stored only beside a keyframe at the earlier sequence it names (22023 for a later one), held FOR SHARE, and with base_digest only while that keyframe''s frame has that SHA-256: 40001 when it is gone or another frame (encode again), 55000 without base_digest when there is no keyframe there. What loom_save_snapshot and pgloom''s stores save through.';

CREATE FUNCTION @extschema@.loom_save_snapshot(execution_id text, workflow_id text, sequence bigint, state text, codec text DEFAULT 'none')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    frame bytea;
    keyframe_sequence bigint;
    keyframe_frame bytea;
    deltas_since integer;
BEGIN
    IF codec NOT IN ('none', 'zstd', 'delta') THEN
        RAISE EXCEPTION 'unknown snapshot codec %: expected "none", "zstd" or "delta"', quote_literal(codec)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF codec <> 'none' AND NOT (@extschema@.loom_snapshot_frame_catalog()).has_column THEN
        RAISE EXCEPTION 'loom.snapshots has no state_z column for zstd frames'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'SELECT @extschema@.loom_ensure_snapshot_zstd(); adds it (or save with codec ''none'')';
    END IF;
    IF codec = 'zstd' THEN
        frame := @extschema@.loom_snapshot_frame($4, 'zstd');
    ELSIF codec = 'delta' THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'a snapshot can only be saved as a delta in READ COMMITTED transactions, not %',
                    current_setting('transaction_isolation')
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'A delta''s keyframe is checked with a fresh snapshot per statement, which one snapshot for the whole transaction cannot give: save in READ COMMITTED (the default).';
        END IF;
        -- The row saved over first, then its keyframe: one lock order.
        PERFORM @extschema@.loom_lock_execution_for_write(execution_id);
        PERFORM 1 FROM loom.snapshots o WHERE o.execution_id = $1 AND o.sequence = $3
            FOR NO KEY UPDATE;
        -- No keyframe (none before, or deltas name this row): a keyframe.
        SELECT k.keyframe_sequence, k.keyframe, k.deltas_since
        INTO keyframe_sequence, keyframe_frame, deltas_since
        FROM @extschema@.loom_snapshot_keyframe($1, $3) k;
        frame := @extschema@.loom_snapshot_delta_frame($4, keyframe_sequence, keyframe_frame, deltas_since);
    END IF;
    -- Every argument given: a default left out would let an overload
    -- planted in the functions' schema make the call ambiguous.
    RETURN @extschema@.loom_store_snapshot($1, $2, $3, CASE WHEN frame IS NULL THEN $4 END, frame, NULL::bytea);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_save_snapshot(text, text, bigint, text, text) IS
'Saves the state (JSON text) of an execution at a sequence and returns the row id: as JSONB with codec ''none'' (the default), as a zstd frame in state_z beside the sentinel with ''zstd'', as a delta against the execution''s latest earlier keyframe with ''delta'' (a keyframe when there is none or the keyframe policy asks: docs/frames.md; the native extension only, the SQL-only flavour refuses it with 0A000). A re-save of the same (execution_id, sequence) replaces the row in the format asked and clears the other column, except over a keyframe that deltas were written against, which only the same frame may replace (55006 otherwise); a save over, or as a delta, only in READ COMMITTED (0A000). Stored through loom_store_snapshot.';

-- The rows of loom_load_snapshot, in PL/pgSQL (Citus plans its statements;
-- it cannot plan a SQL function's parameters). loom_load_snapshot stays a
-- SQL function over it: its parameter execution_id is also a column it
-- returns, which PL/pgSQL does not allow.
CREATE FUNCTION @extschema@.loom_load_snapshot_rows(of_execution text, at_sequence bigint)
RETURNS TABLE(id bigint, execution_id text, workflow_id text, sequence bigint, created_at timestamptz, state jsonb)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The latest by an index scan backward, or exactly at_sequence.
    IF at_sequence IS NULL THEN
        RETURN QUERY
            SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
            FROM loom.snapshots_decoded d WHERE d.execution_id = of_execution
            ORDER BY d.sequence DESC LIMIT 1;
    ELSE
        RETURN QUERY
            SELECT d.id, d.execution_id, d.workflow_id, d.sequence, d.created_at, d.state
            FROM loom.snapshots_decoded d WHERE d.execution_id = of_execution AND d.sequence = at_sequence;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_load_snapshot_rows(text, bigint) IS
'What loom_load_snapshot returns (call that one).';

CREATE FUNCTION @extschema@.loom_load_snapshot(execution_id text, at_sequence bigint DEFAULT NULL)
RETURNS TABLE(id bigint, execution_id text, workflow_id text, sequence bigint, created_at timestamptz, state jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM @extschema@.loom_load_snapshot_rows($1, $2)
$$;
COMMENT ON FUNCTION @extschema@.loom_load_snapshot(text, bigint) IS
'The latest snapshot of an execution, or the one at exactly at_sequence (never a neighbour), decoded whatever its row format. No row when there is none.';

CREATE FUNCTION @extschema@.loom_delete_snapshots(execution_id text, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
    locked boolean := false;
    gone bigint[];
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    IF NOT (@extschema@.loom_snapshot_frame_catalog()).has_column THEN
        -- One bounded batch, oldest first; call again until it returns 0.
        DELETE FROM loom.snapshots s
        WHERE s.execution_id = loom_delete_snapshots.execution_id
          AND s.sequence IN (SELECT d.sequence FROM loom.snapshots d
                             WHERE d.execution_id = loom_delete_snapshots.execution_id
                             ORDER BY d.sequence LIMIT max_rows);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        RETURN deleted;
    END IF;
    -- One snapshot a statement: the delete below must see a delta that
    -- commits while it waits.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'snapshots can only be deleted in READ COMMITTED transactions, not %',
                current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'A keyframe is kept while a delta names it, which one snapshot for the whole transaction cannot see: delete in READ COMMITTED (the default).';
    END IF;
    -- A save of a delta holds the execution's lock shared until it
    -- commits: wait for it here, so that the delete below, whose snapshot
    -- is taken after, sees the delta and keeps its keyframe. A role
    -- granted DELETE by hand, without the lock function, deletes without
    -- it (loom_delete_events has the same exception), and is checked
    -- after instead (below).
    IF has_function_privilege('@extschema@.loom_lock_execution_for_delete(text)', 'EXECUTE') THEN
        PERFORM @extschema@.loom_lock_execution_for_delete(execution_id);
        locked := true;
    END IF;
    -- One bounded batch, oldest first, but each keyframe after the last
    -- delta written against it: no batch leaves a delta without its
    -- keyframe. Call again until it returns 0.
    WITH batch AS (
    DELETE FROM loom.snapshots s
    WHERE s.execution_id = loom_delete_snapshots.execution_id
      AND s.sequence IN (
          WITH rows AS (
              SELECT d.sequence, @extschema@.loom_snapshot_base_sequence(d.state_z) AS base
              FROM loom.snapshots d WHERE d.execution_id = loom_delete_snapshots.execution_id
          ), last_delta AS (
              -- Deltas of keyframes only: one naming a delta (made by
              -- hand) is undecodable already, and holds nothing back.
              SELECT r.base, max(r.sequence) AS last FROM rows r
              JOIN rows k ON k.sequence = r.base AND k.base IS NULL
              GROUP BY r.base
          )
          SELECT r.sequence FROM rows r LEFT JOIN last_delta l ON l.base = r.sequence
          ORDER BY greatest(r.sequence, l.last), r.sequence DESC LIMIT max_rows)
    RETURNING s.sequence, substring(s.state_z FROM 1 FOR 1) AS head)
    -- The keyframes among them: a delta named by another (only ever made
    -- by hand) was undecodable already.
    SELECT count(*), array_agg(b.sequence) FILTER (WHERE b.head IN (decode('01', 'hex'), decode('02', 'hex')))
    INTO deleted, gone FROM batch b;
    -- Without the lock, a delta saved while the delete waited on its
    -- keyframe's row (FOR SHARE) was invisible to the delete's snapshot,
    -- which took the keyframe all the same. This statement's snapshot sees
    -- it: the batch is undone, to be called again.
    IF NOT locked AND gone IS NOT NULL AND EXISTS (
            SELECT 1 FROM loom.snapshots d
            WHERE d.execution_id = loom_delete_snapshots.execution_id
              AND @extschema@.loom_snapshot_base_sequence(d.state_z) = ANY (gone)) THEN
        RAISE EXCEPTION 'a delta snapshot of execution % was saved against a keyframe this batch deleted',
                quote_literal(loom_delete_snapshots.execution_id)
            USING ERRCODE = 'serialization_failure',
                  HINT = 'Call loom_delete_snapshots again: it deletes the delta first. (A role with EXECUTE on loom_lock_execution_for_delete, as loom_grant_access gives, waits for it instead.)';
    END IF;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_delete_snapshots(text, integer) IS
'Deletes one batch of at most max_rows snapshots of an execution, oldest first but each keyframe after the deltas written against it, and returns how many: call it until it returns 0. No batch leaves a delta without its keyframe.';

CREATE FUNCTION @extschema@.loom_resume(execution_id text)
RETURNS TABLE(snapshot_id bigint, workflow_id text, sequence bigint, created_at timestamptz,
              state jsonb, state_z bytea, kind text, payload jsonb, metadata jsonb, base_z bytea)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- One statement, so one MVCC snapshot: the tail starts exactly after
    -- the snapshot's sequence, none missing or repeated, whatever appends
    -- commit meanwhile. The frame ships as stored (the client decodes it).
    -- On Citus the snapshot and the log are co-located, so this is one
    -- statement on one worker, still one snapshot.
    -- Until loom_ensure_event_metadata adds the column (an update adds it
    -- only if it can lock loom.events in time), the same query with NULL
    -- metadata: a statement naming a missing column cannot be planned.
    IF @extschema@.loom_events_have_metadata() THEN
        RETURN QUERY
        WITH latest AS (
            -- With a delta's keyframe, in the same MVCC snapshot.
            SELECT f.id, f.workflow_id, f.sequence, f.created_at, f.state, f.state_z,
                   (SELECT b.state_z FROM loom.snapshots_stored b
                    WHERE b.execution_id = $1
                      AND b.sequence = @extschema@.loom_snapshot_base_sequence(f.state_z)) AS base_z
            FROM loom.snapshots_stored f WHERE f.execution_id = $1
            ORDER BY f.sequence DESC LIMIT 1
        ), tail AS (
            -- A keyset read after the snapshot (no snapshot: the comparison is
            -- NULL and this branch is empty)...
            SELECT e.sequence, e.created_at, e.kind, e.payload, e.metadata FROM loom.events e
            WHERE e.execution_id = $1 AND e.sequence > (SELECT l.sequence FROM latest l)
            UNION ALL
            -- ...or the whole log when there is none.
            SELECT e.sequence, e.created_at, e.kind, e.payload, e.metadata FROM loom.events e
            WHERE e.execution_id = $1 AND NOT EXISTS (SELECT 1 FROM latest)
        )
        SELECT r.snapshot_id, r.workflow_id, r.sequence, r.created_at, r.state, r.state_z, r.kind, r.payload, r.metadata, r.base_z
        FROM (
            SELECT l.id AS snapshot_id, l.workflow_id, l.sequence, l.created_at, l.state, l.state_z,
                   NULL::text AS kind, NULL::jsonb AS payload, NULL::jsonb AS metadata, l.base_z, 0 AS part
            FROM latest l
            UNION ALL
            SELECT NULL, NULL, t.sequence, t.created_at, NULL, NULL, t.kind, t.payload, t.metadata, NULL, 1
            FROM tail t
        ) r
        ORDER BY r.part, r.sequence;
    ELSE
        RETURN QUERY
        WITH latest AS (
            -- With a delta's keyframe, in the same MVCC snapshot.
            SELECT f.id, f.workflow_id, f.sequence, f.created_at, f.state, f.state_z,
                   (SELECT b.state_z FROM loom.snapshots_stored b
                    WHERE b.execution_id = $1
                      AND b.sequence = @extschema@.loom_snapshot_base_sequence(f.state_z)) AS base_z
            FROM loom.snapshots_stored f WHERE f.execution_id = $1
            ORDER BY f.sequence DESC LIMIT 1
        ), tail AS (
            -- A keyset read after the snapshot (no snapshot: the comparison is
            -- NULL and this branch is empty)...
            SELECT e.sequence, e.created_at, e.kind, e.payload, NULL::jsonb AS metadata FROM loom.events e
            WHERE e.execution_id = $1 AND e.sequence > (SELECT l.sequence FROM latest l)
            UNION ALL
            -- ...or the whole log when there is none.
            SELECT e.sequence, e.created_at, e.kind, e.payload, NULL::jsonb AS metadata FROM loom.events e
            WHERE e.execution_id = $1 AND NOT EXISTS (SELECT 1 FROM latest)
        )
        SELECT r.snapshot_id, r.workflow_id, r.sequence, r.created_at, r.state, r.state_z, r.kind, r.payload, r.metadata, r.base_z
        FROM (
            SELECT l.id AS snapshot_id, l.workflow_id, l.sequence, l.created_at, l.state, l.state_z,
                   NULL::text AS kind, NULL::jsonb AS payload, NULL::jsonb AS metadata, l.base_z, 0 AS part
            FROM latest l
            UNION ALL
            SELECT NULL, NULL, t.sequence, t.created_at, NULL, NULL, t.kind, t.payload, t.metadata, NULL, 1
            FROM tail t
        ) r
        ORDER BY r.part, r.sequence;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_resume(text) IS
'What a workflow resumes from, in one statement (one MVCC snapshot): first the latest snapshot as stored (snapshot_id set; state, or the sentinel and the frame in state_z, and base_z, the frame of the keyframe a delta names), then the events after its sequence in order (kind set, with their metadata); all the events when there is no snapshot.';

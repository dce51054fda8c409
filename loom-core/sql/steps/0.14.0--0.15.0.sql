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

-- (was: @rerun log_api: loom_append_event, loom_append_events)
-- @portable: loom_append_event's body, which the extension has in C
CREATE OR REPLACE FUNCTION @extschema@.loom_append_event(execution_id text, sequence bigint, kind text, payload jsonb, metadata jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tracked text := current_setting('loom.inserts_tracked', true);
BEGIN
    IF metadata IS NOT NULL THEN
        IF NOT EXISTS (SELECT FROM pg_attribute a
                       WHERE a.attrelid = to_regclass('loom.events') AND a.attname = 'metadata'
                         AND NOT a.attisdropped AND a.atttypid = 'jsonb'::regtype) THEN
            RAISE EXCEPTION 'loom.events has no metadata column yet: the update to loom 0.11.0 could not lock loom.events in time to add it; nothing was written'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(2000); as the extension''s owner (pgloom''s migrate() does at every boot).';
        END IF;
    END IF;
    -- The stripe, shared, before the INSERT (a NULL id is left to the
    -- INSERT's NOT NULL): see loom.executions below.
    IF execution_id IS NOT NULL THEN
        PERFORM 1 FROM loom.stripes s WHERE s.stripe = hashtext(execution_id COLLATE "C") & 63 FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
        END IF;
    END IF;
    -- Without metadata, the column goes unnamed: an update may not have
    -- added it yet (loom_ensure_event_metadata).
    IF metadata IS NULL THEN
        INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ($1, $2, $3, $4);
    ELSE
        INSERT INTO loom.events (execution_id, sequence, kind, payload, metadata) VALUES ($1, $2, $3, $4, $5);
    END IF;
    IF current_setting('loom.inserts_tracked', true) IS NOT DISTINCT FROM tracked THEN
        PERFORM @extschema@.loom_track_appended(ARRAY[execution_id]);
    END IF;
END
$$;
-- @end portable
COMMENT ON FUNCTION @extschema@.loom_append_event(text, bigint, text, jsonb, jsonb) IS
'Appends one event to an execution''s log, with its metadata (any JSON; NULL, the default, for none). A second event at the same (execution_id, sequence) is a unique_violation (23505): the log is append-only. Only in READ COMMITTED transactions (0A000 otherwise).';
-- @portable: loom_append_events's body, which the extension has in C
CREATE OR REPLACE FUNCTION @extschema@.loom_append_events(execution_ids text[], sequences bigint[], kinds text[], payloads jsonb[], metadata jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tracked text;
    appended bigint;
    stripes integer[];
    locked bigint;
BEGIN
    IF metadata IS NOT NULL THEN
        IF NOT EXISTS (SELECT FROM pg_attribute a
                       WHERE a.attrelid = to_regclass('loom.events') AND a.attname = 'metadata'
                         AND NOT a.attisdropped AND a.atttypid = 'jsonb'::regtype) THEN
            IF EXISTS (SELECT FROM unnest(metadata) AS m WHERE m IS NOT NULL) THEN
                RAISE EXCEPTION 'loom.events has no metadata column yet: the update to loom 0.11.0 could not lock loom.events in time to add it; nothing was written'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(2000); as the extension''s owner (pgloom''s migrate() does at every boot).';
            END IF;
            metadata := NULL;
        END IF;
    END IF;
    -- A NULL array of the first four is left to the INSERT (unnest pads
    -- it with NULLs, which NOT NULL refuses); a NULL metadata array means
    -- none for every event.
    IF execution_ids IS NOT NULL AND sequences IS NOT NULL AND kinds IS NOT NULL AND payloads IS NOT NULL
       AND (cardinality(sequences) <> cardinality(execution_ids) OR cardinality(kinds) <> cardinality(execution_ids)
            OR cardinality(payloads) <> cardinality(execution_ids) OR cardinality(metadata) <> cardinality(execution_ids)) THEN
        RAISE EXCEPTION 'loom_append_events needs arrays of one length, got % ids, % sequences, % kinds, % payloads%',
                cardinality(execution_ids), cardinality(sequences), cardinality(kinds), cardinality(payloads),
                CASE WHEN metadata IS NULL THEN '' ELSE format(', %s metadata', cardinality(metadata)) END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The ids' stripes, shared, in ascending order (unnest keeps the
    -- sorted array's), before the INSERT.
    IF execution_ids IS NOT NULL THEN
        stripes := ARRAY(SELECT DISTINCT hashtext(i.id COLLATE "C") & 63 FROM unnest(execution_ids) AS i(id)
                         WHERE i.id IS NOT NULL);
        PERFORM 1 FROM loom.stripes s WHERE s.stripe = ANY (stripes) ORDER BY s.stripe FOR KEY SHARE;
        GET DIAGNOSTICS locked = ROW_COUNT;
        IF locked <> cardinality(stripes) THEN
            RAISE EXCEPTION 'loom.stripes lacks a stripe''s row: loom''s write locks would lock nothing'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Restore its 64 rows as the owner: INSERT INTO loom.stripes (stripe) SELECT pg_catalog.generate_series(0, 63) ON CONFLICT DO NOTHING;';
        END IF;
    END IF;
    IF NOT @extschema@.loom_executions_tracked_by_trigger() THEN
        -- All five arguments, whatever the metadata: a call with four
        -- would also match a four-parameter function someone created
        -- beside loom's in its schema, and be ambiguous.
        RETURN @extschema@.loom_append_events_without_trigger(execution_ids, sequences, kinds, payloads, metadata);
    END IF;
    -- One node: one INSERT, no subtransaction on the hot path.
    tracked := current_setting('loom.inserts_tracked', true);
    IF metadata IS NULL THEN
        INSERT INTO loom.events (execution_id, sequence, kind, payload)
        SELECT * FROM ROWS FROM (unnest(execution_ids), unnest(sequences), unnest(kinds), unnest(payloads));
    ELSE
        INSERT INTO loom.events (execution_id, sequence, kind, payload, metadata)
        SELECT * FROM ROWS FROM (unnest(execution_ids), unnest(sequences), unnest(kinds), unnest(payloads), unnest(metadata));
    END IF;
    GET DIAGNOSTICS appended = ROW_COUNT;
    IF current_setting('loom.inserts_tracked', true) IS NOT DISTINCT FROM tracked THEN
        -- Dropped (loom_distribute) or disabled while the INSERT waited
        -- for its lock: its rows are tracked all the same.
        PERFORM @extschema@.loom_track_appended(execution_ids);
    END IF;
    RETURN appended;
END
$$;
-- @end portable
COMMENT ON FUNCTION @extschema@.loom_append_events(text[], bigint[], text[], jsonb[], jsonb[]) IS
'Appends a batch of events in one statement (element i of each array is one event) and returns how many. metadata is NULL (the default: none for every event) or one element per event. Arrays of different lengths are invalid_parameter_value (22023); only in READ COMMITTED transactions (0A000 otherwise).';
-- (was: @rerun collation_migration: loom_convert_column_to_c, loom_migrate_collations, loom_drop_events_id_index, loom_ensure_event_metadata)
CREATE OR REPLACE FUNCTION @extschema@.loom_convert_column_to_c(table_name text, column_name text, lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    alter_statement text := format('ALTER TABLE loom.%I ALTER COLUMN %I TYPE text COLLATE "C"', table_name, column_name);
    analyze_statement text := format('ANALYZE loom.%I', table_name);
    by_hand text := format('SET lock_timeout = 0; SET statement_timeout = 0; %s; %s;',
        CASE table_name WHEN 'snapshots'
            THEN format('SELECT @extschema@.loom_alter_under_snapshot_views(%L)', alter_statement)
            ELSE alter_statement END,
        analyze_statement);
    converted boolean;
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- A catalog check, so a converted column costs no table lock.
    converted := @extschema@.loom_column_is_c(table_name, column_name);
    IF converted THEN
        RETURN 'already COLLATE "C"';
    END IF;
    -- The running statement's timer cannot be switched off from here:
    -- starting would mean lock, rebuild, cancel, on every call.
    IF current_setting('statement_timeout') <> '0' THEN
        RAISE WARNING 'loom: not converting loom.%.% to COLLATE "C": statement_timeout is %, and a rebuild it cancels would hold an exclusive lock for nothing',
                table_name, column_name, current_setting('statement_timeout')
            USING DETAIL = 'Paging stays correct, because every loom query states COLLATE "C"; only slower until the column is converted.',
                  HINT = 'Run it as its own statement with statement_timeout 0: pgloom''s migrate() does, or SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations();, or by hand: ' || by_hand;
        RETURN 'skipped: statement_timeout';
    END IF;
    -- The block is a subtransaction: a soft failure rolls back this one
    -- conversion, and the caller's transaction (ALTER EXTENSION) goes on.
    BEGIN
        -- Bound the wait for the lock (appends queue behind it), never the
        -- rebuild (statement_timeout is 0, checked above).
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        IF table_name = 'snapshots' THEN
            -- The views read the column: the lock first, then the swap.
            LOCK TABLE loom.snapshots IN ACCESS EXCLUSIVE MODE;
            PERFORM @extschema@.loom_alter_under_snapshot_views(alter_statement);
        ELSE
            EXECUTE alter_statement;
        END IF;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        -- ALTER ... TYPE drops the column's statistics; without them the
        -- planner sorts instead of scanning the index.
        EXECUTE analyze_statement;
        RETURN 'converted';
    EXCEPTION
        -- What boot survives: a lock wait that timed out, a cancel, a
        -- deadlock, a view or rule on the column (feature_not_supported).
        -- Not owning the table is not caught: the next DDL would fail anyway.
        -- A user's object on loom's snapshot views (dependent_objects_still_exist)
        -- is named, with what to do about it.
        WHEN lock_not_available OR query_canceled OR deadlock_detected OR feature_not_supported
             OR dependent_objects_still_exist THEN
            RAISE WARNING 'loom: could not convert loom.%.% to COLLATE "C": % (SQLSTATE %)',
                    table_name, column_name, SQLERRM, SQLSTATE
                USING DETAIL = 'Paging stays correct, because every loom query states COLLATE "C"; only slower until the column is converted.',
                      HINT = CASE WHEN SQLSTATE = '2BP01' THEN
                                 'Drop the objects named (saving their definitions), then run SELECT @extschema@.loom_migrate_collations(); with statement_timeout 0, then create them again; or by hand: '
                             ELSE 'Run SELECT @extschema@.loom_migrate_collations(); later (with statement_timeout 0), or by hand in a quiet moment: ' END || by_hand;
            RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_convert_column_to_c(text, text, integer) IS
'Converts one loom.<table>.<column> to COLLATE "C" (ADR 0108 D3): a no-op without any lock when already converted. Otherwise, only when statement_timeout is 0 (a function cannot exempt its own statement from it, and a cancelled rebuild would hold the exclusive lock for nothing; else it skips with a WARNING, taking no lock), waits at most lock_timeout_ms (at least 1) for the lock, restores the caller''s lock_timeout, ANALYZEs, and on a lock timeout, cancel, deadlock or dependent view or object rolls back alone with a WARNING naming them and the statements to run by hand.';
CREATE OR REPLACE FUNCTION @extschema@.loom_migrate_collations(lock_timeout_ms integer DEFAULT 2000)
RETURNS TABLE(column_name text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- One migrator at a time: a second caller waits here, then finds the
    -- columns converted by the catalog check, and locks nothing.
    PERFORM @extschema@.loom_take_migration_lock();
    -- refs first, then events (the addendum's deadlock order): the small,
    -- less hot table is locked first and its lock held for less time
    -- behind the hot one.
    column_name := 'loom.refs.name';
    outcome := @extschema@.loom_convert_column_to_c('refs', 'name', lock_timeout_ms);
    RETURN NEXT;
    column_name := 'loom.events.execution_id';
    outcome := @extschema@.loom_convert_column_to_c('events', 'execution_id', lock_timeout_ms);
    RETURN NEXT;
    -- Since 0.5.0 every execution_id is COLLATE "C": one order for ids,
    -- and what Citus co-location needs (loom_distribute).
    column_name := 'loom.snapshots.execution_id';
    outcome := @extschema@.loom_convert_column_to_c('snapshots', 'execution_id', lock_timeout_ms);
    RETURN NEXT;
    column_name := 'loom.lineage.execution_id';
    outcome := @extschema@.loom_convert_column_to_c('lineage', 'execution_id', lock_timeout_ms);
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_migrate_collations(integer) IS
'Converts loom.refs.name, then loom.events.execution_id, loom.snapshots.execution_id and loom.lineage.execution_id, to COLLATE "C" (ADR 0108 D2/D3), each as loom_convert_column_to_c does, under loom''s migration lock; re-runs a conversion an upgrade skipped. Run it with statement_timeout 0 (it skips, locking nothing, otherwise; pgloom''s migrate() does this at every boot). Returns what happened to each column.';
CREATE OR REPLACE FUNCTION @extschema@.loom_drop_events_id_index(lock_timeout_ms integer DEFAULT 2000)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- A catalog check, so a dropped index costs no table lock.
    IF to_regclass('loom.idx_events_exec') IS NULL THEN
        RETURN 'already dropped';
    END IF;
    PERFORM @extschema@.loom_take_migration_lock();
    BEGIN
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        DROP INDEX IF EXISTS loom.idx_events_exec;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        RETURN 'dropped';
    EXCEPTION WHEN lock_not_available OR query_canceled OR deadlock_detected THEN
        RAISE WARNING 'loom: could not drop loom.idx_events_exec, an index no loom query reads since 0.4.0: % (SQLSTATE %)',
                SQLERRM, SQLSTATE
            USING DETAIL = 'Appends stay correct; each keeps paying for the index until it is dropped.',
                  HINT = 'Run SELECT @extschema@.loom_drop_events_id_index(); later (pgloom''s migrate() does at every boot), or by hand in a quiet moment: DROP INDEX loom.idx_events_exec;';
        RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_drop_events_id_index(integer) IS
'Drops loom.idx_events_exec, the index on loom.events.execution_id alone that loom no longer reads (0.7.0), waiting at most lock_timeout_ms for its lock and failing soft (a WARNING, ''skipped: <SQLSTATE>'') when it cannot; ''already dropped'' takes no lock. Under loom''s migration lock; the owner''s to call.';
CREATE OR REPLACE FUNCTION @extschema@.loom_ensure_event_metadata(lock_timeout_ms integer DEFAULT 2000)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller_lock_timeout text := current_setting('lock_timeout');
    other_type text;
BEGIN
    PERFORM @extschema@.loom_check_lock_timeout(lock_timeout_ms);
    -- A catalog check, so a present column costs no table lock.
    IF @extschema@.loom_events_have_metadata() THEN
        RETURN 'present';
    END IF;
    PERFORM @extschema@.loom_take_migration_lock();
    -- A column of that name and another type: not loom's to change.
    other_type := (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                   WHERE a.attrelid = 'loom.events'::regclass
                     AND a.attname = 'metadata' AND NOT a.attisdropped);
    IF other_type = 'jsonb' THEN
        RETURN 'present';
    ELSIF other_type IS NOT NULL THEN
        RAISE WARNING 'loom: loom.events has a column metadata of type %, not loom''s jsonb: events are written and read without metadata', other_type
            USING HINT = 'Rename or drop that column, then run SELECT @extschema@.loom_ensure_event_metadata();';
        RETURN 'skipped: 42804';
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        ALTER TABLE loom.events ADD COLUMN metadata jsonb;
        COMMENT ON COLUMN loom.events.metadata IS 'What the event carries beside its payload (a trace id, the actor, a causation id): any JSON value, NULL for none. Written by loom_append_event(s), read by loom_read_events and loom_resume.';
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        RETURN 'added';
    -- Any failure fails soft (a lock held too long, a cancel, a node of a
    -- Citus cluster that takes DDL from its coordinator only): the rest of
    -- an update goes on, and migrate() tries again.
    EXCEPTION WHEN query_canceled OR OTHERS THEN
        RAISE WARNING 'loom: could not add loom.events.metadata: % (SQLSTATE %)', SQLERRM, SQLSTATE
            USING DETAIL = 'Events are appended and read as before; an append with metadata is refused until the column is there.',
                  HINT = 'Run SELECT @extschema@.loom_ensure_event_metadata(); later (pgloom''s migrate() does at every boot).';
        RETURN 'skipped: ' || SQLSTATE;
    END;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_ensure_event_metadata(integer) IS
'Adds loom.events.metadata (0.11.0) if it is missing, waiting at most lock_timeout_ms for loom.events'' lock and failing soft (a WARNING, ''skipped: <SQLSTATE>'') when it cannot; ''present'' takes no lock. Under loom''s migration lock; the owner''s to call.';
-- (was: @rerun frames: loom_zstd_frame_walk, loom_snapshot_state_text, loom_snapshot_frame, loom_snapshot_frame_info)
CREATE OR REPLACE FUNCTION @extschema@.loom_zstd_frame_walk(payload bytea,
    OUT window_size bigint, OUT dictionary_id bigint, OUT content_size numeric,
    OUT has_checksum boolean, OUT max_output bigint)
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    pos integer;
    magic bigint;
    descriptor integer;
    single_segment boolean;
    width integer;
    block_limit bigint;
    block integer;
    block_size integer;
    stored integer;
    i integer;
    kind text;
BEGIN
    dictionary_id := 0;
    max_output := 0;
    n := octet_length(payload);
    IF n < 4 THEN
        RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd magic number'
            USING ERRCODE = 'data_corrupted';
    END IF;
    magic := get_byte(payload, 0) + get_byte(payload, 1) * 256 + get_byte(payload, 2) * 65536
             + get_byte(payload, 3)::bigint * 16777216;
    IF magic & 4294967280 = 407710288 THEN             -- 0x184D2A5?: skippable
        RAISE EXCEPTION 'snapshot frame 0x02 does not hold a zstd frame: a skippable frame'
            USING ERRCODE = 'invalid_binary_representation';
    ELSIF magic <> 4247762216 THEN                     -- 0xFD2FB528
        RAISE EXCEPTION 'snapshot frame 0x02 does not hold a zstd frame: no zstd magic number'
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
    pos := 4;
    IF pos + 1 > n THEN
        RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
            USING ERRCODE = 'data_corrupted';
    END IF;
    descriptor := get_byte(payload, pos);
    pos := pos + 1;
    single_segment := descriptor & 32 <> 0;
    has_checksum := descriptor & 4 <> 0;
    IF descriptor & 8 <> 0 THEN
        RAISE EXCEPTION 'snapshot frame is corrupt: the zstd frame header sets its reserved bit'
            USING ERRCODE = 'data_corrupted';
    END IF;
    IF NOT single_segment THEN
        IF pos + 1 > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        i := get_byte(payload, pos);
        pos := pos + 1;
        window_size := (1::bigint << (10 + (i >> 3)));
        window_size := window_size + (window_size / 8) * (i & 7);
    END IF;
    width := CASE descriptor & 3 WHEN 0 THEN 0 WHEN 1 THEN 1 WHEN 2 THEN 2 ELSE 4 END;
    IF width > 0 THEN
        IF pos + width > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        FOR i IN REVERSE width - 1 .. 0 LOOP
            dictionary_id := dictionary_id * 256 + get_byte(payload, pos + i);
        END LOOP;
        pos := pos + width;
    END IF;
    width := CASE descriptor >> 6
                 WHEN 0 THEN CASE WHEN single_segment THEN 1 ELSE 0 END
                 WHEN 1 THEN 2 WHEN 2 THEN 4 ELSE 8 END;
    IF width > 0 THEN
        IF pos + width > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        content_size := 0;
        FOR i IN REVERSE width - 1 .. 0 LOOP
            content_size := content_size * 256 + get_byte(payload, pos + i);
        END LOOP;
        IF width = 2 THEN
            content_size := content_size + 256;
        END IF;
        pos := pos + width;
    END IF;
    -- No block regenerates more than min(window, 128 KiB); a single-segment
    -- frame's window is its content.
    block_limit := least(coalesce(window_size::numeric, content_size, 131072), 131072);
    LOOP
        IF pos + 3 > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside a block header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        block := get_byte(payload, pos) + get_byte(payload, pos + 1) * 256
                 + get_byte(payload, pos + 2) * 65536;
        pos := pos + 3;
        block_size := block >> 3;
        CASE (block >> 1) & 3
            WHEN 0 THEN stored := block_size; max_output := max_output + block_size;
            WHEN 1 THEN stored := 1;          max_output := max_output + block_size;
            WHEN 2 THEN stored := block_size; max_output := max_output + block_limit;
            ELSE
                RAISE EXCEPTION 'snapshot frame is corrupt: a zstd block has the reserved block type'
                    USING ERRCODE = 'data_corrupted';
        END CASE;
        IF block_size > block_limit THEN
            RAISE EXCEPTION 'snapshot frame is corrupt: a zstd block claims % bytes, over the frame''s %-byte block limit',
                    block_size, block_limit
                USING ERRCODE = 'data_corrupted';
        END IF;
        IF pos + stored > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside a block'
                USING ERRCODE = 'data_corrupted';
        END IF;
        pos := pos + stored;
        EXIT WHEN block & 1 = 1;
    END LOOP;
    IF has_checksum THEN
        IF pos + 4 > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the content checksum'
                USING ERRCODE = 'data_corrupted';
        END IF;
        pos := pos + 4;
    END IF;
    IF pos < n THEN
        kind := 'trailing bytes';
        IF n - pos >= 4 THEN
            magic := get_byte(payload, pos) + get_byte(payload, pos + 1) * 256
                     + get_byte(payload, pos + 2) * 65536 + get_byte(payload, pos + 3)::bigint * 16777216;
            IF magic = 4247762216 THEN
                kind := 'a second zstd frame';
            ELSIF magic & 4294967280 = 407710288 THEN
                kind := 'a skippable frame';
            END IF;
        END IF;
        RAISE EXCEPTION '% after the zstd frame (% bytes at offset %): a loom frame holds exactly one zstd frame',
                kind, n - pos, pos
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_zstd_frame_walk(bytea) IS
'Internal to loom_snapshot_state_text and loom_snapshot_frame_info in SQL: walks a zstd frame''s header and block headers without inflating it, refusing a malformed frame with the SQLSTATE loom-core gives, and returns what the frame declares. Not part of the SQL API.';
-- @portable: loom_snapshot_state_text's body, which the extension has in C
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_state_text(frame bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    len integer := octet_length(frame);
    head integer;
    payload bytea;
    state text;
    -- What the zstd frame declares (loom_zstd_frame_walk).
    window_size bigint;
    dictionary_id bigint;
    content_size numeric;
    has_checksum boolean;
    max_output bigint;
    i integer;
BEGIN
    IF len = 0 THEN
        RAISE EXCEPTION 'empty snapshot frame: a frame starts with a format byte'
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
    -- A slice: one TOAST chunk, not the whole frame.
    head := get_byte(substring(frame FROM 1 FOR 1), 0);

    IF head = 1 THEN
        IF len - 1 > 268435456 THEN
            RAISE EXCEPTION 'snapshot state too large: the frame declares % bytes, over the 268435456-byte limit', len - 1
                USING ERRCODE = 'program_limit_exceeded',
                      HINT = 'loom refuses states over 256 MiB so that a tampered row cannot exhaust memory';
        END IF;
        payload := substring(frame FROM 2);
        -- A NUL byte is UTF-8 but never JSON, and text cannot hold one.
        -- As loom-core names the cause: not UTF-8 if any other byte is not
        -- (convert_from raises 22021 on the payload with its NULs made
        -- 0x01: escape-encoded, backslashes first, so that every backslash
        -- left starts an octal escape), else not JSON.
        i := position(decode('00', 'hex') IN payload);
        IF i > 0 THEN
            state := convert_from(decode(replace(replace(encode(payload, 'escape'),
                                                         E'\\\\', E'\\134'),
                                                 E'\\000', E'\\001'), 'escape'), 'UTF8');
            RAISE EXCEPTION 'snapshot frame payload is not JSON: a NUL byte at byte %', i - 1
                USING ERRCODE = 'invalid_text_representation';
        END IF;
        state := convert_from(payload, 'UTF8');
        -- json_in checks without de-escaping: \u0000 and lone surrogates
        -- are JSON text, as loom-core reads them.
        PERFORM state::json;
        RETURN state;
    ELSIF head <> 2 THEN
        RAISE EXCEPTION 'unknown snapshot frame format byte 0x%: written by a newer loom? this one reads 0x01 (json) and 0x02 (zstd)',
                lpad(to_hex(head), 2, '0')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'upgrade loom on this server before reading frames a newer loom wrote';
    END IF;

    -- 0x02: the walk loom-core does before it inflates, so that a frame it
    -- would refuse is refused here with the same SQLSTATE.
    SELECT w.window_size, w.dictionary_id, w.content_size, w.has_checksum, w.max_output
      INTO window_size, dictionary_id, content_size, has_checksum, max_output
      FROM @extschema@.loom_zstd_frame_walk(substring(frame FROM 2)) w;
    -- What loom-core refuses before inflating, in its order.
    IF content_size > 268435456 THEN
        RAISE EXCEPTION 'snapshot state too large: the frame declares % bytes, over the 268435456-byte limit', content_size
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'loom refuses states over 256 MiB so that a tampered row cannot exhaust memory';
    ELSIF content_size > max_output THEN
        RAISE EXCEPTION 'snapshot frame is corrupt: the frame declares % bytes but its blocks can hold at most %',
                content_size, max_output
            USING ERRCODE = 'data_corrupted';
    ELSIF content_size IS NULL AND window_size > 4194304 THEN
        RAISE EXCEPTION 'zstd frame declares no content size and a %-byte window, over the 4194304-byte limit for such frames: loom always declares the size',
                window_size
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'loom refuses frames without a declared size whose window would be allocated outside PostgreSQL''s memory accounting';
    ELSIF dictionary_id <> 0 THEN
        RAISE EXCEPTION 'zstd frame needs dictionary %: loom never writes one, so the frame is not loom''s', dictionary_id
            USING ERRCODE = 'invalid_binary_representation';
    ELSIF NOT has_checksum THEN
        RAISE EXCEPTION 'zstd frame has no content checksum: loom always writes one, so the frame is not loom''s'
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
    RAISE EXCEPTION 'loom''s SQL-only flavour cannot inflate a zstd snapshot frame (0x02) in the server'
        USING ERRCODE = 'feature_not_supported',
              DETAIL = 'The SQL-only flavour has no zstd: it decodes 0x01 (json) frames, and reads a 0x02 frame''s header only (loom_snapshot_frame_info).',
              HINT = 'Decode it in the client (pgloom''s stores, resume, `loom snapshot show`), or install the native loom extension.';
END
$$;
-- @end portable
COMMENT ON FUNCTION @extschema@.loom_snapshot_state_text(bytea) IS
'The exact JSON text a loom snapshot frame holds, byte for byte. Errors name the cause: unknown format byte (0A000), malformed or foreign frame (22P03), corrupt or truncated (XX001), state over 256 MiB (54000), not UTF-8 (22021), not JSON (22P02).';
-- @portable: loom_snapshot_frame's body, which the extension has in C
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_frame(state text, codec text DEFAULT 'zstd') RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The default collation, deterministic, whatever the argument's.
    codec_name text := codec;
    shown text;
BEGIN
    IF codec_name NOT IN ('none', 'zstd') THEN
        -- The name as loom-core's message writes it (Rust's {:?}).
        shown := replace(replace(replace(replace(replace(codec_name, E'\\', E'\\\\'), '"', E'\\"'),
                                         E'\n', E'\\n'), E'\r', E'\\r'), E'\t', E'\\t');
        IF shown ~ E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
            SELECT string_agg(CASE WHEN c ~ E'[\\x01-\\x1f\\x7f-\\x9f]'
                                   THEN E'\\u{' || to_hex(ascii(c)) || '}' ELSE c END, '' ORDER BY i)
              INTO shown
              FROM regexp_split_to_table(shown, '') WITH ORDINALITY AS s(c, i);
        END IF;
        RAISE EXCEPTION 'unknown snapshot codec "%": expected "none" or "zstd"', shown
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(state) > 268435456 THEN
        RAISE EXCEPTION 'snapshot state too large: % bytes of JSON, over the 268435456-byte limit', octet_length(state)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    -- A frame holds JSON and nothing else, so that it always decodes.
    PERFORM state::json;
    IF codec_name = 'zstd' THEN
        RAISE EXCEPTION 'loom''s SQL-only flavour cannot compress a snapshot frame with zstd in the server'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'Natively, codec ''zstd'' gives 0x02, or 0x01 when zstd would not make the state smaller: without zstd, this flavour cannot tell which frame the native extension would write, so it writes none.',
                  HINT = 'Frame with codec ''none'' (0x01), frame in the client (pgloom''s stores), or install the native loom extension.';
    END IF;
    RETURN decode('01', 'hex') || convert_to(state, 'UTF8');
END
$$;
-- @end portable
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_frame(state jsonb, codec text DEFAULT 'zstd') RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_frame(state::pg_catalog.text, codec);
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame(text, text) IS
'Frames a JSON state as loom stores it: codec ''zstd'' (default) gives 0x02 + zstd level 3 with checksum and content size, or 0x01 when zstd would not make it smaller; ''none'' gives 0x01 + the text. The text must be JSON (22P02) of at most 256 MiB (54000).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame(jsonb, text) IS
'Frames a jsonb state (its canonical text form) as loom stores it; see loom_snapshot_frame(text, text).';
-- @portable: loom_snapshot_frame_info's body, which the extension has in C
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_frame_info(frame bytea)
    RETURNS TABLE(format text, stored_bytes integer, declared_bytes bigint, has_checksum boolean)
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    len integer := octet_length(frame);
    head integer;
    content_size numeric;
BEGIN
    IF len = 0 THEN
        RAISE EXCEPTION 'empty snapshot frame: a frame starts with a format byte'
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
    head := get_byte(substring(frame FROM 1 FOR 1), 0);
    IF head = 1 THEN
        -- The text is not read: its length is what the frame declares.
        format := 'json';
        stored_bytes := len;
        declared_bytes := len - 1;
        has_checksum := false;
        RETURN NEXT;
        RETURN;
    ELSIF head <> 2 THEN
        RAISE EXCEPTION 'unknown snapshot frame format byte 0x%: written by a newer loom? this one reads 0x01 (json) and 0x02 (zstd)',
                lpad(to_hex(head), 2, '0')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'upgrade loom on this server before reading frames a newer loom wrote';
    END IF;

    -- 0x02: the zstd frame's header and block headers, nothing inflated;
    -- what a decoder refuses on policy (no checksum, over 256 MiB) is
    -- reported, not refused.
    SELECT w.content_size, w.has_checksum INTO content_size, has_checksum
      FROM @extschema@.loom_zstd_frame_walk(substring(frame FROM 2)) w;
    format := 'zstd';
    stored_bytes := len;
    -- A declared size past bigint (a foreign frame's) reads as its maximum.
    declared_bytes := CASE WHEN content_size > 9223372036854775807 THEN 9223372036854775807
                           ELSE content_size END;
    RETURN NEXT;
END
$$;
-- @end portable
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame_info(bytea) IS
'Reads a loom snapshot frame''s header without inflating it: format (json or zstd), stored_bytes (the whole frame), declared_bytes (the JSON text''s length as declared; NULL when a zstd frame declares none), has_checksum.';
-- (was: @rerun snapshot_api: loom_ensure_snapshot_zstd)
CREATE OR REPLACE FUNCTION @extschema@.loom_ensure_snapshot_zstd(lock_timeout_ms integer DEFAULT 200)
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

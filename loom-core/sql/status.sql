-- loom_status(): the facts `loom status` prints, as rows, for psql and
-- monitoring queries (issue 19). Each row is one fact; needs_action marks
-- what an operator should do something about, and statement says what to
-- run. Read-only and lock-free beyond reads: a reader may call it.
--
-- It answers from catalogs and statistics alone, in constant time at any
-- size (issue 26; the keyframe and delta split reads a bounded sample): row counts are the planner's estimates
-- (pg_class.reltuples: a count(*) of a large log would take minutes; a
-- table never vacuumed or analyzed has none, and says so rather than "~0
-- rows"), snapshots by format are estimated from state_z's null fraction
-- and average width (pg_stats), sizes are the relations' files. Whether
-- loom.executions agrees with loom.events is not checked here (it grows
-- with the executions): loom_verify_executions() checks it in batches
-- (`loom status --verify`).
CREATE FUNCTION @extschema@.loom_status()
RETURNS TABLE(item text, value text, needs_action boolean, statement text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    installed text;
    available text;
    frames record;
    col record;
    sample_percent numeric;
    sample record;
    sampled text;
    previous_lock_timeout text;
BEGIN
    item := 'server version'; value := current_setting('server_version');
    needs_action := false; statement := NULL;
    RETURN NEXT;

    SELECT e.extversion INTO installed FROM pg_extension e WHERE e.extname = 'loom';
    IF installed IS NULL AND to_regclass('loom.sql_only') IS NOT NULL THEN
        -- The SQL-only flavour (docs/flavours.md): its version is in its
        -- table, and the server has no loom to update to: the client
        -- that installed it brings the next one (loom migrate --sql-only).
        EXECUTE 'SELECT version FROM loom.sql_only' INTO installed;
        item := 'loom flavour'; value := 'SQL-only';
        RETURN NEXT;
        item := 'loom version'; value := installed;
        RETURN NEXT;
    ELSE
        SELECT a.default_version INTO available FROM pg_available_extensions a WHERE a.name = 'loom';
        item := 'loom flavour'; value := 'extension';
        RETURN NEXT;
        item := 'loom version'; value := installed;
        RETURN NEXT;
        item := 'loom available version'; value := available;
        needs_action := available IS DISTINCT FROM installed;
        statement := CASE WHEN needs_action THEN 'loom migrate --db <db> (or the documented ALTER EXTENSION loom UPDATE: docs/upgrading.md)' END;
        RETURN NEXT;
    END IF;
    needs_action := false; statement := NULL;

    FOR col IN
        SELECT c.tbl, c.col, coalesce(co.collname::text, 'none') AS collation
        FROM (VALUES (1, 'refs', 'name'), (2, 'events', 'execution_id'),
                     (3, 'snapshots', 'execution_id'), (4, 'lineage', 'execution_id')) AS c(n, tbl, col)
        JOIN pg_class r ON r.relname = c.tbl AND r.relnamespace = 'loom'::regnamespace
        JOIN pg_attribute a ON a.attrelid = r.oid AND a.attname = c.col
        LEFT JOIN pg_collation co ON co.oid = a.attcollation
        ORDER BY c.n
    LOOP
        item := format('collation of loom.%s.%s', col.tbl, col.col);
        value := col.collation;
        needs_action := NOT @extschema@.loom_column_is_c(col.tbl, col.col);
        statement := CASE WHEN needs_action THEN 'SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations(2000);' END;
        RETURN NEXT;
    END LOOP;

    frames := @extschema@.loom_snapshot_frame_catalog();
    item := 'snapshot frames';
    value := CASE WHEN frames.has_column AND frames.has_check THEN 'provisioned' ELSE 'not provisioned' END;
    needs_action := value <> 'provisioned';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_snapshot_zstd(200);' END;
    RETURN NEXT;

    item := 'loom.idx_events_exec (unused since 0.4.0)';
    value := CASE WHEN to_regclass('loom.idx_events_exec') IS NULL THEN 'dropped' ELSE 'present' END;
    needs_action := value = 'present';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_drop_events_id_index(2000);' END;
    RETURN NEXT;

    item := 'loom.events.metadata (0.11.0)';
    value := CASE WHEN @extschema@.loom_events_have_metadata() THEN 'present' ELSE 'missing' END;
    needs_action := value = 'missing';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_event_metadata(2000);' END;
    RETURN NEXT;

    item := 'executions index';
    value := 'not checked here: loom status --verify (loom_verify_executions) checks it in batches';
    needs_action := false; statement := NULL;
    RETURN NEXT;

    -- Claims (issue 38), counted over the executions in flight (the rows
    -- with a due time), summed over the queues.
    item := 'claims';
    needs_action := false; statement := NULL;
    IF NOT has_table_privilege('loom.claims', 'SELECT') THEN
        value := 'not counted: this role may not read loom.claims';
    ELSE
        SELECT format('%s due, %s claimed, %s lapsed, %s scheduled',
                      coalesce(sum(q.due), 0), coalesce(sum(q.claimed), 0),
                      coalesce(sum(q.lapsed), 0), coalesce(sum(q.scheduled), 0))
          INTO value FROM @extschema@.loom_claim_counts() q;
    END IF;
    RETURN NEXT;

    -- The change feed (issue 38): on while loom.events.feed_tx has its
    -- default; its consumers.
    item := 'change feed';
    needs_action := false; statement := NULL;
    IF NOT @extschema@.loom_feed_is_on() THEN
        -- On before a dump, and restored without its defaults.
        IF has_table_privilege('loom.feed_state', 'SELECT')
           AND EXISTS (SELECT FROM loom.feed_state s WHERE s.enabled) THEN
            value := 'off, but it was on (a restore does not carry its defaults)';
            needs_action := true;
            statement := 'SELECT @extschema@.loom_feed_enable();';
        ELSIF has_table_privilege('loom.feed_state', 'SELECT') AND EXISTS (SELECT FROM loom.feed_state)
              AND to_regclass('loom.events_feed_position') IS NULL THEN
            -- Turned off before a dump: what it wrote is restored, its
            -- index is not, and readers refuse until it is built.
            value := 'off, and its index was not restored: readers refuse';
            needs_action := true;
            statement := 'SELECT @extschema@.loom_feed_enable(); SELECT @extschema@.loom_feed_disable();';
        ELSE
            value := 'off';
        END IF;
    ELSIF has_table_privilege('loom.feed_high_water', 'SELECT') AND has_table_privilege('loom.events', 'SELECT')
          AND to_regclass('loom.events_feed_position') IS NOT NULL
          AND @extschema@.loom_feed_restored(@extschema@.loom_feed_newest()) THEN
        -- A SQL-only dump carries the defaults, with the old cluster's
        -- offset: readers refuse until the feed moves to a new era.
        value := 'on, but restored from another cluster: new positions would sort below the restored ones (readers refuse)';
        needs_action := true;
        statement := 'SELECT @extschema@.loom_feed_enable();';
    ELSIF NOT has_table_privilege('loom.feed_consumers', 'SELECT') THEN
        value := 'on';
    ELSE
        -- A consumer whose role was dropped is left behind, and only the
        -- owner (whom row security does not filter) sees it.
        SELECT format('on, %s consumers visible to this role', count(*))
               || CASE WHEN count(*) FILTER (WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = c.owner_role::oid)) > 0
                       THEN format(', %s of them of roles dropped since',
                                   count(*) FILTER (WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = c.owner_role::oid)))
                       ELSE '' END,
               count(*) FILTER (WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = c.owner_role::oid)) > 0
          INTO value, needs_action
        FROM loom.feed_consumers c;
        statement := CASE WHEN needs_action THEN 'DELETE FROM loom.feed_consumers c WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) c.owner_role::pg_catalog.oid); -- as loom''s owner' END;
    END IF;
    RETURN NEXT;
    -- What holds the feed back: readers read below the cluster's oldest
    -- transaction id in progress (any database, any role; a prepared
    -- transaction until it is committed or rolled back): the one with the
    -- oldest id, which need not be the one that began first. Its start is
    -- hidden from a role that may not see the session's (pg_read_all_stats).
    IF value LIKE 'on%' THEN
        item := 'change feed held back by';
        SELECT format('%s, transaction %s, %s', o.what, o.xid, coalesce('open since ' || o.since::text, 'its start hidden from this role')),
               o.since < statement_timestamp() - interval '5 minutes'
          INTO value, needs_action
        FROM (SELECT format('pid %s (%s, database %s)', a.pid, coalesce(a.usename::text, 'a role'), coalesce(a.datname::text, '?')) AS what,
                     a.backend_xid AS xid, a.xact_start AS since, age(a.backend_xid) AS age
              FROM pg_stat_activity a WHERE a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
              UNION ALL
              SELECT format('prepared transaction %s', quote_literal(p.gid)), p.transaction, p.prepared, age(p.transaction)
              FROM pg_prepared_xacts p
              ORDER BY age DESC LIMIT 1) o;
        value := coalesce(value, 'nothing');
        needs_action := coalesce(needs_action, false);
        statement := CASE WHEN needs_action THEN 'end the transaction named (the feed shows nothing newer until it ends)' END;
        RETURN NEXT;
        needs_action := false; statement := NULL;
    END IF;

    item := 'distributed (Citus)';
    value := CASE WHEN @extschema@.loom_is_distributed() THEN 'yes' ELSE 'no' END;
    needs_action := false; statement := NULL;
    RETURN NEXT;

    FOR item, value IN
        SELECT format('table loom.%s', r.relname),
               format('%s, %s',
                      CASE WHEN r.reltuples < 0 THEN 'rows not estimated yet (never vacuumed or analyzed)'
                           ELSE format('~%s rows', r.reltuples::bigint) END,
                      pg_size_pretty(pg_total_relation_size(r.oid)))
        FROM pg_class r
        WHERE r.relnamespace = 'loom'::regnamespace AND r.relkind IN ('r', 'p')
        ORDER BY r.relname
    LOOP
        RETURN NEXT;
    END LOOP;

    -- Both formats, estimated: rows from the table's estimate and
    -- state_z's null fraction (a row without a frame holds JSONB), bytes
    -- from the average stored width of the column each format is in.
    -- Unestimated until the table is analyzed, and said so.
    FOR item, value IN
        SELECT 'snapshots as ' || f.format,
               CASE WHEN r.reltuples < 0 THEN 'rows not estimated yet (never vacuumed or analyzed)'
                    WHEN r.reltuples = 0 THEN '~0 rows, 0 bytes'
                    WHEN j.null_frac IS NULL OR (frames.has_column AND z.null_frac IS NULL)
                    THEN 'rows by format not estimated yet (not analyzed)'
                    ELSE format('~%s rows, ~%s',
                                round(r.reltuples * f.share)::bigint,
                                pg_size_pretty(round(r.reltuples * f.share * coalesce(f.width, 0))::bigint))
               END
        FROM pg_class r
        LEFT JOIN pg_stats z ON z.schemaname = 'loom' AND z.tablename = 'snapshots' AND z.attname = 'state_z'
        LEFT JOIN pg_stats j ON j.schemaname = 'loom' AND j.tablename = 'snapshots' AND j.attname = 'state'
        CROSS JOIN LATERAL (VALUES
            -- state's average is over every row, a frame row's sentinel
            -- too: the JSONB rows' own width is what is left of it.
            (1, 'JSONB', CASE WHEN frames.has_column THEN z.null_frac ELSE 1 END,
             CASE WHEN frames.has_column AND z.null_frac > 0
                  THEN greatest(0, (j.avg_width - (1 - z.null_frac)
                        * pg_column_size('{"__loomEnc":"loom.snapshot-frame/state_z"}'::jsonb)) / z.null_frac)
                  ELSE j.avg_width END),
            (2, 'frames', CASE WHEN frames.has_column THEN 1 - z.null_frac ELSE 0 END, z.avg_width)
        ) AS f(n, format, share, width)
        WHERE r.oid = 'loom.snapshots'::regclass AND (f.n = 1 OR frames.has_column)
        ORDER BY f.n
    LOOP
        RETURN NEXT;
    END LOOP;

    -- Frames as keyframes (0x01, 0x02) and deltas (0x03), which statistics
    -- cannot tell apart: counted in a sample of at most 64 of the table's
    -- pages (each row's format byte is one TOAST chunk), scaled up. The
    -- pages are the file's, not pg_class's estimate (0 before the first
    -- ANALYZE); the sample waits at most 100 ms for the table (a
    -- conversion may hold it), and is skipped on Citus (a coordinator's
    -- table is its workers') and for a role that may not read it.
    IF frames.has_column THEN
        needs_action := false; statement := NULL;
        IF NOT has_table_privilege('loom.snapshots', 'SELECT') THEN
            sampled := 'not sampled: this role may not read loom.snapshots';
        ELSIF @extschema@.loom_is_distributed() THEN
            sampled := 'not sampled on Citus';
        ELSE
            BEGIN
                previous_lock_timeout := current_setting('lock_timeout');
                PERFORM set_config('lock_timeout', '100', true);
                SELECT CASE WHEN pg_relation_size('loom.snapshots'::regclass)
                                 > 64 * current_setting('block_size')::bigint
                            THEN 6400.0 * current_setting('block_size')::bigint
                                 / pg_relation_size('loom.snapshots'::regclass)
                            ELSE 100 END
                  INTO sample_percent;
                EXECUTE format(
                    'SELECT count(*) FILTER (WHERE x.f IN (1, 2)) AS keyframes, coalesce(sum(x.b) FILTER (WHERE x.f IN (1, 2)), 0) AS keyframe_bytes,
                            count(*) FILTER (WHERE x.f = 3) AS deltas, coalesce(sum(x.b) FILTER (WHERE x.f = 3), 0) AS delta_bytes
                     FROM (SELECT get_byte(substring(s.state_z FROM 1 FOR 1), 0) AS f, octet_length(s.state_z)::numeric AS b
                           FROM loom.snapshots s TABLESAMPLE SYSTEM (%s)
                           WHERE octet_length(s.state_z) > 0) x', sample_percent)
                  INTO sample;
                PERFORM set_config('lock_timeout', previous_lock_timeout, true);
            EXCEPTION WHEN lock_not_available THEN
                sampled := 'not sampled: loom.snapshots is locked (a conversion?); try again';
            END;
        END IF;
        item := 'snapshot frames as keyframes';
        value := sampled;
        IF sampled IS NULL THEN
            value := format('~%s rows, ~%s', round(sample.keyframes * 100 / sample_percent)::bigint,
                            pg_size_pretty(round(sample.keyframe_bytes * 100 / sample_percent)));
        END IF;
        RETURN NEXT;
        item := 'snapshot frames as deltas';
        IF sampled IS NULL THEN
            value := format('~%s rows, ~%s', round(sample.deltas * 100 / sample_percent)::bigint,
                            pg_size_pretty(round(sample.delta_bytes * 100 / sample_percent)));
        END IF;
        RETURN NEXT;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_status() IS
'What loom status prints, one fact a row, from catalogs and statistics alone (constant time at any size): server and loom versions, an update available, each execution_id/name column''s collation, snapshot frames, the unused index 0.7.0 drops, where the executions index is checked (loom_verify_executions), claims due, claimed, lapsed and scheduled (counted), whether the change feed is on, whether loom is distributed, estimated rows and bytes per table, estimated snapshot rows and bytes by format, and frames as keyframes and deltas (from a sample of at most 64 pages). needs_action marks what to act on, statement what to run. Reads only; a reader may call it.';

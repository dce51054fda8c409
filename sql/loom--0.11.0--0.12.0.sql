-- loom 0.11.0 -> 0.12.0 (issue 28): the SQL-only flavour. Nothing in the
-- extension's tables or its API changes: 0.12.0 is the version whose SQL
-- also installs without loom.so (loom-core/sql, docs/flavours.md), and
-- loom_status() now says which flavour a database has (a row 'loom
-- flavour': 'extension' here, 'SQL-only' where loom.sql_only records the
-- version). loom_track_appended takes the stripe of each id before it
-- reads the log (a writer calling it during a delete could add an id left
-- with no events).
\echo Use "ALTER EXTENSION loom UPDATE TO '0.12.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25): every loom object is named by @extschema@ or loom.
SET LOCAL search_path = pg_catalog, pg_temp;

-- As loom-core/sql/status.sql defines it for a fresh install.
CREATE OR REPLACE FUNCTION @extschema@.loom_status()
RETURNS TABLE(item text, value text, needs_action boolean, statement text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    installed text;
    available text;
    frames record;
    col record;
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
        statement := CASE WHEN needs_action THEN 'SET statement_timeout = 0; SELECT * FROM @extschema@.loom_migrate_collations();' END;
        RETURN NEXT;
    END LOOP;

    frames := @extschema@.loom_snapshot_frame_catalog();
    item := 'snapshot frames';
    value := CASE WHEN frames.has_column AND frames.has_check THEN 'provisioned' ELSE 'not provisioned' END;
    needs_action := value <> 'provisioned';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_snapshot_zstd();' END;
    RETURN NEXT;

    item := 'loom.idx_events_exec (unused since 0.4.0)';
    value := CASE WHEN to_regclass('loom.idx_events_exec') IS NULL THEN 'dropped' ELSE 'present' END;
    needs_action := value = 'present';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_drop_events_id_index();' END;
    RETURN NEXT;

    item := 'loom.events.metadata (0.11.0)';
    value := CASE WHEN @extschema@.loom_events_have_metadata() THEN 'present' ELSE 'missing' END;
    needs_action := value = 'missing';
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_ensure_event_metadata();' END;
    RETURN NEXT;

    item := 'executions index';
    value := 'not checked here: loom status --verify (loom_verify_executions) checks it in batches';
    needs_action := false; statement := NULL;
    RETURN NEXT;

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
END
$$;

-- As loom-core/sql/log_api.sql defines it for a fresh install.
CREATE OR REPLACE FUNCTION @extschema@.loom_track_appended(execution_ids text[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id text;
BEGIN
    -- One id at a time, in id order (one global lock order, across shards
    -- too), each a single-shard statement on Citus. Only ids that have
    -- events are added: whoever may call this cannot make the pager list
    -- an id the log does not hold.
    PERFORM @extschema@.loom_require_read_committed('appended to');
    FOR id IN SELECT DISTINCT i.id FROM unnest(execution_ids) AS i(id) WHERE i.id IS NOT NULL ORDER BY 1 LOOP
        -- The stripe an append holds, taken first: a delete of the id's
        -- events holds it exclusively until it commits, so the statement
        -- below starts after, with a snapshot that sees the delete. Without
        -- it a writer calling this directly during a delete read the events
        -- the delete was removing and added an id left with none (0.12.0;
        -- an append calling it holds the stripe already).
        PERFORM @extschema@.loom_lock_execution_for_write(id);
        -- One statement on one shard group (the row comes from the log).
        INSERT INTO loom.executions AS x (execution_id)
        SELECT e.execution_id FROM loom.events e WHERE e.execution_id = id LIMIT 1
        ON CONFLICT (execution_id) DO UPDATE SET execution_id = excluded.execution_id WHERE false;
    END LOOP;
END
$$;

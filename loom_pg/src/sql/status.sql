-- loom_status(): the facts `loom status` prints, as rows, for psql and
-- monitoring queries (issue 19). Each row is one fact; needs_action marks
-- what an operator should do something about, and statement says what to
-- run. Read-only and lock-free beyond reads: a reader may call it.
--
-- Row counts are the planner's estimates (pg_class.reltuples: a count(*)
-- of a large log would take minutes; a table never vacuumed or analyzed
-- has none, and says so rather than "~0 rows"); snapshot rows and bytes by format
-- are exact (one pass over loom.snapshots, sizes read without detoasting).
-- The executions index is checked both ways: ids of the log missing from
-- it (one index descent per distinct id of loom.events, a loose scan of
-- its primary key) and ids left without events (one probe each).
CREATE FUNCTION @extschema@.loom_status()
RETURNS TABLE(item text, value text, needs_action boolean, statement text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    installed text;
    available text;
    frames record;
    missing bigint;
    orphaned bigint;
    col record;
BEGIN
    item := 'server version'; value := current_setting('server_version');
    needs_action := false; statement := NULL;
    RETURN NEXT;

    SELECT e.extversion INTO installed FROM pg_extension e WHERE e.extname = 'loom';
    SELECT a.default_version INTO available FROM pg_available_extensions a WHERE a.name = 'loom';
    item := 'loom version'; value := installed;
    RETURN NEXT;
    item := 'loom available version'; value := available;
    needs_action := available IS DISTINCT FROM installed;
    statement := CASE WHEN needs_action THEN 'loom migrate --db <db> (or the documented ALTER EXTENSION loom UPDATE: docs/upgrading.md)' END;
    RETURN NEXT;

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

    WITH RECURSIVE ids(id) AS (
        (SELECT e.execution_id FROM loom.events e ORDER BY e.execution_id LIMIT 1)
        UNION ALL
        SELECT (SELECT e.execution_id FROM loom.events e
                WHERE e.execution_id > ids.id ORDER BY e.execution_id LIMIT 1)
        FROM ids WHERE ids.id IS NOT NULL
    )
    SELECT count(*) INTO missing FROM ids
    WHERE ids.id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM loom.executions x WHERE x.execution_id = ids.id);
    SELECT count(*) INTO orphaned FROM loom.executions x
    WHERE NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = x.execution_id);
    item := 'executions index';
    value := CASE WHEN missing + orphaned = 0 THEN 'in step with the log'
                  ELSE format('%s ids of the log missing, %s ids without events', missing, orphaned) END;
    needs_action := missing + orphaned > 0;
    statement := CASE WHEN needs_action THEN 'SELECT @extschema@.loom_rebuild_executions();' END;
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

    -- Both formats, counted when there are none. Dynamic where state_z
    -- may not exist (frames are opt-in).
    FOR item, value IN EXECUTE format(
        'SELECT ''snapshots as '' || f.format,
                format(''%%s rows, %%s'', count(s.id), pg_size_pretty(coalesce(sum(%s), 0)::bigint))
         FROM (VALUES (1, ''JSONB''), (2, ''frames'')) AS f(n, format)
         LEFT JOIN loom.snapshots s ON %s
         WHERE f.n = 1 OR %L
         GROUP BY f.n, f.format ORDER BY f.n',
        CASE WHEN frames.has_column
             THEN 'CASE WHEN s.state_z IS NULL THEN pg_column_size(s.state) ELSE octet_length(s.state_z) END'
             ELSE 'pg_column_size(s.state)' END,
        CASE WHEN frames.has_column THEN '(s.state_z IS NULL) = (f.n = 1)' ELSE 'f.n = 1' END,
        frames.has_column)
    LOOP
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_status() IS
'What loom status prints, one fact a row: server and loom versions, an update available, each execution_id/name column''s collation, snapshot frames, the unused index 0.7.0 drops, whether loom.executions agrees with loom.events (both ways), whether loom is distributed, estimated rows and bytes per table, snapshot rows and bytes by format. needs_action marks what to act on, statement what to run. Reads only; a reader may call it.';

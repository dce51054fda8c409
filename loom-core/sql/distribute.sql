-- Scale-out on Citus: one logical database over several machines. loom's
-- tables are distributed by execution_id, so everything about one
-- execution (its events, its row in loom.executions, its snapshots, its
-- fork record) lives in one shard group on one worker: an append, a
-- resume, a retention batch is a single-shard statement there, and a page
-- of ids is a LIMIT pushed to every shard and merged on the coordinator.
-- Refs are keyed by name, not by execution: a reference table, on every
-- node. (Client-side sharding, ShardedEventStore, is the other way to
-- grow: independent databases, not one.)

-- What loom's tables are in this database: 'local' (no Citus, or not yet
-- distributed), 'distributed' or 'reference', read from Citus' catalog.
CREATE FUNCTION @extschema@.loom_distribution()
RETURNS TABLE(table_name text, distribution text, distribution_column text, shard_count integer, colocated_with_events boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    loom_table text;
BEGIN
    FOREACH loom_table IN ARRAY ARRAY['events', 'executions', 'snapshots', 'lineage', 'refs'] LOOP
        table_name := 'loom.' || loom_table;
        distribution := 'local';
        distribution_column := NULL;
        shard_count := NULL;
        colocated_with_events := NULL;
        -- Citus' catalog (pg_dist_*) is read only where citus exists: a
        -- PL/pgSQL statement is planned when it first runs.
        IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
            SELECT CASE WHEN p.partmethod = 'h' THEN 'distributed'
                        WHEN p.repmodel = 't' THEN 'reference'
                        ELSE 'citus local' END,
                   column_to_column_name(p.logicalrelid, p.partkey),
                   (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                   p.colocationid = (SELECT e.colocationid FROM pg_dist_partition e
                                     WHERE e.logicalrelid = 'loom.events'::regclass)
            INTO distribution, distribution_column, shard_count, colocated_with_events
            FROM pg_dist_partition p WHERE p.logicalrelid = table_name::regclass;
            distribution := coalesce(distribution, 'local');
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_distribution() IS
'How each of loom''s tables is stored here: local (one node, or Citus before loom_distribute), distributed (by execution_id, co-located with loom.events) or reference (on every node), with its shard count.';

-- The layout loom_distribute makes, checked as a whole.
CREATE FUNCTION @extschema@.loom_is_distributed()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT count(*) = 5 FROM @extschema@.loom_distribution() d
            WHERE (d.table_name = 'loom.refs' AND d.distribution = 'reference')
               OR (d.table_name <> 'loom.refs' AND d.distribution = 'distributed'
                   AND d.distribution_column = 'execution_id' AND d.colocated_with_events));
END
$$;
COMMENT ON FUNCTION @extschema@.loom_is_distributed() IS
'True when loom''s tables are laid out as loom_distribute makes them: events, executions, snapshots and lineage distributed by execution_id and co-located, refs a reference table.';

-- What every node (coordinator and workers) runs before the tables are
-- distributed: its own copy of loom's tables is what Citus reads there
-- (it creates no shell table of an extension's table), so each must have
-- COLLATE "C" ids and no triggers. Without the triggers, loom's functions
-- keep loom.executions themselves (loom_executions_tracked_by_trigger).
CREATE FUNCTION @extschema@.loom_prepare_node_for_citus(lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    skipped text;
    outcome text := 'ready';
    caller_propagation text := current_setting('citus.enable_ddl_propagation', true);
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    -- This node's own copy, changed here alone: Citus would otherwise
    -- refuse DDL on a worker ("not allowed on this node") or send it on.
    PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
    SELECT string_agg(m.column_name || ' ' || m.outcome, '; ') INTO skipped
    FROM @extschema@.loom_migrate_collations(lock_timeout_ms) m
    WHERE m.outcome NOT IN ('converted', 'already COLLATE "C"');
    IF skipped IS NOT NULL THEN
        outcome := 'not COLLATE "C": ' || skipped;
    -- The frame column too (ADR 0141 D5's opt-in, taken here): Citus
    -- cannot set a distributed column's storage, so it is added while the
    -- table is local, and its shards inherit STORAGE EXTERNAL.
    ELSIF NOT @extschema@.loom_ensure_snapshot_zstd(least(lock_timeout_ms, 200)) THEN
        outcome := 'the snapshot frame column could not be added';
    ELSE
        -- DROP TRIGGER queues behind open writes to loom.events: a bounded
        -- wait, whose timeout (55P03) the caller reports.
        PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
        DROP TRIGGER IF EXISTS events_track_inserted_executions ON loom.events;
        DROP TRIGGER IF EXISTS events_track_deleted_executions ON loom.events;
        DROP TRIGGER IF EXISTS events_track_truncated_executions ON loom.events;
        -- Citus itself refuses to change a distribution column.
        DROP TRIGGER IF EXISTS events_refuse_id_update ON loom.events;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
    END IF;
    PERFORM set_config('citus.enable_ddl_propagation', coalesce(caller_propagation, 'on'), true);
    RETURN outcome;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_prepare_node_for_citus(integer) IS
'Readies this node''s loom tables for Citus (called by loom_distribute on every node): converts the id columns to COLLATE "C" (loom_migrate_collations), provisions the snapshot frame column (loom_ensure_snapshot_zstd: Citus cannot set its storage later), and drops loom.events'' triggers, whose work loom''s functions then do. Returns ready, or what is not.';

CREATE FUNCTION @extschema@.loom_distribute(shard_count integer DEFAULT NULL, lock_timeout_ms integer DEFAULT NULL)
RETURNS TABLE(table_name text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    wait integer := @extschema@.loom_check_lock_timeout(
        coalesce(lock_timeout_ms, @extschema@.loom_migration_lock_timeout()));
    caller_lock_timeout text := current_setting('lock_timeout');
    caller_min_messages text := current_setting('client_min_messages');
    not_ready text;
    loom_table text;
BEGIN
    IF shard_count IS NOT NULL AND (shard_count < 1 OR shard_count > 64000) THEN
        RAISE EXCEPTION 'shard_count must be between 1 and 64000, got %', shard_count
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'loom_distribute needs Citus, and the citus extension is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'On a Citus cluster: CREATE EXTENSION citus; and citus_add_node() each worker, in this database, first. On one server loom needs no distribution.';
    END IF;
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION 'loom_distribute runs on the Citus coordinator, and this node is not it'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- Done already: no lock at all, like every other loom migration.
    IF @extschema@.loom_is_distributed() THEN
        RETURN QUERY SELECT d.table_name, 'already ' || d.distribution FROM @extschema@.loom_distribution() d;
        RETURN;
    END IF;
    -- The change feed's positions follow one server's transactions.
    IF @extschema@.loom_feed_is_on() THEN
        RAISE EXCEPTION 'loom_distribute cannot distribute loom while its change feed is on: the feed does not run on Citus'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'SELECT @extschema@.loom_feed_disable(); first (docs/feed.md).';
    END IF;
    -- Copying the rows into shards cannot be cut short by a timer without
    -- rolling it all back: like the conversions, it starts only without one.
    IF current_setting('statement_timeout') <> '0' THEN
        RAISE WARNING 'loom: not distributing: statement_timeout is %, and a copy it cancels would hold its locks for nothing',
                current_setting('statement_timeout')
            USING HINT = 'SET statement_timeout = 0; SELECT * FROM @extschema@.loom_distribute();';
        RETURN QUERY SELECT d.table_name, 'skipped: statement_timeout' FROM @extschema@.loom_distribution() d;
        RETURN;
    END IF;
    PERFORM @extschema@.loom_take_migration_lock();
    IF @extschema@.loom_is_distributed() THEN
        RETURN QUERY SELECT d.table_name, 'already ' || d.distribution FROM @extschema@.loom_distribution() d;
        RETURN;
    END IF;
    -- Every worker first (each in its own transaction: a conversion there
    -- is on empty tables, and stays done whatever happens here), then this
    -- node, in this transaction, inside the block that fails soft.
    SELECT string_agg(r.nodename || ':' || r.nodeport || ' ' || r.result, '; ') INTO not_ready
    FROM run_command_on_workers(
        format('SELECT %s.loom_prepare_node_for_citus(%s)', '@extschema@', wait)) r
    WHERE NOT r.success OR r.result <> 'ready';
    BEGIN
        IF not_ready IS NULL THEN
            not_ready := nullif(@extschema@.loom_prepare_node_for_citus(wait), 'ready');
        END IF;
        IF not_ready IS NOT NULL THEN
            RAISE WARNING 'loom: not distributing: a node is not ready: %', not_ready
                USING DETAIL = 'Nothing was distributed; loom keeps working on the coordinator alone.',
                      HINT = 'Retry SELECT * FROM @extschema@.loom_distribute(); in a quieter moment, with statement_timeout 0.';
            RETURN QUERY SELECT d.table_name, 'skipped: ' || not_ready FROM @extschema@.loom_distribution() d;
            RETURN;
        END IF;
        PERFORM set_config('lock_timeout', wait || 'ms', true);
        -- Citus says, per table, that it copied the rows and how to drop
        -- the local copy: this function does that, so the NOTICEs go.
        PERFORM set_config('client_min_messages',
            CASE WHEN current_setting('client_min_messages') IN ('debug5', 'debug4', 'debug3', 'debug2', 'debug1', 'log', 'notice')
                 THEN 'warning' ELSE current_setting('client_min_messages') END, true);
        -- Citus asks every unique key to hold the distribution column: the
        -- identity id stays unique per execution.
        IF NOT EXISTS (SELECT 1 FROM pg_constraint c
                       WHERE c.conrelid = 'loom.snapshots'::regclass AND c.conname = 'snapshots_pkey'
                         AND c.conkey = ARRAY[(SELECT a.attnum FROM pg_attribute a
                                               WHERE a.attrelid = 'loom.snapshots'::regclass AND a.attname = 'execution_id'),
                                              (SELECT a.attnum FROM pg_attribute a
                                               WHERE a.attrelid = 'loom.snapshots'::regclass AND a.attname = 'id')]::int2[]) THEN
            ALTER TABLE loom.snapshots DROP CONSTRAINT snapshots_pkey,
                ADD CONSTRAINT snapshots_pkey PRIMARY KEY (execution_id, id);
        END IF;
        FOREACH loom_table IN ARRAY ARRAY['events', 'executions', 'snapshots', 'lineage', 'refs'] LOOP
            CONTINUE WHEN EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = ('loom.' || loom_table)::regclass);
            IF loom_table = 'refs' THEN
                PERFORM create_reference_table('loom.refs');
            ELSIF loom_table = 'events' THEN
                PERFORM create_distributed_table('loom.events', 'execution_id', shard_count => shard_count);
            ELSE
                PERFORM create_distributed_table('loom.' || loom_table, 'execution_id', colocate_with => 'loom.events');
            END IF;
            -- The rows were copied into the shards; the local copy goes.
            PERFORM truncate_local_data_after_distributing_table(('loom.' || loom_table)::regclass);
        END LOOP;
        PERFORM set_config('lock_timeout', caller_lock_timeout, true);
        PERFORM set_config('client_min_messages', caller_min_messages, true);
    EXCEPTION
        WHEN lock_not_available OR query_canceled OR deadlock_detected THEN
            RAISE WARNING 'loom: could not distribute loom''s tables: % (SQLSTATE %)', SQLERRM, SQLSTATE
                USING DETAIL = 'Nothing was distributed; loom keeps working on the coordinator alone.',
                      HINT = 'Retry SELECT * FROM @extschema@.loom_distribute(); in a quieter moment, with statement_timeout 0.';
            RETURN QUERY SELECT d.table_name, 'skipped: ' || SQLSTATE FROM @extschema@.loom_distribution() d;
            RETURN;
    END;
    RETURN QUERY SELECT d.table_name, d.distribution FROM @extschema@.loom_distribution() d;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_distribute(integer, integer) IS
'On a Citus coordinator: distributes loom.events by execution_id into shard_count shards (NULL: citus.shard_count), co-locates loom.executions, loom.snapshots and loom.lineage with it, and makes loom.refs a reference table, moving the rows there already. Every execution id column is made COLLATE "C" on every node first, the snapshot frame column is provisioned (Citus could not set its storage later), and loom.events'' triggers are dropped (loom''s functions keep loom.executions on Citus). Idempotent (no lock once done); waits at most lock_timeout_ms (default loom.migration_lock_timeout) for each lock, and on a lock timeout, cancel or deadlock rolls back whole with a WARNING. Needs statement_timeout 0 (skips with a WARNING otherwise). Returns each table''s outcome.';

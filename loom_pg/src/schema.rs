//! The pg_tests of loom's tables and SQL API (`loom-core/sql/`), as the
//! extension installs them (`parts.rs`).

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::sqlstate_of;
    use pgrx::prelude::*;

    fn column(query: &str) -> Vec<String> {
        Spi::connect(|client| {
            client
                .select(query, None, &[])
                .unwrap()
                .map(|row| row.get::<String>(1).unwrap().unwrap())
                .collect()
        })
    }

    fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(query: &str) -> Option<T> {
        Spi::get_one::<T>(query).unwrap()
    }

    const MIXED: &str =
        "ARRAY['a_b','A1','a-b','B','é','e' || U&'\\0301', U&'\\FFFD', U&'\\+01D11E','0','_']";

    fn append_mixed() {
        Spi::run(&format!(
            "SELECT loom_append_events({MIXED}, array_fill(1::bigint, ARRAY[10]),
                                       array_fill('started'::text, ARRAY[10]),
                                       array_fill('{{}}'::jsonb, ARRAY[10]))"
        ))
        .unwrap();
    }

    fn sorted_mixed() -> Vec<String> {
        let mut ids = column(&format!("SELECT unnest({MIXED})"));
        ids.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
        ids
    }

    #[pg_test]
    fn lists_executions_in_code_point_order_by_any_cursor() {
        append_mixed();
        Spi::run("SELECT loom_append_event('B', 2, 'more', '{}')").unwrap();
        let all = sorted_mixed();
        assert_eq!(column("SELECT * FROM loom_list_executions()"), all);
        // Page by 3 with the last id as the cursor: every id once, in order.
        let mut paged = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = match &cursor {
                None => column("SELECT * FROM loom_list_executions(NULL, 3)"),
                Some(after) => column(&format!(
                    "SELECT * FROM loom_list_executions({}, 3)",
                    pgrx::spi::quote_literal(after)
                )),
            };
            paged.extend(page.iter().cloned());
            if page.len() < 3 {
                break;
            }
            cursor = page.last().cloned();
        }
        assert_eq!(paged, all);
        // A cursor no store returned: everything strictly after it.
        let after_a2: Vec<String> = all
            .iter()
            .filter(|id| id.as_str() > "A2")
            .cloned()
            .collect();
        assert_eq!(column("SELECT * FROM loom_list_executions('A2')"), after_a2);
        assert_eq!(
            column("SELECT * FROM loom_list_executions(U&'\\+10FFFF')"),
            Vec::<String>::new()
        );
    }

    #[pg_test]
    fn pages_in_code_point_order_on_a_column_not_yet_converted() {
        // An upgraded database's events column in another collation: the
        // executions index is "C" regardless, and keeps following writes.
        Spi::run(r#"ALTER TABLE loom.events ALTER COLUMN execution_id TYPE text COLLATE "POSIX""#)
            .unwrap();
        append_mixed();
        Spi::run("SELECT loom_append_event('zz', 1, 'step', '{}')").unwrap();
        Spi::run("SELECT loom_delete_events('A1')").unwrap();
        let mut expected: Vec<String> =
            sorted_mixed().into_iter().filter(|id| id != "A1").collect();
        expected.push("zz".to_owned());
        expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
        assert_eq!(
            column("SELECT * FROM loom_list_executions(NULL, 100)"),
            expected
        );
        assert_eq!(
            column("SELECT * FROM loom_list_executions('B', 2)"),
            expected[expected.iter().position(|id| id == "B").unwrap() + 1..][..2]
        );
    }

    #[pg_test]
    fn a_writer_without_grants_on_the_index_appends_and_deletes() {
        Spi::run(
            "CREATE ROLE loom_test_writer;
             GRANT USAGE ON SCHEMA loom TO loom_test_writer;
             GRANT SELECT, INSERT, DELETE ON loom.events TO loom_test_writer;
             SET LOCAL ROLE loom_test_writer;
             SELECT loom_append_event('w', 1, 'step', '{}');
             SELECT loom_append_event('w', 2, 'step', '{}');
             SELECT loom_delete_events('w', 1);",
        )
        .unwrap();
        // Listing reads loom.executions as the caller: that takes SELECT.
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(column("SELECT * FROM loom_list_executions()"), ["w"]);
        Spi::run("SET LOCAL ROLE loom_test_writer; SELECT loom_delete_events('w'); RESET ROLE")
            .unwrap();
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            Vec::<String>::new()
        );
    }

    #[pg_test]
    fn without_the_triggers_loom_functions_keep_the_executions_index() {
        // What loom_distribute leaves on every Citus node, here on one:
        // loom.events without triggers, loom's functions doing their work.
        assert_eq!(
            one::<String>("SELECT loom_prepare_node_for_citus(1000)").as_deref(),
            Some("ready")
        );
        assert_eq!(
            one::<bool>("SELECT loom_executions_tracked_by_trigger()"),
            Some(false)
        );
        Spi::run(
            "CREATE ROLE loom_test_citus_writer;
             GRANT USAGE ON SCHEMA loom TO loom_test_citus_writer;
             GRANT SELECT, INSERT, DELETE ON loom.events, loom.snapshots TO loom_test_citus_writer;
             -- Where no trigger keeps loom.executions, a writer needs the two
             -- functions that do (what loom_grant_access(.., 'writer') gives).
             GRANT EXECUTE ON FUNCTION loom_track_appended(text[]), loom_track_emptied(text)
                 TO loom_test_citus_writer;",
        )
        .unwrap();
        // A NULL id fails the whole batch (NOT NULL), before any tracking.
        assert_eq!(
            sqlstate_of(
                "SELECT loom_append_events(ARRAY['b', NULL], ARRAY[1, 1]::bigint[],
                                           ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[])"
            ),
            "23502"
        );
        Spi::run(
            "SET LOCAL ROLE loom_test_citus_writer;
             SELECT loom_append_event('one', 1, 'step', '{}');
             SELECT loom_append_events(ARRAY['b', 'a', 'b'], ARRAY[1, 1, 2]::bigint[],
                                       ARRAY['s', 's', 's'], ARRAY['{}', '{}', '{}']::jsonb[]);
             SELECT loom_delete_events('b', 1);
             RESET ROLE",
        )
        .unwrap();
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            ["a", "b", "one"]
        );
        // A caller cannot add an id the log does not hold.
        Spi::run("SELECT loom_track_appended(ARRAY['phantom', 'a'])").unwrap();
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            ["a", "b", "one"]
        );
        Spi::run(
            r#"SELECT loom_save_snapshot('a', 'wf', 1, '{}');
               SELECT loom_delete_events('b');
               SELECT loom_delete_execution('one');"#,
        )
        .unwrap();
        assert_eq!(column("SELECT * FROM loom_list_executions()"), ["a"]);
        // Pruning keeps the event at the snapshot, so the id stays listed.
        assert_eq!(one::<i64>("SELECT loom_prune_events('a')"), Some(0));
        assert_eq!(column("SELECT * FROM loom_list_executions()"), ["a"]);
        assert_eq!(one::<i64>("SELECT loom_rebuild_executions()"), Some(0));
    }

    #[pg_test]
    fn the_executions_index_follows_every_write_to_the_log() {
        // Direct writes too: a multi-row INSERT, a DELETE of part and of all
        // of a log, a TRUNCATE.
        Spi::run(
            "INSERT INTO loom.events (execution_id, sequence, kind, payload)
             SELECT 'x' || (i % 3), i, 'step', '{}' FROM generate_series(1, 9) i",
        )
        .unwrap();
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            ["x0", "x1", "x2"]
        );
        Spi::run("DELETE FROM loom.events WHERE execution_id = 'x1' AND sequence < 7").unwrap();
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            ["x0", "x1", "x2"]
        );
        Spi::run("DELETE FROM loom.events WHERE execution_id IN ('x1', 'x2')").unwrap();
        assert_eq!(column("SELECT * FROM loom_list_executions()"), ["x0"]);
        assert_eq!(
            sqlstate_of("UPDATE loom.events SET execution_id = 'y' WHERE execution_id = 'x0'"),
            "0A000"
        );
        Spi::run("UPDATE loom.events SET kind = 'still allowed' WHERE execution_id = 'x0'")
            .unwrap();
        // Drift (a write with the triggers off) is repaired from the log.
        Spi::run("INSERT INTO loom.executions VALUES ('ghost')").unwrap();
        Spi::run("ALTER TABLE loom.events DISABLE TRIGGER USER").unwrap();
        Spi::run("INSERT INTO loom.events VALUES ('unseen', 1, 'step', '{}')").unwrap();
        Spi::run("ALTER TABLE loom.events ENABLE TRIGGER USER").unwrap();
        assert_eq!(one::<i64>("SELECT loom_rebuild_executions()"), Some(2));
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            ["unseen", "x0"]
        );
        assert_eq!(one::<i64>("SELECT loom_rebuild_executions()"), Some(0));
        Spi::run("TRUNCATE loom.events").unwrap();
        assert_eq!(one::<i64>("SELECT count(*) FROM loom.executions"), Some(0));
    }

    fn log_of(id: &str, events: i64) {
        Spi::run(&format!(
            "SELECT loom_append_event({}, s, 'step', jsonb_build_object('n', s)) FROM generate_series(1, {events}) s",
            pgrx::spi::quote_literal(id)
        ))
        .unwrap();
    }

    #[pg_test]
    fn reads_a_tail_after_a_sequence_by_keyset() {
        log_of("e", 10);
        assert_eq!(
            column("SELECT sequence::text FROM loom_read_events('e', 3, 4)"),
            ["4", "5", "6", "7"]
        );
        assert_eq!(
            column("SELECT (payload->>'n') FROM loom_read_events('e')"),
            (1..=10).map(|n| n.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_read_events('e', 10)"),
            Some(0)
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_read_events('e', 1, 0)"),
            "22023"
        );
    }

    #[pg_test]
    fn resumes_from_the_latest_snapshot_and_the_events_after_it() {
        log_of("e", 10);
        // No snapshot: the whole log, no snapshot row.
        assert_eq!(
            column("SELECT sequence::text FROM loom_resume('e') WHERE snapshot_id IS NULL"),
            (1..=10).map(|n| n.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_resume('e') WHERE snapshot_id IS NOT NULL"),
            Some(0)
        );
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 3, '{"at":3}')"#).unwrap();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 6, '{"at":6}', 'zstd')"#).unwrap();
        // The snapshot row first (a frame, as stored), then 7..10.
        assert_eq!(
            column(
                "SELECT coalesce(kind, 'snapshot') || ':' || sequence || ':' || (state_z IS NOT NULL)::text FROM loom_resume('e')"
            ),
            [
                "snapshot:6:true",
                "step:7:false",
                "step:8:false",
                "step:9:false",
                "step:10:false"
            ]
        );
        assert_eq!(
            one::<String>("SELECT loom_snapshot_state_text(state_z) FROM loom_resume('e') WHERE snapshot_id IS NOT NULL"),
            Some(r#"{"at":6}"#.to_owned())
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_resume('nobody')"),
            Some(0)
        );
    }

    #[pg_test]
    fn prunes_what_resume_no_longer_needs_in_bounded_batches() {
        log_of("e", 5);
        assert_eq!(
            one::<i64>("SELECT loom_prune_events('e', 2)"),
            Some(0),
            "no snapshot: nothing"
        );
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 3, '{}')"#).unwrap();
        let batches: Vec<i64> = (0..2)
            .map(|_| one::<i64>("SELECT loom_prune_events('e', 2)").unwrap())
            .collect();
        assert_eq!(batches, [2, 0]);
        // With gaps, the last event at or before the snapshot stays.
        Spi::run(
            "SELECT loom_append_event('g', s * 10, 'step', '{}') FROM generate_series(1, 3) s",
        )
        .unwrap();
        Spi::run(r#"SELECT loom_save_snapshot('g', 'wf', 25, '{}')"#).unwrap();
        assert_eq!(one::<i64>("SELECT loom_prune_events('g')"), Some(1));
        assert_eq!(
            column("SELECT sequence::text FROM loom_read_events('g')"),
            ["20", "30"]
        );
        // The event at the snapshot's sequence stays.
        assert_eq!(
            column("SELECT sequence::text FROM loom_read_events('e')"),
            ["3", "4", "5"]
        );
        // Resume still has all it needs.
        assert_eq!(
            column("SELECT sequence::text FROM loom_resume('e')"),
            ["3", "4", "5"]
        );
    }

    #[pg_test]
    fn deletes_an_execution_everywhere_in_bounded_batches() {
        log_of("gone", 7);
        log_of("kept", 2);
        Spi::run(
            r#"SELECT loom_save_snapshot('gone', 'wf', 3, '{}');
               SELECT loom_save_snapshot('gone', 'wf', 5, '{}');
               SELECT loom_save_snapshot('kept', 'wf', 1, '{}');
               SELECT loom_put_ref('main', 'gone', 5);
               SELECT loom_put_ref('other', 'kept', 1);
               INSERT INTO loom.lineage VALUES ('gone', 'kept', 1);"#,
        )
        .unwrap();
        let mut batches = Vec::new();
        loop {
            let n = one::<i64>("SELECT loom_delete_execution('gone', 3)").unwrap();
            batches.push(n);
            if n == 0 {
                break;
            }
        }
        // refs + lineage + 2 snapshots + 1 event, then events 3 a batch.
        assert_eq!(batches, [5, 3, 3, 0]);
        for table in ["events", "snapshots", "refs", "lineage"] {
            assert_eq!(
                one::<i64>(&format!(
                    "SELECT count(*) FROM loom.{table} WHERE execution_id = 'gone'"
                )),
                Some(0),
                "{table}"
            );
        }
        assert_eq!(column("SELECT * FROM loom_list_executions()"), ["kept"]);
        assert_eq!(one::<i64>("SELECT count(*) FROM loom.refs"), Some(1));
        assert_eq!(
            sqlstate_of("SELECT loom_delete_execution('kept', 0)"),
            "22023"
        );
    }

    #[pg_test]
    fn refuses_a_page_size_below_one() {
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_list_executions(NULL, 0)"),
            "22023"
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_list_refs(NULL, -1)"),
            "22023"
        );
    }

    #[pg_test]
    fn appends_are_append_only_and_batches_must_line_up() {
        Spi::run("SELECT loom_append_event('e', 1, 'k', '{}')").unwrap();
        assert_eq!(
            sqlstate_of("SELECT loom_append_event('e', 1, 'k', '{}')"),
            "23505"
        );
        assert_eq!(
            sqlstate_of("SELECT loom_append_events(ARRAY['x','y'], ARRAY[1]::bigint[], ARRAY['k','k'], ARRAY['{}','{}']::jsonb[])"),
            "22023"
        );
    }

    #[pg_test]
    fn puts_moves_deletes_and_pages_refs() {
        Spi::run(&format!(
            "SELECT loom_put_ref(name, 'exec', 1) FROM unnest({MIXED}) AS name"
        ))
        .unwrap();
        assert_eq!(column("SELECT * FROM loom_list_refs()"), sorted_mixed());
        Spi::run("SELECT loom_put_ref('B', 'other', 7)").unwrap();
        assert_eq!(
            one::<String>("SELECT execution_id || ':' || sequence FROM loom.refs WHERE name = 'B'"),
            Some("other:7".to_owned())
        );
        assert_eq!(one::<bool>("SELECT loom_delete_ref('B')"), Some(true));
        assert_eq!(one::<bool>("SELECT loom_delete_ref('B')"), Some(false));
        assert!(!column("SELECT * FROM loom_list_refs('A1')").contains(&"B".to_owned()));
    }

    #[pg_test]
    fn saves_and_loads_snapshots_in_both_formats() {
        opt_in_to_frames();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"b":1,"a":[1,2]}')"#).unwrap();
        Spi::run(
            r#"SELECT loom_save_snapshot('e', 'wf', 2, '{"turn":2,"log":"' || repeat('agent tool ', 50) || '"}', 'zstd')"#,
        )
        .unwrap();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 4, '{"turn":4}', 'none')"#).unwrap();
        assert_eq!(
            one::<i64>("SELECT sequence FROM loom_load_snapshot('e')"),
            Some(4)
        );
        assert_eq!(
            one::<i32>("SELECT (state->>'turn')::int FROM loom_load_snapshot('e', 2)"),
            Some(2)
        );
        // Exactly at_sequence, never a neighbour.
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_load_snapshot('e', 3)"),
            Some(0)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_load_snapshot('nobody')"),
            Some(0)
        );
        // The frame row: sentinel in state, frame in state_z.
        assert_eq!(
            one::<bool>(
                r#"SELECT state = '{"__loomEnc":"loom.snapshot-frame/state_z"}' AND substr(state_z, 1, 1) = '\x02'::bytea
                   FROM loom.snapshots WHERE sequence = 2"#
            ),
            Some(true)
        );
        // The view decodes every row whatever its format.
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom.snapshots_decoded WHERE state ? '__loomEnc'"),
            Some(0)
        );
    }

    #[pg_test]
    fn a_resave_flips_the_format_and_clears_the_other_column() {
        opt_in_to_frames();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"v":1}', 'zstd')"#).unwrap();
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"v":2}')"#).unwrap();
        assert_eq!(
            one::<bool>(r#"SELECT state_z IS NULL AND state = '{"v":2}' FROM loom.snapshots"#),
            Some(true)
        );
        Spi::run(r#"SELECT loom_save_snapshot('e', 'wf', 1, '{"v":3}', 'zstd')"#).unwrap();
        assert_eq!(
            one::<bool>(
                r#"SELECT state_z IS NOT NULL AND state ? '__loomEnc' FROM loom.snapshots"#
            ),
            Some(true)
        );
        assert_eq!(one::<i64>("SELECT count(*) FROM loom.snapshots"), Some(1));
        assert_eq!(
            one::<i32>("SELECT (state->>'v')::int FROM loom_load_snapshot('e')"),
            Some(3)
        );
    }

    #[pg_test]
    fn refuses_corrupt_rows_and_bad_arguments() {
        opt_in_to_frames();
        // The CHECK refuses a real state beside a frame.
        assert_eq!(
            sqlstate_of(
                r#"INSERT INTO loom.snapshots (execution_id, workflow_id, sequence, state, state_z) VALUES ('e','w',1,'{"a":1}','\x015b5d')"#
            ),
            "23514"
        );
        // A sentinel without its frame is corruption, never a state.
        Spi::run(r#"INSERT INTO loom.snapshots (execution_id, workflow_id, sequence, state) VALUES ('e','w',1,'{"__loomEnc":"loom.snapshot-frame/state_z"}')"#).unwrap();
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_load_snapshot('e')"),
            "XX001"
        );
        assert_eq!(
            sqlstate_of("SELECT loom_save_snapshot('e', 'w', 2, '{}', 'lz4')"),
            "22023"
        );
        assert_eq!(
            sqlstate_of("SELECT loom_save_snapshot('e', 'w', 2, '{nope', 'zstd')"),
            "22P02"
        );
    }

    /// Opting in to frames (ADR 0141 D5): a no-op on a fresh install.
    fn opt_in_to_frames() {
        assert_eq!(
            one::<bool>("SELECT loom_ensure_snapshot_zstd()"),
            Some(true)
        );
    }

    #[pg_test]
    fn a_fresh_install_has_the_frame_column_a_restore_copies_into() {
        assert_eq!(
            one::<bool>("SELECT has_column AND has_check FROM loom_snapshot_frame_catalog()"),
            Some(true)
        );
        Spi::run(r#"SELECT loom_save_snapshot('e', 'w', 1, '{"a":1}', 'zstd')"#).unwrap();
        assert_eq!(
            one::<i32>("SELECT (state->>'a')::int FROM loom.snapshots_decoded"),
            Some(1)
        );
    }

    #[pg_test]
    fn a_lock_wait_of_zero_is_refused_because_it_means_forever() {
        for call in [
            "SELECT loom_ensure_snapshot_zstd(0)",
            "SELECT * FROM loom_migrate_collations(0)",
            "SELECT * FROM loom_migrate_collations(-5)",
            "SELECT loom_convert_column_to_c('events', 'execution_id', 0)",
            "SELECT loom_ensure_snapshot_zstd(NULL)",
        ] {
            assert_eq!(sqlstate_of(call), "22023", "{call}");
        }
        Spi::run("SET LOCAL loom.migration_lock_timeout = '0'").unwrap();
        assert_eq!(sqlstate_of("SELECT loom_migration_lock_timeout()"), "22023");
        Spi::run("SET LOCAL loom.migration_lock_timeout = '750'").unwrap();
        assert_eq!(
            one::<i32>("SELECT loom_migration_lock_timeout()"),
            Some(750)
        );
    }

    #[pg_test]
    fn a_conversion_under_a_statement_timeout_skips_and_converts_without_one() {
        // A column that is not "C" yet, as an upgraded database has. (That
        // the skip takes no lock is checked against a real cluster, in
        // tests/install/migrations.rs: here the ALTER already holds it.)
        Spi::run(r#"ALTER TABLE loom.refs ALTER COLUMN name TYPE text COLLATE "POSIX""#).unwrap();
        Spi::run("SET LOCAL statement_timeout = '30s'").unwrap();
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations()"),
            [
                "skipped: statement_timeout",
                "already COLLATE \"C\"",
                "already COLLATE \"C\"",
                "already COLLATE \"C\""
            ]
        );
        Spi::run("SET LOCAL statement_timeout = 0").unwrap();
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations()"),
            [
                "converted",
                "already COLLATE \"C\"",
                "already COLLATE \"C\"",
                "already COLLATE \"C\""
            ]
        );
    }

    #[pg_test]
    fn converts_the_snapshot_id_column_under_its_views_keeping_their_grants() {
        // An upgraded database's snapshots.execution_id, which two views read.
        Spi::run(
            r#"SELECT loom_alter_under_snapshot_views('ALTER TABLE loom.snapshots ALTER COLUMN execution_id TYPE text COLLATE "POSIX"');
               CREATE ROLE loom_test_reader;
               GRANT SELECT ON loom.snapshots_decoded TO loom_test_reader WITH GRANT OPTION;
               SELECT loom_save_snapshot('a', 'wf', 1, '{"kept":true}', 'zstd');"#,
        )
        .unwrap();
        assert_eq!(
            one::<bool>("SELECT loom_column_is_c('snapshots', 'execution_id')"),
            Some(false)
        );
        Spi::run("SET LOCAL statement_timeout = 0").unwrap();
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations() WHERE column_name = 'loom.snapshots.execution_id'"),
            ["converted"]
        );
        assert_eq!(
            one::<bool>("SELECT loom_column_is_c('snapshots', 'execution_id')"),
            Some(true)
        );
        assert_eq!(
            one::<bool>(
                "SELECT loom_view_is_member('snapshots_decoded') AND loom_view_is_member('snapshots_stored')"
            ),
            Some(true)
        );
        assert_eq!(
            one::<bool>(
                "SELECT has_table_privilege('loom_test_reader', 'loom.snapshots_decoded', 'SELECT WITH GRANT OPTION')"
            ),
            Some(true)
        );
        assert_eq!(
            one::<bool>("SELECT (state->>'kept')::boolean FROM loom.snapshots_decoded"),
            Some(true)
        );
    }

    #[pg_test]
    fn distribution_needs_citus_and_says_so() {
        assert_eq!(
            column("SELECT distribution FROM loom_distribution()"),
            ["local"; 5]
        );
        assert_eq!(one::<bool>("SELECT loom_is_distributed()"), Some(false));
        assert_eq!(sqlstate_of("SELECT * FROM loom_distribute()"), "55000");
        assert_eq!(sqlstate_of("SELECT * FROM loom_distribute(0)"), "22023");
        assert_eq!(sqlstate_of("SELECT * FROM loom_distribute(4, 0)"), "22023");
        // Nothing changed: the triggers are still there.
        assert_eq!(
            one::<bool>("SELECT loom_executions_tracked_by_trigger()"),
            Some(true)
        );
    }

    #[pg_test]
    fn migrate_collations_is_a_lock_free_no_op_on_c_columns() {
        assert_eq!(
            column("SELECT outcome FROM loom_migrate_collations()"),
            ["already COLLATE \"C\""; 4]
        );
        let locks = one::<i64>(
            "SELECT count(*) FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.mode = 'AccessExclusiveLock' AND l.locktype = 'relation'",
        );
        assert_eq!(locks, Some(0));
    }

    #[pg_test]
    fn hostile_public_objects_are_never_picked_up() {
        opt_in_to_frames();
        append_mixed();
        Spi::run(r#"SELECT loom_save_snapshot('a_b', 'wf', 1, '{"real":true}')"#).unwrap();
        Spi::run(
            r#"
            CREATE SCHEMA hostile;
            CREATE TABLE hostile.events (execution_id text, sequence bigint);
            INSERT INTO hostile.events VALUES ('planted', 1);
            CREATE TABLE hostile.snapshots (execution_id text);
            CREATE FUNCTION hostile.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
            CREATE OPERATOR hostile.= (LEFTARG = text, RIGHTARG = text, FUNCTION = hostile.always);
            CREATE OPERATOR hostile.> (LEFTARG = text, RIGHTARG = text, FUNCTION = hostile.always);
            CREATE FUNCTION hostile.loom_snapshot_state(bytea) RETURNS jsonb LANGUAGE sql AS $$SELECT '{"hijacked":true}'::jsonb$$;
            SET search_path = hostile, public, pg_catalog;
            "#,
        )
        .unwrap();
        assert_eq!(
            column("SELECT * FROM public.loom_list_executions()"),
            sorted_mixed()
        );
        assert_eq!(
            one::<bool>("SELECT (state->>'real')::boolean FROM public.loom_load_snapshot('a_b')"),
            Some(true)
        );
        Spi::run(r#"SELECT public.loom_save_snapshot('a_b', 'wf', 2, '{"framed":true}', 'zstd')"#)
            .unwrap();
        assert_eq!(
            one::<bool>("SELECT (state->>'framed')::boolean FROM public.loom_load_snapshot('a_b')"),
            Some(true)
        );
        assert_eq!(
            one::<bool>("SELECT public.loom_delete_ref('nothing')"),
            Some(false)
        );
        // The C append functions and trigger pin no search_path: their
        // statements name nothing it could resolve.
        Spi::run(
            r#"
            CREATE FUNCTION hostile.unnest(text[]) RETURNS SETOF text LANGUAGE sql AS $$SELECT 'planted'$$;
            CREATE FUNCTION hostile.loom_track_appended(text[]) RETURNS void LANGUAGE sql AS 'SELECT 1/0';
            CREATE TABLE hostile.executions (execution_id text);
            SELECT public.loom_append_events(ARRAY['h1', 'h2'], ARRAY[1, 1]::bigint[],
                                             ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[]);
            SELECT public.loom_append_event('h3', 1, 's', '{}');
            SET search_path = pg_catalog, public;
            "#,
        )
        .unwrap();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom.events WHERE execution_id IN ('h1', 'h2', 'h3')"),
            Some(3)
        );
        assert_eq!(
            one::<i64>(
                "SELECT count(*) FROM loom.executions WHERE execution_id IN ('h1', 'h2', 'h3')"
            ),
            Some(3)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM hostile.executions"),
            Some(0)
        );
    }

    fn needing_action() -> Vec<String> {
        column("SELECT item || ': ' || statement FROM loom_status() WHERE needs_action")
    }

    #[pg_test]
    fn status_names_what_needs_action_and_the_statement_for_it() {
        append_mixed();
        // A fresh install needs nothing.
        assert_eq!(needing_action(), Vec::<String>::new());
        // The index is checked by loom_verify_executions, not here: status
        // reads catalogs and statistics alone.
        assert_eq!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'executions index'")
                .as_deref(),
            Some("not checked here: loom status --verify (loom_verify_executions) checks it in batches")
        );
        assert_eq!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'collation of loom.events.execution_id'")
                .as_deref(),
            Some("C")
        );
        // A table never analyzed has no estimate (reltuples -1), and says
        // so; once analyzed, the estimate. (Set by hand: another test's
        // ANALYZE, an in-place update, outlives its rollback.)
        Spi::run("UPDATE pg_class SET reltuples = -1 WHERE oid IN ('loom.refs'::regclass, 'loom.snapshots'::regclass)").unwrap();
        assert!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'table loom.refs'")
                .unwrap()
                .starts_with("rows not estimated yet (never vacuumed or analyzed), ")
        );
        assert_eq!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'snapshots as JSONB'")
                .as_deref(),
            Some("rows not estimated yet (never vacuumed or analyzed)")
        );
        Spi::run("ANALYZE loom.events").unwrap();
        assert!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'table loom.events'")
                .unwrap()
                .starts_with("~10 rows, ")
        );
        // Snapshots by format, estimated from state_z's statistics.
        Spi::run(
            "SELECT loom_save_snapshot('s' || i, 'w', i, jsonb_build_object('n', i)::text, CASE WHEN i <= 3 THEN 'zstd' ELSE 'none' END)
             FROM generate_series(1, 10) i;
             ANALYZE loom.snapshots;",
        )
        .unwrap();
        assert!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'snapshots as JSONB'")
                .unwrap()
                .starts_with("~7 rows, ~")
        );
        assert!(one::<String>(
            "SELECT value FROM loom_status() WHERE item = 'snapshots as frames'"
        )
        .unwrap()
        .starts_with("~3 rows, ~"));
        // Drift both ways: status does not see it, the verification does,
        // and the repair mends it; the index 0.7.0 drops, with its fix.
        Spi::run(
            "INSERT INTO loom.executions VALUES ('ghost');
             ALTER TABLE loom.events DISABLE TRIGGER USER;
             INSERT INTO loom.events VALUES ('unseen', 1, 'step', '{}');
             ALTER TABLE loom.events ENABLE TRIGGER USER;
             CREATE INDEX idx_events_exec ON loom.events (execution_id);",
        )
        .unwrap();
        assert_eq!(
            needing_action(),
            ["loom.idx_events_exec (unused since 0.4.0): SELECT public.loom_drop_events_id_index(2000);"]
        );
        Spi::run("SELECT loom_drop_events_id_index();").unwrap();
        assert_eq!(needing_action(), Vec::<String>::new());
        assert_eq!(
            one::<String>(
                "SELECT format('%s %s %s', sum(missing), sum(orphaned), bool_and(done)) FROM loom_verify_executions()"
            )
            .as_deref(),
            Some("1 1 t")
        );
    }

    /// Walks loom_verify_executions or loom_repair_executions from the
    /// first id, `max_ids` a batch, and sums what each batch reports.
    fn walk_index(function: &str, max_ids: i32) -> (i64, i64, i64, i64) {
        let (mut checked, mut first, mut second, mut batches) = (0, 0, 0, 0);
        let mut after: Option<String> = None;
        loop {
            let sql = format!(
                "SELECT ARRAY[checked, {}], next_after, done FROM {function}({}, {max_ids})",
                if function == "loom_repair_executions" {
                    "added, removed"
                } else {
                    "missing, orphaned"
                },
                after
                    .as_deref()
                    .map_or("NULL".to_owned(), pgrx::spi::quote_literal)
            );
            let (counts, next, done) = Spi::get_three::<Vec<i64>, String, bool>(&sql).unwrap();
            let counts = counts.unwrap();
            checked += counts[0];
            first += counts[1];
            second += counts[2];
            batches += 1;
            if done.unwrap() {
                return (checked, first, second, batches);
            }
            assert!(next > after, "the cursor moves on");
            after = next;
        }
    }

    #[pg_test]
    fn the_index_is_verified_and_repaired_in_batches_of_either_side() {
        // 30 ids with events, in code point order across the batches; the
        // index loses 5 of them (every sixth) and gains 4 ids without
        // events, 2 of them after every id of the log.
        Spi::run(
            "SELECT loom_append_event(format('e%s', i), 1, 'step', '{}') FROM generate_series(10, 39) i;
             DELETE FROM loom.executions WHERE execution_id IN ('e10', 'e16', 'e22', 'e28', 'e34');
             INSERT INTO loom.executions VALUES ('e155'), ('e305'), ('zz1'), ('zz2');",
        )
        .unwrap();
        for max_ids in [1, 3, 7, 1000] {
            let (checked, missing, orphaned, batches) =
                walk_index("loom_verify_executions", max_ids);
            assert_eq!(
                (checked, missing, orphaned),
                (34, 5, 4),
                "batches of {max_ids}"
            );
            assert!(
                batches >= 34 / i64::from(max_ids),
                "batches of {max_ids}: {batches}"
            );
        }
        // A batch never goes past the max_ids-th id of either side.
        assert_eq!(
            Spi::get_two::<i64, String>(
                "SELECT checked, next_after FROM loom_verify_executions(NULL, 3)"
            )
            .unwrap(),
            (Some(3), Some("e12".to_owned()))
        );
        let (checked, added, removed, _) = walk_index("loom_repair_executions", 4);
        assert_eq!((checked, added, removed), (34, 5, 4));
        assert_eq!(walk_index("loom_verify_executions", 1000).1, 0);
        assert_eq!(walk_index("loom_verify_executions", 1000).2, 0);
        assert_eq!(one::<i64>("SELECT loom_rebuild_executions()"), Some(0));
        // An empty log and index: one batch, done, nothing checked.
        Spi::run("DELETE FROM loom.events").unwrap();
        assert_eq!(walk_index("loom_verify_executions", 10), (0, 0, 0, 1));
    }

    #[pg_test]
    fn the_trigger_tracks_small_statements_directly_and_large_ones_set_based() {
        // Small: ids out of order and repeated, each tracked once.
        Spi::run(
            "SELECT loom_append_events(ARRAY['z', 'a', 'z', 'm', 'a'], ARRAY[1, 1, 2, 1, 2]::bigint[],
                                       array_fill('s'::text, ARRAY[5]), array_fill('{}'::jsonb, ARRAY[5]))",
        )
        .unwrap();
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            ["a", "m", "z"]
        );
        Spi::run("DELETE FROM loom.events WHERE sequence = 1").unwrap();
        assert_eq!(column("SELECT * FROM loom_list_executions()"), ["a", "z"]);
        // Large: more rows than executions_index reads directly (10,000),
        // inserted and deleted in one statement each.
        Spi::run(
            "INSERT INTO loom.events (execution_id, sequence, kind, payload)
             SELECT 'big' || (i % 2500), i, 'step', '{}' FROM generate_series(1, 12000) i",
        )
        .unwrap();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom.executions"),
            Some(2502)
        );
        assert_eq!(one::<i64>("SELECT loom_rebuild_executions()"), Some(0));
        Spi::run("DELETE FROM loom.events WHERE execution_id NOT IN ('big7', 'z')").unwrap();
        assert_eq!(
            column("SELECT * FROM loom_list_executions()"),
            ["big7", "z"]
        );
        assert_eq!(one::<i64>("SELECT loom_rebuild_executions()"), Some(0));
    }

    #[pg_test]
    fn only_the_index_keepers_are_security_definer_and_every_one_pins_its_search_path() {
        // What keeps loom.executions writes it for any writer of
        // loom.events: the trigger reads only its statement's transition
        // table, and the two functions add only ids that have events and
        // remove only ids that have none; loom_lock_idle_executions locks
        // executions' stripes and rows and reads their last events.
        assert_eq!(
            column("SELECT proname::text FROM pg_proc WHERE proname LIKE 'loom\\_%' AND prosecdef ORDER BY 1"),
            [
                "loom_events_track_executions",
                "loom_lock_idle_executions",
                "loom_track_appended",
                "loom_track_emptied"
            ]
        );
        let unpinned = column(
            "SELECT proname::text FROM pg_proc
             WHERE proname LIKE 'loom\\_%' AND prolang IN (SELECT oid FROM pg_language WHERE lanname IN ('sql', 'plpgsql'))
               AND NOT coalesce(proconfig::text[] @> ARRAY['search_path=pg_catalog, pg_temp'], false)
             ORDER BY 1",
        );
        // The two inlinable SQL functions qualify every name instead, and
        // so does the procedure that commits between its batches (a SET
        // clause forbids transaction control).
        assert_eq!(
            unpinned,
            [
                "loom_snapshot_frame",
                "loom_snapshot_get",
                "loom_sweep_idle_executions"
            ]
        );
    }
}

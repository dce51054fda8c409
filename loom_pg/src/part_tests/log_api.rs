//! The pg_tests of `loom-core/sql/log_api.sql`: the event log and refs: appends, reads, pages of executions in code point order, the executions index its trigger keeps, pruning and deletes.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{
        append_mixed, column, log_of, one, sorted_mixed, sqlstate_of, MIXED,
    };
    use pgrx::prelude::*;

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
}

//! Retention by age, in the server: `sql/retention.sql` defines
//! `loom_execution_activity`, `loom_delete_idle_executions` and the
//! procedure `loom_sweep_idle_executions`. This module holds their
//! pg_tests (the procedure commits, so it is tested from a client, in
//! `tests/server/retention.rs`, with pg_cron where it is installed).

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::sqlstate_of;
    use pgrx::prelude::*;

    fn run(sql: &str) {
        Spi::run(sql).unwrap();
    }

    fn count(query: &str) -> i64 {
        Spi::get_one::<i64>(query).unwrap().unwrap()
    }

    /// `events` events of `id`, written `age_days` days ago.
    fn log_of(id: &str, events: i64, age_days: i64) {
        run(&format!(
            "SELECT loom_append_event('{id}', s, 'step', '{{}}') FROM generate_series(1, {events}) s;
             UPDATE loom.events SET created_at = now() - interval '{age_days} days' WHERE execution_id = '{id}';"
        ));
    }

    /// One batch: (examined, executions deleted, rows deleted, next_after, done).
    fn batch(
        idle_for: &str,
        after: Option<&str>,
        max_rows: i32,
    ) -> (i64, i64, i64, Option<String>, bool) {
        let after = after.map_or("NULL".to_owned(), |a| format!("'{a}'"));
        Spi::connect(|client| {
            let row = client
                .select(
                    &format!(
                        "SELECT * FROM loom_delete_idle_executions('{idle_for}', {after}, {max_rows})"
                    ),
                    None,
                    &[],
                )
                .unwrap()
                .first();
            (
                row.get::<i64>(1).unwrap().unwrap(),
                row.get::<i64>(2).unwrap().unwrap(),
                row.get::<i64>(3).unwrap().unwrap(),
                row.get::<String>(4).unwrap(),
                row.get::<bool>(5).unwrap().unwrap(),
            )
        })
    }

    fn rows_of(id: &str) -> i64 {
        count(&format!(
            "SELECT (SELECT count(*) FROM loom.events WHERE execution_id = '{id}')
                  + (SELECT count(*) FROM loom.snapshots WHERE execution_id = '{id}')
                  + (SELECT count(*) FROM loom.refs WHERE execution_id = '{id}')
                  + (SELECT count(*) FROM loom.lineage WHERE execution_id = '{id}')
                  + (SELECT count(*) FROM loom.executions WHERE execution_id = '{id}')"
        ))
    }

    #[pg_test]
    fn reads_each_executions_last_event() {
        log_of("a", 3, 40);
        log_of("b", 1, 0);
        let (sequence, older): (i64, bool) = Spi::connect(|client| {
            let row = client
                .select(
                    "SELECT last_sequence, last_event_at < now() - interval '39 days'
                     FROM loom_execution_activity() WHERE execution_id = 'a'",
                    None,
                    &[],
                )
                .unwrap()
                .first();
            (
                row.get::<i64>(1).unwrap().unwrap(),
                row.get::<bool>(2).unwrap().unwrap(),
            )
        });
        assert_eq!((sequence, older), (3, true));
        assert_eq!(
            count("SELECT count(*) FROM loom_execution_activity('a')"),
            1
        );
    }

    #[pg_test]
    fn deletes_only_the_idle_executions_with_their_rows() {
        log_of("old", 4, 40);
        log_of("recent", 2, 1);
        run(r#"SELECT loom_save_snapshot('old', 'wf', 2, '{}');
               SELECT loom_save_snapshot('recent', 'wf', 1, '{}');
               SELECT loom_put_ref('main', 'old', 4);
               SELECT loom_put_ref('other', 'recent', 2);
               INSERT INTO loom.lineage VALUES ('old', 'recent', 1);"#);
        // 4 events, a snapshot, a ref and a lineage row.
        assert_eq!(
            batch("30 days", None, 100),
            (2, 1, 7, Some("recent".into()), true)
        );
        assert_eq!(rows_of("old"), 0);
        // Its 2 events, snapshot, ref and row in loom.executions.
        assert_eq!(rows_of("recent"), 2 + 1 + 1 + 1);
        // Nothing is idle for more than 2 days now; everything for 0.
        assert_eq!(batch("2 days", None, 100).1, 0);
        assert_eq!(batch("0 seconds", None, 100).1, 1);
        assert_eq!(count("SELECT count(*) FROM loom.executions"), 0);
    }

    #[pg_test]
    fn a_sweep_deletes_each_execution_whole_within_one_batch() {
        log_of("a", 1, 40);
        log_of("big", 25, 40);
        log_of("c", 1, 0);
        let mut after: Option<String> = None;
        let mut batches = Vec::new();
        loop {
            let b = batch("30 days", after.as_deref(), 10);
            batches.push((b.1, b.2));
            if b.4 {
                break;
            }
            after = b.3;
        }
        // a; then big, larger than a batch, alone and whole (never split
        // over two commits an append could land between); c is kept.
        assert_eq!(batches, [(1, 1), (1, 25), (0, 0)]);
        assert_eq!(rows_of("big"), 0);
        assert_eq!(rows_of("c"), 2);
    }

    #[pg_test]
    fn ids_without_events_do_not_end_a_sweep_early() {
        // loom.executions out of step: ids with no events, sorting first.
        run("INSERT INTO loom.executions SELECT 'a-' || i FROM generate_series(10, 29) i");
        log_of("z-idle", 2, 40);
        let first = batch("30 days", None, 10);
        assert_eq!(first, (10, 0, 0, Some("a-19".into()), false));
        let mut after = first.3;
        let mut deleted = 0;
        loop {
            let b = batch("30 days", after.as_deref(), 10);
            deleted += b.1;
            if b.4 {
                break;
            }
            after = b.3;
        }
        assert_eq!(deleted, 1);
        assert_eq!(rows_of("z-idle"), 0);
    }

    /// Review of issue 26: a batch that stopped before an execution read
    /// its cursor from loom.executions after its own deletes, so when all
    /// it paged before the stop was deleted the cursor came back NULL and
    /// the sweep started over from the first id (quadratic). The cursor
    /// only moves on, and each execution is examined once.
    #[pg_test]
    fn the_cursor_only_moves_on_when_a_batch_stops_before_an_execution() {
        log_of("e001", 8, 40);
        for i in 2..=40 {
            log_of(&format!("e{i:03}"), 2, 40);
        }
        let (mut after, mut batches, mut deleted, mut examined) = (None::<String>, 0, 0, 0);
        loop {
            let b = batch("30 days", after.as_deref(), 2);
            batches += 1;
            deleted += b.1;
            examined += b.0;
            assert!(
                b.3 > after || b.4,
                "batch {batches}: the cursor moved from {after:?} to {:?}",
                b.3
            );
            if b.4 {
                break;
            }
            after = b.3;
        }
        assert_eq!((deleted, examined), (40, 40));
        assert!(batches <= 42, "{batches} batches");
        assert_eq!(count("SELECT count(*) FROM loom.events"), 0);
    }

    /// Review of issue 26: the lock asked of a page counted and locked
    /// every idle execution on it, whatever the batch could take. It stops
    /// at the first that does not fit, counting no further.
    #[pg_test]
    fn the_page_lock_stops_at_the_first_execution_that_does_not_fit() {
        log_of("a", 3, 40);
        log_of("b", 5, 40);
        log_of("c", 1, 40);
        let taken = |max_rows: i32, ids: &str| -> Vec<String> {
            Spi::connect(|client| {
                client
                    .select(
                        &format!(
                            "SELECT execution_id || ':' || rows_held || ':' || taken
                             FROM loom_lock_idle_executions(
                                 {ids},
                                 ARRAY(SELECT max(sequence) FROM loom.events GROUP BY execution_id ORDER BY execution_id),
                                 ARRAY(SELECT max(created_at) FROM loom.events GROUP BY execution_id ORDER BY execution_id),
                                 {max_rows})"
                        ),
                        None,
                        &[],
                    )
                    .unwrap()
                    .map(|row| row.get::<String>(1).unwrap().unwrap())
                    .collect()
            })
        };
        // b (5 rows) does not fit what a leaves of 6, counted to 4 only.
        let ids = "ARRAY['a', 'b', 'c']";
        assert_eq!(taken(6, ids), ["a:3:true", "b:4:false"]);
        // Alone, one larger than the batch goes; nothing after it.
        assert_eq!(taken(2, ids), ["a:3:true"]);
        assert_eq!(taken(100, ids), ["a:3:true", "b:5:true", "c:1:true"]);
        // Ids in another collation than the database's (PL/pgSQL takes
        // its arguments'): the same walk.
        assert_eq!(
            taken(100, r#"ARRAY['a' COLLATE "C", 'b', 'c']"#),
            ["a:3:true", "b:5:true", "c:1:true"]
        );
    }

    /// Second review of issue 26: PL/pgSQL gives its variables the
    /// collation of the call's arguments, so a cursor or ids in another
    /// collation than "C" or the database's met loom's "C" columns and
    /// failed ("could not determine which collation to use"); and the
    /// page read from loom.executions ("C") met an unconverted log's
    /// column in "C", which its index could not serve (a scan of the log
    /// an id). Both sweep, in the database's collation.
    #[pg_test]
    fn a_sweep_takes_a_cursor_in_any_collation_and_an_unconverted_log() {
        run(r#"ALTER TABLE loom.events ALTER COLUMN execution_id TYPE text COLLATE "POSIX""#);
        log_of("a", 2, 40);
        log_of("b", 2, 40);
        log_of("c", 1, 0);
        assert_eq!(
            count(
                r#"SELECT executions_deleted FROM loom_delete_idle_executions('30 days', '' COLLATE "POSIX", 10)"#
            ),
            2
        );
        assert_eq!(
            count(
                r#"SELECT count(*) FROM loom_lock_idle_executions(ARRAY['c' COLLATE "POSIX"], ARRAY[1::bigint], ARRAY[now() - interval '1 day'], 10)"#
            ),
            0
        );
        assert_eq!(count("SELECT count(*) FROM loom.events"), 1);
    }

    #[pg_test]
    fn refuses_a_negative_or_missing_interval_and_an_empty_batch() {
        log_of("a", 1, 40);
        for sql in [
            "SELECT * FROM loom_delete_idle_executions('-1 day')",
            "SELECT * FROM loom_delete_idle_executions(NULL)",
            "SELECT * FROM loom_delete_idle_executions('1 day', NULL, 0)",
        ] {
            assert_eq!(sqlstate_of(sql), "22023", "{sql}");
        }
        assert_eq!(count("SELECT count(*) FROM loom.events"), 1);
    }
}

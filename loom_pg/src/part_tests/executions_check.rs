//! The pg_tests of `loom-core/sql/executions_check.sql`: verifying and repairing the executions index in batches.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::one;
    use pgrx::prelude::*;

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
}

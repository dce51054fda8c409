//! The pg_tests of `loom-core/sql/status.sql`: `loom_status()`, what needs action and the statement for it.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{append_mixed, column, one};
    use pgrx::prelude::*;

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
}

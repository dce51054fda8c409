//! The pg_tests of `loom-core/sql/claims.sql`: schedules, claims, fencing
//! tokens, renewals, completions, and what retention and status make of
//! them. A pg_test is one statement, whose clock stands still: a lease
//! lapses here by moving its end back by hand.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{column, one, sqlstate_of};
    use pgrx::prelude::*;

    fn claim(worker: &str, max: i32) -> Vec<String> {
        column(&format!(
            "SELECT execution_id || ':' || fence FROM loom_claim('q', '{worker}', interval '30 seconds', {max}) ORDER BY 1"
        ))
    }

    #[pg_test]
    fn claims_take_due_executions_oldest_first_and_bump_the_fence() {
        Spi::run(
            "SELECT loom_schedule('late', now() + interval '1 hour', 'q');
             SELECT loom_schedule('b', now() - interval '1 minute', 'q');
             SELECT loom_schedule('a', now() - interval '2 minutes', 'q');
             SELECT loom_schedule('other-queue', now() - interval '3 minutes', 'elsewhere');",
        )
        .unwrap();
        // Oldest due first, never one due later, never another queue's.
        assert_eq!(claim("w1", 1), ["a:1"]);
        assert_eq!(claim("w1", 10), ["b:1"]);
        // Held: not claimable again while the lease lasts.
        assert_eq!(claim("w2", 10), Vec::<String>::new());
        // The lease lapses: another worker claims it, with a newer token.
        Spi::run(
            "UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'a'",
        )
        .unwrap();
        assert_eq!(
            column("SELECT execution_id || ':' || fence || ':' || lapsed_holder FROM loom_claim('q', 'w2', interval '30 seconds', 10)"),
            ["a:2:w1"]
        );
        // The first worker's token is stale: every fenced call says LM001.
        assert_eq!(sqlstate_of("SELECT loom_check_fence('a', 1)"), "LM001");
        assert_eq!(
            sqlstate_of("SELECT loom_renew('a', 1, interval '30 seconds')"),
            "LM001"
        );
        assert_eq!(sqlstate_of("SELECT loom_complete('a', 1)"), "LM001");
        // A token never issued, and an execution never claimed, too.
        assert_eq!(sqlstate_of("SELECT loom_check_fence('a', 3)"), "LM001");
        assert_eq!(sqlstate_of("SELECT loom_check_fence('nobody', 1)"), "LM001");
        // The holder's own calls pass.
        Spi::run("SELECT loom_check_fence('a', 2)").unwrap();
        assert!(one::<bool>(
            "SELECT loom_renew('a', 2, interval '1 hour') > now() + interval '59 minutes'"
        )
        .unwrap());
        // Completed without a next time: not due until scheduled again,
        // and the token is spent.
        assert_eq!(
            one::<pgrx::datum::TimestampWithTimeZone>("SELECT loom_complete('a', 2)"),
            None
        );
        assert_eq!(sqlstate_of("SELECT loom_complete('a', 2)"), "LM001");
        assert_eq!(claim("w1", 10), Vec::<String>::new());
        // Scheduled again: the next claim's token is higher still.
        Spi::run("SELECT loom_schedule('a', NULL, 'q')").unwrap();
        assert_eq!(claim("w1", 10), ["a:3"]);
    }

    #[pg_test]
    fn a_wake_up_while_held_waits_for_the_holder_and_timers_run_at_their_time() {
        Spi::run("SELECT loom_schedule('x', NULL, 'q')").unwrap();
        assert_eq!(claim("w1", 1), ["x:1"]);
        // A signal while held: kept, the lease untouched.
        assert!(one::<bool>("SELECT loom_schedule('x', now() - interval '1 minute', 'q') = now() - interval '1 minute'").unwrap());
        assert_eq!(claim("w2", 1), Vec::<String>::new());
        // The holder completes asking for a run in an hour: the wake-up,
        // earlier, wins.
        assert!(one::<bool>(
            "SELECT loom_complete('x', 1, now() + interval '1 hour') = now() - interval '1 minute'"
        )
        .unwrap());
        assert_eq!(claim("w2", 1), ["x:2"]);
        // A timer: completed with a next time, due then and not before.
        assert!(one::<bool>("SELECT loom_complete('x', 2, now() + interval '2 seconds') = now() + interval '2 seconds'").unwrap());
        assert_eq!(claim("w1", 1), Vec::<String>::new());
        // A later schedule never postpones an earlier one.
        assert!(one::<bool>("SELECT loom_schedule('x', now() + interval '1 day', 'q') = now() + interval '2 seconds'").unwrap());
    }

    #[pg_test]
    fn bad_arguments_are_refused_with_22023() {
        for query in [
            "SELECT loom_schedule('', NULL, 'q')",
            "SELECT loom_schedule('x', 'infinity', 'q')",
            "SELECT loom_schedule('x', NULL, '')",
            "SELECT * FROM loom_claim('q', 'w', interval '0 seconds', 1)",
            "SELECT * FROM loom_claim('q', 'w', interval '2 days', 1)",
            "SELECT * FROM loom_claim('q', 'w', interval '30 seconds', 0)",
            "SELECT * FROM loom_claim('q', 'w', interval '30 seconds', 1001)",
            "SELECT * FROM loom_claim('q', '', interval '30 seconds', 1)",
            "SELECT * FROM loom_claim(NULL, 'w', interval '30 seconds', 1)",
            "SELECT loom_renew('x', NULL, interval '30 seconds')",
            "SELECT loom_complete('x', 1, 'infinity')",
            "SELECT loom_check_fence(NULL, 1)",
        ] {
            assert_eq!(sqlstate_of(query), "22023", "{query}");
        }
    }

    #[pg_test]
    fn retention_never_deletes_a_claimed_or_scheduled_execution_and_status_counts_them() {
        Spi::run(
            "SELECT loom_append_event(id, 1, 'started', '{}') FROM unnest(ARRAY['held', 'timer', 'done', 'plain']) id;
             UPDATE loom.events SET created_at = now() - interval '2 days';
             SELECT loom_schedule('held', NULL, 'q');
             SELECT loom_schedule('timer', now() + interval '1 hour', 'q');
             SELECT loom_schedule('done', NULL, 'q');
             SELECT loom_schedule('lapsed', NULL, 'q');",
        )
        .unwrap();
        assert_eq!(claim("w", 3), ["done:1", "held:1", "lapsed:1"]);
        Spi::run(
            "SELECT loom_complete('done', 1);
             UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'lapsed';
             SELECT loom_schedule('due', NULL, 'q');",
        )
        .unwrap();
        assert_eq!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'claims'").as_deref(),
            Some("1 due, 1 claimed, 1 lapsed, 1 scheduled")
        );
        Spi::run("SELECT * FROM loom_delete_idle_executions(interval '1 day')").unwrap();
        // The finished claim and the plain execution went; the held and
        // the scheduled one stayed, with their claims.
        assert_eq!(
            column("SELECT DISTINCT execution_id FROM loom.events ORDER BY 1"),
            ["held", "timer"]
        );
        assert_eq!(
            column("SELECT execution_id FROM loom.claims ORDER BY 1"),
            ["due", "held", "lapsed", "timer"]
        );
    }
}

//! The pg_tests of `loom-core/sql/claims.sql`: schedules, claims, fencing
//! tokens, renewals, completions, and what retention and status make of
//! them. A pg_test is one statement, whose clock stands still: a lease
//! lapses here by moving its end back by hand. Tokens come from one
//! sequence, which a rolled-back test does not reset: they are compared,
//! never spelled out.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{column, one, sqlstate_of};
    use pgrx::prelude::*;

    /// The executions `worker` claims, in id order, with their tokens.
    fn claim(worker: &str, max: i32) -> Vec<(String, i64)> {
        Spi::connect(|client| {
            client
                .select(
                    &format!("SELECT execution_id, fence FROM loom_claim('q', '{worker}', interval '30 seconds', {max}) ORDER BY 1"),
                    None,
                    &[],
                )
                .unwrap()
                .map(|row| (row.get::<String>(1).unwrap().unwrap(), row.get::<i64>(2).unwrap().unwrap()))
                .collect()
        })
    }

    fn ids(claimed: &[(String, i64)]) -> Vec<&str> {
        claimed.iter().map(|(id, _)| id.as_str()).collect()
    }

    #[pg_test]
    fn claims_take_due_executions_oldest_first_and_each_a_newer_token() {
        Spi::run(
            "SELECT loom_schedule('late', now() + interval '1 hour', 'q');
             SELECT loom_schedule('b', now() - interval '1 minute', 'q');
             SELECT loom_schedule('a', now() - interval '2 minutes', 'q');
             SELECT loom_schedule('other-queue', now() - interval '3 minutes', 'elsewhere');",
        )
        .unwrap();
        // Oldest due first, never one due later, never another queue's.
        let first = claim("w1", 1);
        assert_eq!(ids(&first), ["a"]);
        let second = claim("w1", 10);
        assert_eq!(ids(&second), ["b"]);
        assert!(second[0].1 > first[0].1);
        // Held: not claimable again while the lease lasts.
        assert!(claim("w2", 10).is_empty());
        // The lease lapses: another worker claims it, with a newer token.
        Spi::run(
            "UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'a'",
        )
        .unwrap();
        let (new, lapsed) = Spi::get_two::<i64, String>(
            "SELECT fence, lapsed_holder FROM loom_claim('q', 'w2', interval '30 seconds', 10)",
        )
        .unwrap();
        let (old, new) = (first[0].1, new.unwrap());
        assert!(new > old);
        assert_eq!(lapsed.as_deref(), Some("w1"));
        // The first worker's token is stale: every fenced call says LM001.
        for call in [
            "loom_check_fence('a', {old})",
            "loom_renew('a', {old}, interval '30 seconds')",
            "loom_complete('a', {old})",
        ] {
            assert_eq!(
                sqlstate_of(&format!(
                    "SELECT {}",
                    call.replace("{old}", &old.to_string())
                )),
                "LM001",
                "{call}"
            );
        }
        // A token never issued, and an execution never claimed, too.
        assert_eq!(
            sqlstate_of(&format!("SELECT loom_check_fence('a', {})", new + 1000)),
            "LM001"
        );
        assert_eq!(sqlstate_of("SELECT loom_check_fence('nobody', 1)"), "LM001");
        // The holder's own calls pass; the check limits how long its
        // transaction may idle to what is left of the lease.
        Spi::run(&format!("SELECT loom_check_fence('a', {new})")).unwrap();
        assert_eq!(
            one::<String>("SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'")
                .map(|ms| ms.parse::<i64>().unwrap())
                .map(|ms| (1000..=30_000).contains(&ms)),
            Some(true)
        );
        assert!(one::<bool>(&format!(
            "SELECT loom_renew('a', {new}, interval '1 hour') > now() + interval '59 minutes'"
        ))
        .unwrap());
        // Completed without a next time: not due until scheduled again,
        // and the token is spent, the fence check's too.
        assert_eq!(
            one::<pgrx::datum::TimestampWithTimeZone>(&format!("SELECT loom_complete('a', {new})")),
            None
        );
        assert_eq!(
            sqlstate_of(&format!("SELECT loom_complete('a', {new})")),
            "LM001"
        );
        assert_eq!(
            sqlstate_of(&format!("SELECT loom_check_fence('a', {new})")),
            "LM001"
        );
        assert!(claim("w1", 10).is_empty());
        // Scheduled again (its queue kept): the next claim's token is
        // higher still.
        Spi::run("SELECT loom_schedule('a')").unwrap();
        let again = claim("w1", 10);
        assert_eq!(ids(&again), ["a"]);
        assert!(again[0].1 > new);
    }

    #[pg_test]
    fn a_wake_up_while_held_is_never_lost_and_timers_run_at_their_time() {
        Spi::run("SELECT loom_schedule('x', NULL, 'q')").unwrap();
        let t1 = claim("w1", 1)[0].1;
        // A signal while held: kept, the lease untouched.
        assert!(one::<bool>(
            "SELECT loom_schedule('x', now() - interval '1 minute') = now() - interval '1 minute'"
        )
        .unwrap());
        assert!(claim("w2", 1).is_empty());
        // The holder completes asking for a run in an hour: the wake-up,
        // earlier, wins.
        assert!(one::<bool>(&format!(
            "SELECT loom_complete('x', {t1}, now() + interval '1 hour') = now() - interval '1 minute'"
        ))
        .unwrap());
        let t2 = claim("w2", 1)[0].1;
        // A signal while the lease has lapsed, then the holder completes
        // before anyone takes it over: the signal still runs.
        Spi::run(
            "UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'x'",
        )
        .unwrap();
        Spi::run("SELECT loom_schedule('x')").unwrap();
        assert!(one::<bool>(&format!("SELECT loom_complete('x', {t2}) IS NOT NULL")).unwrap());
        let t3 = claim("w1", 1)[0].1;
        // A timer: completed with a next time, due then and not before.
        assert!(one::<bool>(&format!("SELECT loom_complete('x', {t3}, now() + interval '2 seconds') = now() + interval '2 seconds'")).unwrap());
        assert!(claim("w1", 1).is_empty());
        // A later schedule never postpones an earlier one.
        assert!(one::<bool>(
            "SELECT loom_schedule('x', now() + interval '1 day') = now() + interval '2 seconds'"
        )
        .unwrap());
        // A worker taking a lapsed lease over runs the wake-up kept under
        // it: claimed, the wake-up is spent.
        Spi::run(
            "UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'x'",
        )
        .unwrap();
        let t4 = claim("w1", 1)[0].1;
        Spi::run("SELECT loom_schedule('x')").unwrap();
        Spi::run(
            "UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'x'",
        )
        .unwrap();
        let t5 = claim("w2", 1)[0].1;
        assert!(t5 > t4);
        assert_eq!(
            one::<bool>("SELECT wake_at IS NULL FROM loom.claims WHERE execution_id = 'x'"),
            Some(true)
        );
        // A later one (a timer set while the lapsed holder held it) is kept
        // through the takeover, and is when it runs next.
        Spi::run("SELECT loom_schedule('x', now() + interval '1 hour')").unwrap();
        Spi::run(
            "UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'x'",
        )
        .unwrap();
        let t6 = claim("w1", 1)[0].1;
        assert!(t6 > t5);
        assert!(one::<bool>(&format!(
            "SELECT loom_complete('x', {t6}) = now() + interval '1 hour'"
        ))
        .unwrap());
        // Scheduled from another queue's worker, or without a queue, it
        // stays in its own.
        Spi::run("SELECT loom_schedule('x', NULL, 'elsewhere')").unwrap();
        assert_eq!(
            one::<String>("SELECT queue FROM loom.claims WHERE execution_id = 'x'").as_deref(),
            Some("q")
        );
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
            "SELECT loom_append_event(id, 1, 'started', '{}')
             FROM unnest(ARRAY['held', 'timer', 'done', 'plain', 'lapsed', 'due']) id;
             UPDATE loom.events SET created_at = now() - interval '2 days';
             SELECT loom_schedule('held', NULL, 'q');
             SELECT loom_schedule('timer', now() + interval '1 hour', 'q');
             SELECT loom_schedule('done', NULL, 'q');
             SELECT loom_schedule('lapsed', NULL, 'q');",
        )
        .unwrap();
        let claimed = claim("w", 3);
        assert_eq!(ids(&claimed), ["done", "held", "lapsed"]);
        Spi::run(&format!(
            "SELECT loom_complete('done', {});
             UPDATE loom.claims SET due_at = now() - interval '1 second' WHERE execution_id = 'lapsed';
             SELECT loom_schedule('due', NULL, 'q');",
            claimed[0].1
        ))
        .unwrap();
        assert_eq!(
            one::<String>("SELECT value FROM loom_status() WHERE item = 'claims'").as_deref(),
            Some("1 due, 1 claimed, 1 lapsed, 1 scheduled")
        );
        Spi::run("SELECT * FROM loom_delete_idle_executions(interval '1 day')").unwrap();
        // The finished claim and the plain execution went; the held, the
        // lapsed, the due and the scheduled one stayed, with their claims.
        assert_eq!(
            column("SELECT DISTINCT execution_id FROM loom.events ORDER BY 1"),
            ["due", "held", "lapsed", "timer"]
        );
        assert_eq!(
            column("SELECT execution_id FROM loom.claims ORDER BY 1"),
            ["due", "held", "lapsed", "timer"]
        );
    }
}

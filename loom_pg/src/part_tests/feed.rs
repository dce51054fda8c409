//! The pg_tests of `loom-core/sql/feed.sql`: the feed's trigger, its
//! positions, its horizon and its consumers. A pg_test is one transaction
//! that never commits, so what a reader sees of committed events is
//! tested against real clusters (`tests/server/feed.rs`); here, that an
//! event of a transaction still in progress is never readable.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{column, one, sqlstate_of};
    use pgrx::prelude::*;

    fn status(item: &str) -> Option<String> {
        one::<String>(&format!(
            "SELECT value FROM loom_status() WHERE item = '{item}'"
        ))
    }

    #[pg_test]
    fn the_feed_writes_a_position_per_event_only_while_on() {
        Spi::run("SELECT loom_append_event('before', 1, 'k', '{}')").unwrap();
        assert_eq!(one::<i64>("SELECT count(*) FROM loom.feed"), Some(0));
        assert_eq!(status("change feed").as_deref(), Some("off"));
        Spi::run("SELECT loom_feed_enable(); SELECT loom_feed_enable();").unwrap();
        Spi::run(
            "SELECT loom_append_events(ARRAY['b', 'a', 'b'], ARRAY[1, 1, 2]::bigint[], ARRAY['k', 'k', 'k'], ARRAY['{}', '{}', '{}']::jsonb[]);
             SELECT loom_append_event('c', 1, 'k', '{}');",
        )
        .unwrap();
        // Each event at the writing transaction, in id and sequence order
        // within a statement, statements in order.
        assert_eq!(
            column("SELECT execution_id || sequence FROM loom.feed ORDER BY feed_tx, ord"),
            ["a1", "b1", "b2", "c1"]
        );
        // All at this transaction, which is the newest (its id at or past
        // its snapshots' xmax): no new era for its own rows.
        assert_eq!(
            one::<bool>(
                "SELECT bool_and(feed_tx = pg_current_xact_id()::text::bigint) FROM loom.feed"
            ),
            Some(true)
        );
        assert_eq!(one::<i32>("SELECT era FROM loom.feed_state"), Some(1));
        // This transaction is still in progress: nothing of it is readable.
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_feed_read(NULL, 100)"),
            Some(0)
        );
        assert_eq!(one::<String>("SELECT loom_feed_head()"), None);
        assert!(status("change feed").unwrap().starts_with("on, "));
        // On in loom.feed_state without its trigger (a restore): status
        // says to turn it on again.
        Spi::run("DROP TRIGGER events_feed ON loom.events").unwrap();
        assert_eq!(
            one::<String>(
                "SELECT statement FROM loom_status() WHERE item = 'change feed' AND needs_action"
            )
            .as_deref(),
            Some("SELECT public.loom_feed_enable();")
        );
        Spi::run("SELECT loom_feed_enable(); SELECT loom_feed_disable();").unwrap();
        assert_eq!(status("change feed").as_deref(), Some("off"));
        Spi::run("SELECT loom_append_event('d', 1, 'k', '{}')").unwrap();
        assert_eq!(one::<i64>("SELECT count(*) FROM loom.feed"), Some(4));
    }

    #[pg_test]
    fn a_restored_feed_moves_to_a_new_era_above_every_position() {
        Spi::run("SELECT loom_feed_enable()").unwrap();
        // A position a restore brought, above what this cluster's ids reach.
        Spi::run(
            "INSERT INTO loom.feed (feed_tx, ord, execution_id, sequence, event_created_at)
             VALUES (pg_current_xact_id()::text::bigint + 1000000, 1, 'old', 1, now())",
        )
        .unwrap();
        Spi::run("SELECT loom_append_event('new', 1, 'k', '{}')").unwrap();
        assert_eq!(
            column("SELECT execution_id FROM loom.feed ORDER BY feed_tx, ord"),
            ["old", "new"]
        );
        assert_eq!(one::<i32>("SELECT era FROM loom.feed_state"), Some(2));
    }

    #[pg_test]
    fn enabling_a_restored_feed_moves_it_to_a_new_era_before_any_append() {
        // Restored rows (and no trigger, as after a restore): enabling the
        // feed moves the offset past them, so that they are readable at
        // once, before anything is appended.
        Spi::run(
            "INSERT INTO loom.feed (feed_tx, ord, execution_id, sequence, event_created_at)
             VALUES (pg_current_xact_id()::text::bigint + 1000000, 1, 'old', 1, now());
             SELECT loom_feed_enable();",
        )
        .unwrap();
        assert_eq!(one::<i32>("SELECT era FROM loom.feed_state"), Some(2));
        assert_eq!(
            one::<bool>(
                "SELECT pg_current_xact_id()::text::bigint + tx_offset > (SELECT max(feed_tx) FROM loom.feed)
                 FROM loom.feed_state"
            ),
            Some(true)
        );
        // Enabled again: no further era.
        Spi::run("SELECT loom_feed_enable()").unwrap();
        assert_eq!(one::<i32>("SELECT era FROM loom.feed_state"), Some(2));
    }

    #[pg_test]
    fn positions_and_consumers_refuse_what_is_malformed_or_not_theirs() {
        for bad in [
            "'x'",
            "'0000000000000000000000000000000G'",
            "repeat('f', 32)",
            "upper(repeat('a', 32))",
        ] {
            assert_eq!(
                sqlstate_of(&format!("SELECT * FROM loom_feed_read({bad})")),
                "LM002",
                "{bad}"
            );
        }
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_feed_read(NULL, 0)"),
            "22023"
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_feed_read(NULL, 10001)"),
            "22023"
        );
        assert_eq!(
            one::<String>("SELECT loom_feed_position(1, 255)").as_deref(),
            Some("000000000000000100000000000000ff")
        );
        assert_eq!(
            one::<String>("SELECT loom_feed_create_consumer('projector')").as_deref(),
            Some("")
        );
        let p1 = "00000000000000010000000000000001";
        let p2 = "00000000000000020000000000000001";
        let p3 = "00000000000000030000000000000001";
        let ack = |consumer: &str, at: &str| {
            one::<String>(&format!("SELECT loom_feed_ack('{consumer}', '{at}')"))
        };
        assert_eq!(ack("projector", p2).as_deref(), Some(p2));
        // Never backwards: a redelivery's ack changes nothing.
        assert_eq!(ack("projector", p1).as_deref(), Some(p2));
        // Compare and set.
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT loom_feed_ack('projector', '{p2}', '{p1}')"
            )),
            "LM003"
        );
        assert_eq!(
            sqlstate_of("SELECT loom_feed_ack('projector', '')"),
            "LM002"
        );
        assert_eq!(
            sqlstate_of(&format!("SELECT loom_feed_ack('nobody', '{p1}')")),
            "42704"
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_feed_next('nobody')"),
            "42704"
        );
        assert_eq!(sqlstate_of("SELECT loom_feed_create_consumer('')"), "22023");
        // Created again: the same consumer, where it was.
        assert_eq!(
            one::<String>("SELECT loom_feed_create_consumer('projector')").as_deref(),
            Some(p2)
        );
        // Trim keeps what the slowest consumer has not acknowledged.
        Spi::run(&format!(
            "INSERT INTO loom.feed (feed_tx, ord, execution_id, sequence, event_created_at)
             VALUES (1, 1, 'x', 1, now()), (2, 1, 'x', 2, now()), (3, 1, 'x', 3, now());
             SELECT loom_feed_create_consumer('slow', '{p1}');"
        ))
        .unwrap();
        assert_eq!(one::<i64>("SELECT loom_feed_trim()"), Some(1));
        assert_eq!(
            column("SELECT sequence::text FROM loom.feed ORDER BY 1"),
            ["2", "3"]
        );
        // Every consumer past every row: the last row stays, the position
        // a restore's new era must start above.
        ack("slow", p3);
        ack("projector", p3);
        assert_eq!(one::<i64>("SELECT loom_feed_trim()"), Some(1));
        assert_eq!(one::<i64>("SELECT loom_feed_trim()"), Some(0));
        assert_eq!(
            column("SELECT sequence::text FROM loom.feed ORDER BY 1"),
            ["3"]
        );
        // Dropped, a consumer holds nothing back.
        assert_eq!(
            one::<bool>("SELECT loom_feed_drop_consumer('slow')"),
            Some(true)
        );
        assert_eq!(
            one::<bool>("SELECT loom_feed_drop_consumer('slow')"),
            Some(false)
        );
    }
}

//! The pg_tests of `loom-core/sql/feed.sql`: the feed's defaults, its
//! positions, its eras, its horizon and its consumers. A pg_test is one transaction
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

    /// The statement status asks for about the feed, if it asks.
    fn feed_action() -> Option<String> {
        one::<String>(
            "SELECT statement FROM loom_status() WHERE item = 'change feed' AND needs_action",
        )
    }

    fn positioned() -> Option<i64> {
        one::<i64>("SELECT count(*) FROM loom.events WHERE feed_tx IS NOT NULL")
    }

    #[pg_test]
    fn the_feed_writes_a_position_per_event_only_while_on() {
        Spi::run("SELECT loom_append_event('before', 1, 'k', '{}')").unwrap();
        assert_eq!(positioned(), Some(0));
        assert_eq!(status("change feed").as_deref(), Some("off"));
        Spi::run("SELECT loom_feed_enable(); SELECT loom_feed_enable();").unwrap();
        Spi::run(
            "SELECT loom_append_events(ARRAY['b', 'a', 'b'], ARRAY[1, 1, 2]::bigint[], ARRAY['k', 'k', 'k'], ARRAY['{}', '{}', '{}']::jsonb[]);
             SELECT loom_append_event('c', 1, 'k', '{}');",
        )
        .unwrap();
        // Each event at the writing transaction, in the order appended.
        assert_eq!(
            column(
                "SELECT execution_id || sequence FROM loom.events WHERE feed_tx IS NOT NULL ORDER BY feed_tx, feed_ord"
            ),
            ["b1", "a1", "b2", "c1"]
        );
        assert_eq!(
            one::<bool>(
                "SELECT bool_and(feed_tx = pg_current_xact_id()::text::bigint) FROM loom.events WHERE feed_tx IS NOT NULL"
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
        // On in loom.feed_state without its defaults (a restore): status
        // says to turn it on again.
        Spi::run("ALTER TABLE loom.events ALTER feed_tx DROP DEFAULT, ALTER feed_ord DROP DEFAULT")
            .unwrap();
        assert_eq!(
            feed_action().as_deref(),
            Some("SELECT public.loom_feed_enable();")
        );
        Spi::run("SELECT loom_feed_enable(); SELECT loom_feed_disable();").unwrap();
        assert_eq!(status("change feed").as_deref(), Some("off"));
        Spi::run("SELECT loom_append_event('d', 1, 'k', '{}')").unwrap();
        assert_eq!(positioned(), Some(4));
        // Its index stays, for readers and the next enable.
        assert_eq!(
            one::<bool>("SELECT to_regclass('loom.events_feed_position') IS NOT NULL"),
            Some(true)
        );
    }

    #[pg_test]
    fn enable_adds_the_columns_an_update_left_and_refuses_foreign_ones() {
        // As after an update that could not lock loom.events in time.
        Spi::run("ALTER TABLE loom.events DROP COLUMN feed_tx, DROP COLUMN feed_ord").unwrap();
        assert_eq!(one::<bool>("SELECT loom_feed_has_columns()"), Some(false));
        // Nothing to read, and no error, while there are no positions.
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom_feed_read(NULL, 10)"),
            Some(0)
        );
        assert_eq!(one::<String>("SELECT loom_feed_head()"), None);
        Spi::run("SELECT loom_feed_enable()").unwrap();
        assert_eq!(one::<bool>("SELECT loom_feed_is_on()"), Some(true));
        // A column of that name that is not loom's is refused, and kept.
        Spi::run(
            "SELECT loom_feed_disable();
             ALTER TABLE loom.events DROP COLUMN feed_tx, DROP COLUMN feed_ord;
             ALTER TABLE loom.events ADD COLUMN feed_tx text;",
        )
        .unwrap();
        assert_eq!(sqlstate_of("SELECT loom_feed_enable()"), "55000");
        assert_eq!(
            one::<String>("SELECT atttypid::regtype::text FROM pg_attribute WHERE attrelid = 'loom.events'::regclass AND attname = 'feed_tx'")
                .as_deref(),
            Some("text")
        );
    }

    #[pg_test]
    fn a_feed_turned_off_and_restored_without_its_index_is_refused_and_named() {
        Spi::run(
            "SELECT loom_feed_enable(); SELECT loom_append_event('a', 1, 'k', '{}');
             SELECT loom_feed_disable();
             DROP INDEX loom.events_feed_position;",
        )
        .unwrap();
        assert_eq!(sqlstate_of("SELECT * FROM loom_feed_read()"), "55000");
        assert_eq!(sqlstate_of("SELECT loom_feed_head()"), "55000");
        assert_eq!(
            feed_action().as_deref(),
            Some("SELECT public.loom_feed_enable(); SELECT public.loom_feed_disable();")
        );
    }

    #[pg_test]
    fn enable_runs_under_a_publication_of_every_table() {
        // Its high water mark's deletes need a replica identity there.
        Spi::run(
            "CREATE PUBLICATION loom_t_everything FOR ALL TABLES;
             SELECT loom_feed_enable(); SELECT loom_feed_enable();
             SELECT loom_feed_disable(); SELECT loom_feed_enable();",
        )
        .unwrap();
        assert_eq!(one::<bool>("SELECT loom_feed_is_on()"), Some(true));
    }

    #[pg_test]
    fn notify_is_a_trigger_only_while_asked_for() {
        let notify_trigger = || {
            one::<bool>(
                "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'loom.events'::regclass AND tgname = 'events_feed_notify')",
            )
        };
        Spi::run("SELECT loom_feed_enable(true)").unwrap();
        assert_eq!(notify_trigger(), Some(true));
        Spi::run("SELECT loom_append_event('n', 1, 'k', '{}')").unwrap();
        Spi::run("SELECT loom_feed_enable(false)").unwrap();
        assert_eq!(notify_trigger(), Some(false));
        Spi::run("SELECT loom_feed_enable(true); SELECT loom_feed_disable();").unwrap();
        assert_eq!(notify_trigger(), Some(false));
        // Its function serves loom.events' feed triggers only.
        Spi::run(
            "CREATE TABLE not_events (x int);
             CREATE TRIGGER events_feed_notify AFTER INSERT ON not_events
                 FOR EACH STATEMENT EXECUTE FUNCTION loom_events_feed();",
        )
        .unwrap();
        assert_eq!(sqlstate_of("INSERT INTO not_events VALUES (1)"), "42501");
    }

    #[pg_test]
    fn enabling_a_restored_feed_moves_it_to_a_new_era_above_every_position() {
        // A restored event (no defaults, as after a restore), above what
        // this cluster's ids reach: enabling the feed moves the offset
        // past it, so that it is readable at once and new positions sort
        // after it.
        Spi::run(
            "INSERT INTO loom.events (execution_id, sequence, kind, payload, feed_tx, feed_ord)
             VALUES ('old', 1, 'k', '{}', pg_current_xact_id()::text::bigint + 1000000, 1);
             SELECT loom_feed_enable();",
        )
        .unwrap();
        assert_eq!(one::<i32>("SELECT era FROM loom.feed_state"), Some(2));
        // Enabled again: no further era.
        Spi::run("SELECT loom_feed_enable(); SELECT loom_append_event('new', 1, 'k', '{}');")
            .unwrap();
        assert_eq!(one::<i32>("SELECT era FROM loom.feed_state"), Some(2));
        assert_eq!(
            column("SELECT execution_id FROM loom.events WHERE feed_tx IS NOT NULL ORDER BY feed_tx, feed_ord"),
            ["old", "new"]
        );
    }

    #[pg_test]
    fn a_new_era_starts_above_deleted_positions_and_readers_refuse_until_then() {
        let era = || one::<i32>("SELECT era FROM loom.feed_state");
        let newest_is_below_new_positions = || {
            one::<bool>(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint + s.tx_offset > loom_feed_newest() FROM loom.feed_state s",
            )
        };
        Spi::run("SELECT loom_feed_enable()").unwrap();
        // An event at a high position (as a restore brings), deleted: the
        // high water mark keeps it, and readers refuse rather than read
        // past what would come below it.
        Spi::run(
            "INSERT INTO loom.events (execution_id, sequence, kind, payload, feed_tx, feed_ord)
             VALUES ('gone', 1, 'k', '{}', pg_current_xact_id()::text::bigint + 5000, 1);
             SELECT loom_delete_execution('gone');",
        )
        .unwrap();
        assert_eq!(
            one::<bool>("SELECT max(feed_tx) = pg_current_xact_id()::text::bigint + 5000 FROM loom.feed_high_water"),
            Some(true)
        );
        assert_eq!(
            one::<bool>("SELECT loom_feed_restored(loom_feed_newest())"),
            Some(true)
        );
        assert_eq!(sqlstate_of("SELECT * FROM loom_feed_read()"), "55000");
        assert_eq!(sqlstate_of("SELECT loom_feed_head()"), "55000");
        assert_eq!(
            feed_action().as_deref(),
            Some("SELECT public.loom_feed_enable();")
        );
        Spi::run("SELECT loom_feed_enable()").unwrap();
        assert_eq!(era(), Some(2));
        assert_eq!(newest_is_below_new_positions(), Some(true));
        assert_eq!(sqlstate_of("SELECT * FROM loom_feed_read()"), "no error");
        // A position past every one the database holds is refused, not
        // read past.
        assert_eq!(
            sqlstate_of("SELECT * FROM loom_feed_read(loom_feed_position(pg_current_xact_id()::text::bigint + (SELECT tx_offset FROM loom.feed_state) + 70000, 1))"),
            "55000"
        );
        // A consumer's position is its role's to write: it moves no era.
        Spi::run(
            "SELECT loom_feed_create_consumer('ahead', loom_feed_position(pg_current_xact_id()::text::bigint + (SELECT tx_offset FROM loom.feed_state) + 90000, 1));
             SELECT loom_feed_enable();",
        )
        .unwrap();
        assert_eq!(era(), Some(2));
        // A truncate of the whole log keeps its newest position.
        Spi::run(
            "INSERT INTO loom.events (execution_id, sequence, kind, payload, feed_tx, feed_ord)
             VALUES ('t', 1, 'k', '{}', pg_current_xact_id()::text::bigint + (SELECT tx_offset FROM loom.feed_state) + 200000, 1);
             TRUNCATE loom.events;",
        )
        .unwrap();
        assert_eq!(
            one::<bool>("SELECT max(feed_tx) = pg_current_xact_id()::text::bigint + (SELECT tx_offset FROM loom.feed_state) + 200000 FROM loom.feed_high_water"),
            Some(true)
        );
        // Enabled again: a new era, and the mark keeps only its newest.
        Spi::run("SELECT loom_feed_enable()").unwrap();
        assert_eq!(era(), Some(3));
        assert_eq!(
            one::<i64>("SELECT count(*) FROM loom.feed_high_water"),
            Some(1)
        );
        // A position too high for a new era is refused, not overflowed.
        Spi::run("INSERT INTO loom.feed_high_water VALUES (9223372036854775000)").unwrap();
        assert_eq!(sqlstate_of("SELECT loom_feed_enable()"), "22003");
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
        Spi::run(&format!("SELECT loom_feed_create_consumer('slow', '{p1}')")).unwrap();
        // Dropped once.
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

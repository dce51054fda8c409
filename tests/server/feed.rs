//! The change feed against real servers (issue 38). The skip test: eight
//! writers append in transactions held open for random pauses (some for
//! seconds, some rolled back) while three consumers read the feed; each
//! consumer's acknowledged set is then the committed set, nothing missing,
//! duplicates only across a crash. One consumer's backend is terminated
//! mid-batch, and it restarts from its last acknowledgement; and a
//! consumer process (`loom-feed-consumer`) is killed mid-batch and started
//! again. On the
//! extension (every major `make test` runs) and on the SQL-only flavour
//! (15 and 18).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use loom_harness::sql_only::{self, OWNER};
use loom_harness::{pg_pool, runtime, Cluster};
use pgloom::event_store::{FeedPosition, PgFeed};
use pgloom::interop::tokio_postgres;

type Key = (String, i64);

/// A small deterministic generator: the pauses differ by writer and round.
fn pause(seed: u64) -> Duration {
    let x = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407)
        >> 33;
    match x % 10 {
        0 => Duration::from_millis(1500 + x % 1000), // held open for seconds
        1..=3 => Duration::from_millis(x % 200),
        _ => Duration::ZERO,
    }
}

/// One consumer: reads a batch after its place, processes it, acknowledges
/// it. When `crash_after` batches were processed, its backend is
/// terminated before the acknowledgement, and it starts again from what
/// it acknowledged. Returns every event it processed, in order.
async fn consume(
    conninfo: String,
    admin: String,
    name: String,
    crash_after: Option<usize>,
    writers_done: &AtomicBool,
) -> Vec<Key> {
    let mut processed = Vec::new();
    let mut feed = PgFeed::new(pg_pool(&conninfo, 1).unwrap());
    feed.create_consumer(&name, None).await.unwrap();
    let mut after: Option<FeedPosition> = feed.acknowledged(&name).await.unwrap();
    let mut batches = 0;
    let mut empty_after_done = 0;
    loop {
        let done = writers_done.load(Ordering::SeqCst);
        let page = feed.read(after.as_ref(), 37).await.unwrap();
        let batch = page.events;
        if batch.is_empty() {
            if done {
                empty_after_done += 1;
                if empty_after_done >= 2 {
                    return processed;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        processed.extend(
            batch
                .iter()
                .map(|item| (item.event.execution_id.clone(), item.event.sequence)),
        );
        batches += 1;
        let last = page.next_after.unwrap();
        if crash_after == Some(batches) {
            // Its backend terminated and its process gone mid-batch, before
            // the acknowledgement: it starts again as a new process would,
            // with nothing but what it acknowledged.
            let (admin_client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let terminated: i64 = admin_client
                .query_one(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(terminated, 1, "{name}: its backend");
            drop(feed);
            feed = PgFeed::new(pg_pool(&conninfo, 1).unwrap());
            after = feed.acknowledged(&name).await.unwrap();
            continue;
        }
        feed.ack(&name, &last).await.unwrap();
        after = Some(last);
    }
}

/// The skip test on one database where `owner` may turn the feed on.
fn skip_test(label: &str, conninfo: &str, admin_conninfo: &str) {
    let _heavy = crate::hostile_frames::heavy();
    let rt = runtime();
    let mut owner = postgres::Client::connect(admin_conninfo, postgres::NoTls).unwrap();
    owner.batch_execute("SELECT loom_feed_enable()").unwrap();
    let writers_done = AtomicBool::new(false);
    let with_name = |name: &str| match (conninfo.contains("://"), conninfo.contains('?')) {
        (true, true) => format!("{conninfo}&application_name={name}"),
        (true, false) => format!("{conninfo}?application_name={name}"),
        (false, _) => format!("{conninfo} application_name={name}"),
    };
    let seen: Vec<Vec<Key>> = rt.block_on(async {
        let writers = (0..8u64).map(|w| {
            let pool = pg_pool(conninfo, 1).unwrap();
            async move {
                let mut sequence: i64 = 0;
                for round in 0..12u64 {
                    let mut conn = pool.as_ref().get().await.unwrap();
                    let tx = conn.transaction().await.unwrap();
                    let id = format!("skip-{w}");
                    tx.execute(
                        "SELECT loom_append_event($1, $2, 'step', '{}')",
                        &[&id, &(sequence + 1)],
                    )
                    .await
                    .unwrap();
                    tokio::time::sleep(pause(w * 100 + round)).await;
                    if (w + round) % 7 == 3 {
                        tx.rollback().await.unwrap(); // never committed: never in the feed
                    } else {
                        tx.execute(
                            "SELECT loom_append_event($1, $2, 'step', '{}')",
                            &[&id, &(sequence + 2)],
                        )
                        .await
                        .unwrap();
                        tx.commit().await.unwrap();
                        sequence += 2;
                    }
                }
            }
        });
        let consumers = (0..3).map(|c| {
            let name = format!("{label}-consumer-{c}");
            consume(
                with_name(&name),
                admin_conninfo.to_owned(),
                name,
                (c == 0).then_some(3),
                &writers_done,
            )
        });
        let writing = async {
            futures::future::join_all(writers).await;
            writers_done.store(true, Ordering::SeqCst);
        };
        let ((), seen) = tokio::time::timeout(Duration::from_secs(240), async {
            tokio::join!(writing, futures::future::join_all(consumers))
        })
        .await
        .expect("the skip test finished within 4 minutes");
        seen
    });
    let committed: BTreeSet<Key> = owner
        .query(
            "SELECT execution_id, sequence FROM loom.events WHERE execution_id LIKE 'skip-%'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    {
        for (c, processed) in seen.iter().enumerate() {
            let set: BTreeSet<Key> = processed.iter().cloned().collect();
            assert_eq!(
                set, committed,
                "{label}: consumer {c} missed or invented events"
            );
            let mut counts: HashMap<&Key, usize> = HashMap::new();
            for key in processed {
                *counts.entry(key).or_default() += 1;
            }
            let duplicated = counts.values().filter(|n| **n > 1).count();
            if c == 0 {
                assert!(
                    duplicated > 0,
                    "{label}: the crashed consumer read its unacknowledged batch again"
                );
            } else {
                assert_eq!(
                    duplicated, 0,
                    "{label}: consumer {c} read an event twice without a crash"
                );
            }
            // Each execution's events in sequence order.
            let mut last: HashMap<&str, i64> = HashMap::new();
            for (id, sequence) in processed.iter().filter(|_| c != 0) {
                let previous = last.insert(id, *sequence).unwrap_or(0);
                assert!(
                    *sequence > previous,
                    "{label}: {id} {sequence} after {previous}"
                );
            }
        }
    }
    assert!(
        committed.len() > 100,
        "{label}: {} events committed",
        committed.len()
    );
}

#[test]
fn the_skip_test_on_the_extension() {
    let db = "loom_it_feed_skip";
    let _ = Cluster::C.fresh_database(db);
    let conninfo = Cluster::C.database(db);
    skip_test("extension", &conninfo, &conninfo);
}

#[test]
fn the_skip_test_on_the_sql_only_flavour() {
    for server in sql_only::servers() {
        let db = "loom_it_feed_skip_so";
        server.fresh_sql_only_database(db);
        let conninfo = server.database_as(db, OWNER);
        skip_test(&format!("sqlonly{}", server.major()), &conninfo, &conninfo);
    }
}

#[test]
fn a_writer_moves_only_its_own_consumers_and_a_reader_none() {
    let rt = runtime();
    let db = "loom_it_feed_roles";
    let mut admin = Cluster::C.fresh_database(db);
    admin
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE loom_it_feed_w1 LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE loom_it_feed_w2 LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE loom_it_feed_r LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE loom_it_feed_stranger LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             SELECT loom_grant_access('loom_it_feed_w1', 'writer');
             SELECT loom_grant_access('loom_it_feed_w2', 'writer');
             SELECT loom_grant_access('loom_it_feed_r', 'reader');
             GRANT USAGE ON SCHEMA public TO loom_it_feed_stranger;
             REVOKE loom_it_feed_w1 FROM loom_it_feed_w2; -- roles outlive a test's database
             SELECT loom_feed_enable();
             SELECT loom_append_event('secret', 1, 'k', '{}');",
        )
        .unwrap();
    let feed_as = |role: &str| {
        PgFeed::new(pg_pool(&format!("{} user={}", Cluster::C.database(db), role), 1).unwrap())
    };
    let (w1, w2, reader, stranger) = (
        feed_as("loom_it_feed_w1"),
        feed_as("loom_it_feed_w2"),
        feed_as("loom_it_feed_r"),
        feed_as("loom_it_feed_stranger"),
    );
    rt.block_on(async {
        w1.create_consumer("projector", None).await.unwrap();
        // Readable once every older transaction of the cluster has ended
        // (another test's may be open).
        readable(&w1, 1).await;
        let first = w1.read(None, 10).await.unwrap().events;
        assert_eq!(first.len(), 1);
        // Another writer cannot see or move it, nor take its name.
        assert_eq!(
            w2.ack("projector", &first[0].position)
                .await
                .unwrap_err()
                .sqlstate(),
            Some("42704")
        );
        assert_eq!(
            w2.create_consumer("projector", None)
                .await
                .unwrap_err()
                .sqlstate(),
            Some("42501")
        );
    });
    // Granted the owner's role, it can.
    admin
        .batch_execute("GRANT loom_it_feed_w1 TO loom_it_feed_w2")
        .unwrap();
    rt.block_on(async {
        let first = w1.read(None, 10).await.unwrap().events;
        assert_eq!(
            w2.ack("projector", &first[0].position).await.unwrap(),
            first[0].position
        );
        // A reader reads, and can neither create nor acknowledge.
        assert_eq!(reader.read(None, 10).await.unwrap().events.len(), 1);
        assert_eq!(
            reader
                .create_consumer("mine", None)
                .await
                .unwrap_err()
                .sqlstate(),
            Some("42501")
        );
        // The owner's writer drops its consumer; a reader cannot.
        assert_eq!(
            reader
                .drop_consumer("projector")
                .await
                .unwrap_err()
                .sqlstate(),
            Some("42501")
        );
        assert!(w1.drop_consumer("projector").await.unwrap());
        assert!(!w2.drop_consumer("projector").await.unwrap());
        // A stranger learns no execution id through the feed.
        assert_eq!(
            stranger.read(None, 10).await.unwrap_err().sqlstate(),
            Some("42501")
        );
        assert_eq!(stranger.head().await.unwrap_err().sqlstate(), Some("42501"));
    });
    // Only the owner turns the feed on or off.
    let mut w1_client = Cluster::C.connect_as(db, "loom_it_feed_w1");
    let refused = w1_client
        .batch_execute("SELECT loom_feed_disable()")
        .unwrap_err();
    assert_eq!(loom_harness::sqlstate(&refused), "42501");
    // A writer appends, and cannot give an event a position of its own
    // choosing (one readers have gone past, or one far ahead).
    w1_client
        .batch_execute("INSERT INTO loom.events (execution_id, sequence, kind, payload) VALUES ('w1', 1, 'k', '{}')")
        .unwrap();
    for forged in [
        "INSERT INTO loom.events (execution_id, sequence, kind, payload, feed_tx) VALUES ('w1', 2, 'k', '{}', 1)",
        "INSERT INTO loom.events (execution_id, sequence, kind, payload, feed_ord) VALUES ('w1', 3, 'k', '{}', 1)",
        "UPDATE loom.events SET feed_tx = 1 WHERE execution_id = 'w1'",
    ] {
        let refused = w1_client.batch_execute(forged).unwrap_err();
        assert_eq!(loom_harness::sqlstate(&refused), "42501", "{forged}");
    }
}

/// The lines a consumer process printed: each event it processed, and
/// whether each batch was acknowledged.
fn run_consumer(conninfo: &str, name: &str, kill_after_acks: Option<usize>) -> (Vec<Key>, bool) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_loom-feed-consumer"))
        .args([conninfo, name, "25", "kill-20", "10"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (mut events, mut acks, mut killed) = (Vec::new(), 0, false);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("event ") {
            let (id, sequence) = rest.rsplit_once(' ').unwrap();
            events.push((id.to_owned(), sequence.parse().unwrap()));
        } else if line.starts_with("acked ") {
            acks += 1;
        } else if line == "batch" && kill_after_acks.is_some_and(|n| acks >= n) {
            // Killed mid-batch: processed, not acknowledged.
            child.kill().unwrap();
            killed = true;
            break;
        }
    }
    let status = child.wait().unwrap();
    assert_eq!(status.success(), !killed, "{name}: {status}");
    (events, killed)
}

#[test]
fn a_consumer_process_killed_mid_batch_resumes_from_its_acknowledgement() {
    let db = "loom_it_feed_kill";
    let mut admin = Cluster::C.fresh_database(db);
    admin
        .batch_execute(
            "SELECT loom_feed_enable();
             SELECT loom_append_events(array_fill('kill-' || t, ARRAY[10]), ARRAY(SELECT generate_series(1, 10)::bigint),
                                       array_fill('k'::text, ARRAY[10]), array_fill('{}'::jsonb, ARRAY[10]))
             FROM generate_series(1, 20) t;",
        )
        .unwrap();
    let conninfo = Cluster::C.database(db);
    let (first, killed) = run_consumer(&conninfo, "killed", Some(2));
    assert!(killed);
    let (second, killed) = run_consumer(&conninfo, "killed", None);
    assert!(!killed);
    let committed: BTreeSet<Key> = admin
        .query("SELECT execution_id, sequence FROM loom.events", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let all: Vec<Key> = first.iter().chain(&second).cloned().collect();
    assert_eq!(
        all.iter().cloned().collect::<BTreeSet<_>>(),
        committed,
        "at least once: nothing lost"
    );
    // The batch it was killed in (25 events after two acknowledged ones)
    // comes again, and nothing else does.
    assert_eq!(first.len(), 75);
    assert_eq!(all.len(), committed.len() + 25);
    assert_eq!(&second[..25], &first[50..]);
}

#[test]
fn deleted_events_leave_the_feed_and_a_reused_id_is_not_delivered_twice() {
    use futures::StreamExt;
    let rt = runtime();
    let db = "loom_it_feed_deleted";
    let mut admin = Cluster::C.fresh_database(db);
    admin
        .batch_execute(
            "SELECT loom_feed_enable();
             SELECT loom_append_events(array_fill('x'::text, ARRAY[600]), ARRAY(SELECT generate_series(1, 600)::bigint),
                                       array_fill('k'::text, ARRAY[600]), array_fill('{}'::jsonb, ARRAY[600]));",
        )
        .unwrap();
    admin
        .batch_execute("SELECT loom_delete_execution('x', 10000)")
        .unwrap();
    // The id used again, in a later transaction: its new events come once,
    // at their own positions.
    admin
        .batch_execute("SELECT loom_append_event('x', 1, 'again', '{}'); SELECT loom_append_event('y', 1, 'k', '{}');")
        .unwrap();
    let feed = PgFeed::new(pg_pool(&Cluster::C.database(db), 1).unwrap());
    rt.block_on(async {
        feed.create_consumer("c", None).await.unwrap();
        let mut pages =
            Box::pin(feed.stream("c", pgloom::event_store::FeedOptions::new().batch_size(500)));
        let page = tokio::time::timeout(Duration::from_secs(30), pages.next())
            .await
            .expect("not stalled by 600 deleted events")
            .unwrap()
            .unwrap();
        let got: Vec<(String, i64, String)> = page
            .events
            .iter()
            .map(|item| {
                (
                    item.event.execution_id.clone(),
                    item.event.sequence,
                    item.event.kind.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("x".to_owned(), 1, "again".to_owned()),
                ("y".to_owned(), 1, "k".to_owned())
            ]
        );
        // Acknowledged: nothing left after it.
        feed.ack("c", page.next_after.as_ref().unwrap())
            .await
            .unwrap();
        assert!(feed
            .read(page.next_after.as_ref(), 100)
            .await
            .unwrap()
            .events
            .is_empty());
    });
    // The SQL read has only what is there, the deleted events' positions
    // kept only as the high water mark a restore's new era starts above.
    let (rows, above): (i64, bool) = {
        let row = admin
            .query_one(
                "SELECT (SELECT count(*) FROM loom_feed_read(NULL, 10000)),
                        (SELECT max(feed_tx) FROM loom.feed_high_water) > 0",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((rows, above), (2, true));
}

/// Waits (60 s at most) until `feed` shows `count` events: an event is
/// readable once every transaction of the cluster older than its own has
/// ended, and other tests' may be open.
async fn readable(feed: &PgFeed, count: usize) {
    let started = std::time::Instant::now();
    while feed.read(None, 10_000).await.unwrap().events.len() < count {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{count} events never became readable"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_feed_stream_is_woken_by_the_feeds_notifications_not_its_poll() {
    use futures::StreamExt;
    use pgloom::event_store::{Event, EventStore, FeedOptions, PgEventStore, PgNotifications};
    // Not beside the load tests: their open transactions would delay when
    // the event becomes readable, which this measures from.
    let _heavy = crate::hostile_frames::heavy();
    let rt = runtime();
    let db = "loom_it_feed_notify";
    let mut admin = Cluster::C.fresh_database(db);
    admin
        .batch_execute("SELECT loom_feed_enable(true)")
        .unwrap();
    let conninfo = Cluster::C.database(db);
    let pool = pg_pool(&conninfo, 3).unwrap();
    let feed = PgFeed::new(pool.clone());
    let watcher = PgFeed::new(pool.clone());
    let events = PgEventStore::new(pool);
    rt.block_on(async {
        feed.create_consumer("n", None).await.unwrap();
        let notifications = PgNotifications::listen(&conninfo).await.unwrap();
        // A poll interval no test waits for: only the feed's NOTIFY (and
        // the short retries after it) can bring the page in time.
        let options = FeedOptions::new()
            .poll_interval(Duration::from_secs(120))
            .wake(notifications.wake());
        let mut pages = Box::pin(feed.stream("n", options));
        // The stream's empty reads back off 50 ms doubling: after 7 s it
        // waits from 6.35 s to 12.75 s, so without the notification the
        // event would come at least 5.75 s after its append. Measured from
        // when the event became readable (another transaction of the
        // cluster may hold it back a while), on a second reader.
        let appender = async {
            tokio::time::sleep(Duration::from_secs(7)).await;
            events
                .append(&[Event::new("woken", 1, "k", serde_json::json!({}))])
                .await
                .unwrap();
            while watcher.read(None, 10).await.unwrap().events.is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            std::time::Instant::now()
        };
        let reader = async {
            let page = pages.next().await.unwrap().unwrap();
            (page, std::time::Instant::now())
        };
        let (readable, (page, read)) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(appender, reader)
        })
        .await
        .expect("the page came");
        assert_eq!(page.events[0].event.execution_id, "woken");
        let after = read.saturating_duration_since(readable);
        assert!(
            after < Duration::from_secs(3),
            "woken by the notification, not the backoff: {after:?} after it was readable"
        );
    });
}

/// The SQL-only flavour's dump carries the feed's defaults with the old
/// cluster's offset (review of issue 38): in a cluster whose transaction
/// ids are below the restored positions, an append would sort below them,
/// behind every consumer past them. Its guard refuses the append instead
/// (55000, nothing written) until the owner runs `loom_feed_enable`, and
/// then new events sort after the restored ones. The restored position
/// is written here as the restore writes it, with the guard held off.
#[test]
fn a_sql_only_feed_restored_from_another_cluster_refuses_appends_until_enabled() {
    for server in sql_only::servers() {
        let db = "loom_it_feed_restored_so";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        owner
            .batch_execute(
                "SELECT public.loom_feed_enable();
                 BEGIN;
                 ALTER TABLE loom.events DISABLE TRIGGER events_feed_guard;
                 INSERT INTO loom.events (execution_id, sequence, kind, payload, feed_tx, feed_ord)
                 VALUES ('restored', 1, 'k', '{}', pg_current_xact_id()::text::bigint + 1000000, 1);
                 ALTER TABLE loom.events ENABLE TRIGGER events_feed_guard;
                 COMMIT;",
            )
            .unwrap();
        let refused = owner
            .batch_execute("SELECT public.loom_append_event('new'::text, 1::bigint, 'k'::text, '{}'::jsonb, NULL::jsonb)")
            .unwrap_err();
        assert_eq!(
            loom_harness::sqlstate(&refused),
            "55000",
            "{}",
            server.major()
        );
        let said: String = owner
            .query_one(
                "SELECT statement FROM public.loom_status() WHERE item = 'change feed' AND needs_action",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(said.contains("loom_feed_enable()"), "{said}");
        owner
            .batch_execute(
                "SELECT public.loom_feed_enable();
                 SELECT public.loom_append_event('new'::text, 1::bigint, 'k'::text, '{}'::jsonb, NULL::jsonb);",
            )
            .unwrap();
        let order: Vec<String> = owner
            .query(
                "SELECT execution_id FROM loom.events WHERE feed_tx IS NOT NULL ORDER BY feed_tx, feed_ord",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(order, ["restored", "new"], "{}", server.major());
    }
}

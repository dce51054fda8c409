//! Waiting for new events on PostgreSQL (issue 27): `watch_events` woken
//! by `LISTEN/NOTIFY` from a store that notifies, by its poll interval
//! where nothing notifies, each event once and in order; and a whole log
//! read as a stream.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use loom_harness::pg_pool;
use loom_harness::{runtime, Cluster};
use pgloom::event_store::{
    read_events_stream, watch_events, Event, EventStore, PgEventStore, PgNotifications,
    WatchOptions,
};

fn event(id: &str, sequence: i64) -> Event {
    Event::new(id, sequence, "step", serde_json::json!({ "n": sequence }))
}

#[test]
fn a_watcher_is_woken_by_a_notifying_append_each_event_once_in_order() {
    let rt = runtime();
    let db = "loom_it_watch_notify";
    let _ = Cluster::C.fresh_database(db);
    rt.block_on(async {
        let conninfo = Cluster::C.database(db);
        let store =
            PgEventStore::new(pg_pool(&conninfo, 4).unwrap()).with_append_notifications(true);
        store.append(&[event("run-1", 1)]).await.unwrap();
        let notifications = PgNotifications::listen(&conninfo).await.unwrap();
        assert!(notifications.is_listening());
        // A poll interval no test waits for: only a notification can wake
        // the watcher in time.
        let mut options = WatchOptions::new();
        options
            .poll_interval(Duration::from_secs(60))
            .page_size(3)
            .wake(notifications.wake());
        let mut watched = Box::pin(watch_events(&store, "run-1", None, &options));
        assert_eq!(watched.next().await.unwrap().unwrap().sequence, 1);
        let appender = async {
            for n in 2..=20 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                // Batches of one and of several, with another execution's
                // appends between (a wake-up for someone else).
                if n % 5 == 0 {
                    store.append(&[event("run-1", n)]).await.unwrap();
                } else {
                    store
                        .append(&[event("run-1", n), event("other", n)])
                        .await
                        .unwrap_or_else(|e| panic!("{n}: {e}"));
                }
            }
        };
        let started = Instant::now();
        let watcher = async {
            let mut seen = Vec::new();
            while seen.len() < 19 {
                seen.push(watched.next().await.unwrap().unwrap().sequence);
            }
            seen
        };
        let ((), seen) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(appender, watcher)
        })
        .await
        .expect("woken by notifications, not by the 60 s poll");
        assert_eq!(seen, (2..=20).collect::<Vec<_>>());
        assert!(started.elapsed() < Duration::from_secs(20));
    });
}

#[test]
fn without_notifications_a_watcher_polls_and_misses_nothing() {
    let rt = runtime();
    let db = "loom_it_watch_poll";
    let mut admin = Cluster::C.fresh_database(db);
    rt.block_on(async {
        let store = PgEventStore::new(pg_pool(&Cluster::C.database(db), 2).unwrap());
        let mut options = WatchOptions::new();
        options.poll_interval(Duration::from_millis(100));
        let mut watched = Box::pin(watch_events(&store, "run-1", Some(0), &options));
        // Appended by plain SQL (no notification), while the watcher waits.
        let writer = std::thread::spawn(move || {
            for n in 1..=10_i64 {
                std::thread::sleep(Duration::from_millis(30));
                admin
                    .execute("SELECT loom_append_event('run-1', $1, 'step', '{}')", &[&n])
                    .unwrap();
            }
        });
        let mut seen = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), async {
            while seen.len() < 10 {
                seen.push(watched.next().await.unwrap().unwrap().sequence);
            }
        })
        .await
        .expect("polled");
        writer.join().unwrap();
        assert_eq!(seen, (1..=10).collect::<Vec<_>>());
    });
}

#[test]
fn a_whole_log_reads_as_a_stream_page_by_page() {
    let rt = runtime();
    let db = "loom_it_watch_stream";
    let _ = Cluster::C.fresh_database(db);
    rt.block_on(async {
        let store = PgEventStore::new(pg_pool(&Cluster::C.database(db), 2).unwrap());
        let batch: Vec<Event> = (1..=1000).map(|n| event("long", n)).collect();
        store.append(&batch).await.unwrap();
        for page_size in [1, 64, 1000, 5000] {
            let read: Vec<i64> = read_events_stream(&store, "long", None, page_size)
                .map_ok(|e| e.sequence)
                .try_collect()
                .await
                .unwrap();
            assert_eq!(read, (1..=1000).collect::<Vec<_>>(), "{page_size}");
        }
        let tail: Vec<Event> = read_events_stream(&store, "long", Some(990), 3)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(tail.len(), 10);
        assert!(read_events_stream(&store, "long", None, 0)
            .try_collect::<Vec<_>>()
            .await
            .is_err());
    });
}

#[test]
fn a_notifying_append_rolled_back_in_the_callers_transaction_is_never_watched() {
    let rt = runtime();
    let db = "loom_it_watch_rollback";
    let _ = Cluster::C.fresh_database(db);
    rt.block_on(async {
        let conninfo = Cluster::C.database(db);
        let pool = pg_pool(&conninfo, 2).unwrap();
        let store = PgEventStore::new(pool.clone()).with_append_notifications(true);
        let notifications = PgNotifications::listen(&conninfo).await.unwrap();
        let mut conn = pool.as_ref().get().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        store.on(&tx).append(&[event("run-1", 1)]).await.unwrap();
        tx.rollback().await.unwrap();
        // A committed one after it is what arrives first.
        store.append(&[event("run-2", 1)]).await.unwrap();
        let mut options = WatchOptions::new();
        options
            .poll_interval(Duration::from_secs(60))
            .wake(notifications.wake());
        let mut watched = Box::pin(watch_events(&store, "run-1", None, &options));
        let nothing = tokio::time::timeout(Duration::from_millis(500), watched.next()).await;
        assert!(
            nothing.is_err(),
            "a rolled-back append was seen: {nothing:?}"
        );
    });
}

/// Any session of the database may LISTEN: a notification names the md5 of
/// the execution id, never the id (ids can name tenants and customers).
/// Its reach, measured as a role loom never granted anything (issue 34,
/// docs/client.md): that role receives the key, and can confirm that an
/// id it guesses is active (its md5 is the key), and no more: not the id,
/// not the event.
#[test]
fn a_notification_carries_a_key_not_the_execution_id() {
    use pgloom::event_store::Wake;
    use pgloom::interop::deadpool_postgres::tokio_postgres::{self, AsyncMessage, NoTls};
    let rt = runtime();
    let db = "loom_it_watch_key";
    let _ = Cluster::C.fresh_database(db);
    rt.block_on(async {
        let conninfo = Cluster::C.database(db);
        let (admin, admin_connection) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
        tokio::spawn(admin_connection);
        admin
            .batch_execute(
                "DO $$ BEGIN CREATE ROLE loom_it_watch_stranger LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
            )
            .await
            .unwrap();
        let stranger = format!("{conninfo} user=loom_it_watch_stranger");
        let (listener, mut connection) = tokio_postgres::connect(&stranger, NoTls).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
                }
            }
        });
        listener.batch_execute("LISTEN loom_events").await.unwrap();
        let store = PgEventStore::new(pg_pool(&conninfo, 2).unwrap()).with_append_notifications(true);
        store.append(&[event("acme/secret-run", 1)]).await.unwrap();
        let (channel, payload) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(channel, "loom_events");
        assert_eq!(payload, Wake::key("acme/secret-run"));
        assert!(!payload.contains("acme"), "{payload}");
        // What the stranger can do with it: confirm a guess, and read nothing.
        let guessed: bool = listener
            .query_one("SELECT md5('acme/secret-run') = $1", &[&payload])
            .await
            .unwrap()
            .get(0);
        assert!(guessed);
        let read = listener
            .query("SELECT * FROM loom.events", &[])
            .await
            .unwrap_err();
        assert_eq!(read.code().map(|c| c.code()), Some("42501"), "{read}");
    });
}

/// A tenant's watcher is woken by its own appends: the notification names
/// the stored id (`acme/run-1`), and the view's watcher looks for that key.
#[test]
fn a_tenant_views_watcher_is_woken_by_its_notifications() {
    use pgloom::event_store::{TenantId, TenantScopedEventStore};
    let rt = runtime();
    let db = "loom_it_watch_tenant";
    let _ = Cluster::C.fresh_database(db);
    rt.block_on(async {
        let conninfo = Cluster::C.database(db);
        let shared =
            PgEventStore::new(pg_pool(&conninfo, 2).unwrap()).with_append_notifications(true);
        let acme = TenantScopedEventStore::new(shared.clone(), TenantId::new("acme").unwrap());
        let notifications = PgNotifications::listen(&conninfo).await.unwrap();
        let mut options = WatchOptions::new();
        options
            .poll_interval(Duration::from_secs(60))
            .wake(notifications.wake());
        let mut watched = Box::pin(watch_events(&acme, "run-1", None, &options));
        let first = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            acme.append(&[event("run-1", 1)]).await.unwrap();
        };
        let (seen, ()) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(watched.next(), first)
        })
        .await
        .expect("woken by the notification, not the 60 s poll");
        assert_eq!(seen.unwrap().unwrap().execution_id, "run-1");
    });
}

/// Issue 35: the listener died quietly and watchers fell back to polling
/// for good. Its backend terminated mid-watch (as a failover or an idle
/// reaper would), it connects again by itself, and the watcher sees every
/// event, those appended while no one listened included, long before its
/// 60 s poll.
#[test]
fn a_listener_whose_backend_is_terminated_connects_again_and_no_event_is_missed() {
    let rt = runtime();
    let db = "loom_it_watch_heal";
    let _ = Cluster::C.fresh_database(db);
    rt.block_on(async {
        use pgloom::interop::deadpool_postgres::tokio_postgres::{self, NoTls};
        let conninfo = Cluster::C.database(db);
        let (admin, admin_connection) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
        tokio::spawn(admin_connection);
        let store =
            PgEventStore::new(pg_pool(&conninfo, 2).unwrap()).with_append_notifications(true);
        let notifications = PgNotifications::listen(&conninfo).await.unwrap();
        let mut options = WatchOptions::new();
        options
            .poll_interval(Duration::from_secs(60))
            .wake(notifications.wake());
        let mut watched = Box::pin(watch_events(&store, "run-1", Some(0), &options));
        store.append(&[event("run-1", 1)]).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(20), watched.next())
            .await
            .expect("woken by a notification");
        assert_eq!(first.unwrap().unwrap().sequence, 1);

        // A listener's last statement ends its delivery probe.
        const LISTENERS: &str = "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND query = 'UNLISTEN loom_listener_probe'";
        let listeners = || async {
            let rows = admin.query_typed(LISTENERS, &[]).await.unwrap();
            rows.iter().map(|r| r.get(0)).collect::<Vec<i32>>()
        };
        let old = listeners().await;
        assert_eq!(old.len(), 1, "the listener's backend");
        admin
            .query_typed(
                "SELECT pg_terminate_backend($1)",
                &[(&old[0], tokio_postgres::types::Type::INT4)],
            )
            .await
            .unwrap();
        // Appended at once: some of these go out while no one listens.
        for n in 2..=5 {
            store.append(&[event("run-1", n)]).await.unwrap();
        }
        let mut seen = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), async {
            while seen.len() < 4 {
                seen.push(watched.next().await.unwrap().unwrap().sequence);
            }
        })
        .await
        .expect("the listener came back and woke the watcher, well before its 60 s poll");
        assert_eq!(seen, [2, 3, 4, 5]);
        // A new backend listens, not the terminated one.
        let started = std::time::Instant::now();
        while listeners().await.iter().all(|pid| *pid == old[0]) || !notifications.is_listening() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "never listened again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // And it listens again: a later append wakes the watcher too.
        store.append(&[event("run-1", 6)]).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(20), watched.next())
            .await
            .expect("woken through the new connection");
        assert_eq!(next.unwrap().unwrap().sequence, 6);
    });
}

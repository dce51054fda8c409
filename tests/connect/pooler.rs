//! The client behind PgBouncer in transaction mode (issue 35), as Supabase,
//! Neon and most RDS fleets run it: Debian's `pgbouncer`, started by
//! `make pooler` in front of the icu cluster with 2 server connections, so
//! that every client's transactions share them. A client that leaves a
//! named prepared statement on a server connection meets another client's
//! (42P05 "prepared statement "s0" already exists") or loses its own
//! (26000). Every call here must succeed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loom_harness::{runtime, Cluster};
use pgloom::branch_registry::{BranchRegistry, PgBranchRegistry};
use pgloom::event_store::{Event, EventStore, PgEventStore};
use pgloom::migrate::{migrate, MigrateOptions};
use pgloom::resume::resume;
use pgloom::snapshot_store::{
    Codec, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};
use pgloom::PgPoolOptions;

/// Database `dbname` of the icu cluster, through the pooler.
fn through_pooler(dbname: &str) -> String {
    let pooler = std::env::var("LOOM_PG_POOLER")
        .expect("LOOM_PG_POOLER: run through `make test` (make pooler starts PgBouncer)");
    format!("{pooler} dbname={dbname}")
}

/// A pool to `conninfo` a loaded service would hold: more connections
/// than the pooler has server connections.
fn pool(conninfo: &str) -> pgloom::PgPool {
    pool_caching(conninfo, false)
}

/// [`pool`], its statements cached per connection or not.
fn pool_caching(conninfo: &str, cache: bool) -> pgloom::PgPool {
    let mut options = PgPoolOptions::new();
    options
        .max_size(8)
        .wait_timeout(Duration::from_secs(30))
        .cache_statements(cache);
    pgloom::PgPool::connect_with(conninfo, &options).unwrap()
}

fn event(id: &str, sequence: i64) -> Event {
    Event::new(id, sequence, "step", serde_json::json!({ "n": sequence }))
}

#[test]
fn six_migrations_at_once_through_the_pooler_install_loom_once() {
    let rt = runtime();
    let db = "loom_it_pooler_migrate";
    drop(Cluster::Icu.fresh_database_without_loom(db, ""));
    let conninfo = through_pooler(db);
    rt.block_on(async {
        let mut options = MigrateOptions::new();
        options.snapshot_codec(Codec::Zstd);
        let runs = (0..6).map(|_| {
            let (conninfo, options) = (conninfo.clone(), options.clone());
            tokio::spawn(async move { migrate(&conninfo, &options).await })
        });
        let mut installed = 0;
        for run in futures::future::join_all(runs).await {
            let migration = run.unwrap().unwrap_or_else(|e| panic!("migrate: {e:?}"));
            assert_eq!(migration.to_version, loom_harness::LOOM_VERSION);
            assert_eq!(migration.snapshot_frames, Some(true));
            installed += usize::from(migration.from_version.is_none());
        }
        assert_eq!(installed, 1, "one migration installs, the others find it");
    });
}

/// 16 tasks sharing `store`, 200 appends and 200 tail reads each: how
/// many of the 6,400 calls failed, and the first failure.
async fn load(store: PgEventStore) -> (usize, Option<String>) {
    const TASKS: usize = 16;
    const ROUNDS: i64 = 200;
    let failed = Arc::new(AtomicUsize::new(0));
    let first_failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let tasks = (0..TASKS).map(|task| {
        let (store, failed, first) = (store.clone(), failed.clone(), first_failure.clone());
        tokio::spawn(async move {
            let id = format!("run-{task}");
            for n in 1..=ROUNDS {
                let appended = store.append(&[event(&id, n)]).await;
                let read = store.read_events_after(&id, Some(n - 1), 10).await;
                for outcome in [appended.map(|_| 1), read.map(|page| page.len())] {
                    match outcome {
                        Ok(1) => {}
                        other => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            first
                                .lock()
                                .unwrap()
                                .get_or_insert(format!("{id} at {n}: {other:?}"));
                        }
                    }
                }
            }
        })
    });
    for task in futures::future::join_all(tasks).await {
        task.unwrap();
    }
    let first = first_failure.lock().unwrap().clone();
    (failed.load(Ordering::Relaxed), first)
}

/// Why statement caching is opt-in: the same load with it on, through the
/// same pooler, fails as the issue measured it (42P05 or 26000), while
/// the default fails nothing.
#[test]
fn statements_cached_per_connection_break_behind_the_pooler_and_the_default_does_not() {
    let rt = runtime();
    let db = "loom_it_pooler_cached";
    drop(Cluster::Icu.fresh_database(db));
    let conninfo = through_pooler(db);
    rt.block_on(async {
        let cached = PgEventStore::new(pool_caching(&conninfo, true));
        let (failed, first) = load(cached).await;
        println!("cached statements behind PgBouncer (transaction mode): {failed} of 6400 calls failed; the first: {first:?}");
        assert!(failed > 0, "a named statement survived a transaction pooler");
        let first = first.unwrap();
        assert!(first.contains("42P05") || first.contains("26000"), "{first}");
    });
}

#[test]
fn sixteen_tasks_share_one_store_through_the_pooler_and_no_call_fails() {
    let rt = runtime();
    let db = "loom_it_pooler_load";
    drop(Cluster::Icu.fresh_database(db));
    let conninfo = through_pooler(db);
    const TASKS: usize = 16;
    const ROUNDS: i64 = 200;
    rt.block_on(async {
        let store = PgEventStore::new(pool(&conninfo));
        let (failed, first) = load(store.clone()).await;
        assert_eq!(
            failed,
            0,
            "{failed} of {} calls failed through the pooler; the first: {first:?}",
            TASKS * 2 * usize::try_from(ROUNDS).unwrap(),
        );
        let ids = store.list_executions_page(None, 100).await.unwrap().ids;
        assert_eq!(ids.len(), TASKS);
    });
}

#[test]
fn every_store_operation_works_through_the_pooler() {
    let rt = runtime();
    let db = "loom_it_pooler_stores";
    drop(Cluster::Icu.fresh_database_without_loom(db, ""));
    let conninfo = through_pooler(db);
    rt.block_on(async {
        let mut options = MigrateOptions::new();
        options.snapshot_codec(Codec::Zstd);
        migrate(&conninfo, &options).await.unwrap();
        let pool = pool(&conninfo);
        let events = PgEventStore::new(pool.clone());
        let server = events.check_server().await.unwrap();
        assert_eq!(server.extension_version, loom_harness::LOOM_VERSION);
        let mut snapshot_options = PgSnapshotStoreOptions::new();
        snapshot_options.codec(Codec::Zstd);
        let snapshots = PgSnapshotStore::start(pool.clone(), &snapshot_options)
            .await
            .unwrap();
        snapshot_options.codec(Codec::Delta);
        let deltas = PgSnapshotStore::start(pool.clone(), &snapshot_options)
            .await
            .unwrap();
        let refs = PgBranchRegistry::new(pool.clone());
        // Many tasks at once, so that each operation's statements land on
        // server connections other clients have just used.
        let runs = (0..8).map(|task| {
            let (events, snapshots, refs) = (events.clone(), snapshots.clone(), refs.clone());
            let deltas = deltas.clone();
            tokio::spawn(async move {
                let id = format!("run-{task}");
                for round in 0..10_i64 {
                    // A run saved after every turn as deltas.
                    let grown =
                        JsonText::new(loom_fixtures::agent_state(round as usize + 1, false))
                            .unwrap();
                    let delta_run = format!("{id}-deltas");
                    deltas
                        .save(&NewSnapshot::new(
                            &delta_run,
                            "agent",
                            round + 1,
                            grown.clone(),
                        ))
                        .await
                        .unwrap();
                    let latest = deltas.load_latest(&delta_run).await.unwrap();
                    assert_eq!(latest.map(|s| s.state), Some(grown));
                    let base = round * 3;
                    events
                        .append(&[event(&id, base + 1), event(&id, base + 2)])
                        .await
                        .unwrap();
                    // A duplicate names itself (the replay in a
                    // transaction of its own).
                    let duplicate = events.append(&[event(&id, base + 2)]).await.unwrap_err();
                    assert!(duplicate.is_duplicate(), "{duplicate:?}");
                    events
                        .append_idempotent(&[event(&id, base + 2), event(&id, base + 3)])
                        .await
                        .unwrap();
                    let state =
                        JsonText::new(format!(r#"{{"turn":{round},"pad":"{}"}}"#, "x".repeat(200)))
                            .unwrap();
                    snapshots
                        .save(&NewSnapshot::new(&id, "agent", base + 3, state.clone()))
                        .await
                        .unwrap();
                    let resumed = resume(&events, &snapshots, &id).await.unwrap();
                    assert_eq!(resumed.snapshot.map(|s| s.state), Some(state));
                    assert!(resumed.events.is_empty());
                    refs.put_ref(&format!("{id}/main"), &id, base + 3)
                        .await
                        .unwrap();
                    assert_eq!(
                        refs.get_ref(&format!("{id}/main"))
                            .await
                            .unwrap()
                            .map(|r| r.sequence),
                        Some(base + 3)
                    );
                }
            })
        });
        for run in futures::future::join_all(runs).await {
            run.unwrap();
        }
        // The operator's reads and the retention batch.
        let activity = events.execution_activity(None, 100).await.unwrap();
        assert_eq!(activity.len(), 8);
        let batch = events
            .delete_idle_executions(Duration::from_secs(3600), None, 100)
            .await
            .unwrap();
        assert_eq!(batch.executions_deleted, 0, "nothing is idle yet");
        let check = events.verify_executions_index(100, |_| {}).await.unwrap();
        assert_eq!(check.checked, 8);
        let frames = snapshots.verify_frames(100, |_| {}).await.unwrap();
        assert_eq!((frames.frames, frames.unreadable.len()), (160, 0));
    });
}

/// The backend pid of a connection `pool` hands out.
async fn backend_pid(pool: &pgloom::PgPool) -> i32 {
    let client = pool.as_ref().get().await.unwrap();
    client
        .query_typed_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Issue 35: agent workloads idle for minutes, and the NAT gateways and
/// reapers between a service and a cloud database drop idle connections
/// without a word. A connection unused past `idle_timeout`, or older than
/// `max_lifetime`, is closed at checkout and another opened; a checked
/// connection (`test_on_checkout`) whose backend was terminated is
/// replaced before the caller sees it.
#[test]
fn the_pool_closes_idle_and_old_connections_and_can_check_each_checkout() {
    let rt = runtime();
    let conninfo = Cluster::C.database("postgres");
    rt.block_on(async {
        let mut options = PgPoolOptions::new();
        options
            .max_size(1)
            .idle_timeout(Duration::from_millis(300))
            .max_lifetime(None);
        let pool = pgloom::PgPool::connect_with(&conninfo, &options).unwrap();
        let first = backend_pid(&pool).await;
        assert_eq!(backend_pid(&pool).await, first, "in use: kept");
        tokio::time::sleep(Duration::from_millis(600)).await;
        let after_idle = backend_pid(&pool).await;
        assert_ne!(after_idle, first, "idle past idle_timeout: replaced");

        options
            .idle_timeout(None)
            .max_lifetime(Duration::from_millis(500));
        let pool = pgloom::PgPool::connect_with(&conninfo, &options).unwrap();
        let first = backend_pid(&pool).await;
        let started = std::time::Instant::now();
        let mut replaced = false;
        while started.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if backend_pid(&pool).await != first {
                replaced = true;
                break;
            }
        }
        assert!(replaced, "busy but past max_lifetime: replaced");
        assert!(started.elapsed() >= Duration::from_millis(450));

        options.max_lifetime(None).test_on_checkout(true);
        let pool = pgloom::PgPool::connect_with(&conninfo, &options).unwrap();
        let doomed = backend_pid(&pool).await;
        let (admin, connection) = pgloom::interop::deadpool_postgres::tokio_postgres::connect(
            &conninfo,
            pgloom::interop::deadpool_postgres::tokio_postgres::NoTls,
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        admin
            .query_typed(
                "SELECT pg_terminate_backend($1)",
                &[(
                    &doomed,
                    pgloom::interop::deadpool_postgres::tokio_postgres::types::Type::INT4,
                )],
            )
            .await
            .unwrap();
        assert_ne!(
            backend_pid(&pool).await,
            doomed,
            "checked at checkout: replaced"
        );
    });
}

/// The `loom` command's reads are read-only by a startup setting, which
/// PgBouncer refuses: the command says so and what to do, exit 3, instead
/// of PgBouncer's bare "unsupported startup parameter".
#[test]
fn the_loom_commands_reads_behind_the_pooler_say_why_they_cannot_run_there() {
    let db = "loom_it_pooler_cli";
    drop(Cluster::Icu.fresh_database(db));
    let (code, said) =
        loom_harness::cli::loom_in_env(&["status", "--db", &through_pooler(db)], &[]);
    assert_eq!(code, 3, "{said}");
    assert!(said.contains("give --db a direct connection"), "{said}");
}

/// A listener pointed at the pooler took its `LISTEN` and then never woke
/// anyone: it is refused at once, with what to do, where a direct
/// connection listens.
#[test]
fn a_listener_behind_the_pooler_is_refused_and_a_direct_one_listens() {
    let rt = runtime();
    let db = "loom_it_pooler_listen";
    drop(Cluster::Icu.fresh_database(db));
    rt.block_on(async {
        let refused = pgloom::event_store::PgNotifications::listen(&through_pooler(db))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, pgloom::Error::NotificationsNotDelivered(_)),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("direct connection"),
            "{refused}"
        );
        let direct = pgloom::event_store::PgNotifications::listen(&Cluster::Icu.database(db))
            .await
            .unwrap();
        assert!(direct.is_listening());
    });
}

//! pgloom's stores over real PostgreSQL: the conformance kit on a C
//! and an ICU en-US database, on three en-US shards, and on tenant views
//! of each; ADR 0108's 17-id bug; migrate().

use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use loom_harness::{runtime, Cluster, LOOM_VERSION};
use pgloom::branch_registry::PgBranchRegistry;
use pgloom::conformance::{
    check_branch_registry, check_event_ids, check_event_store, CONFORMANCE_IDS,
};
use pgloom::event_store::{
    iterate_execution_ids, Event, EventStore, PgEventStore, ShardedEventStore, TenantId,
    TenantScopedEventStore,
};
use pgloom::migrate::{migrate, MigrateOptions, StepOutcome};
use proptest::prelude::*;

/// A store on a new database `name` of `cluster`, with loom created.
fn pg_store(cluster: Cluster, name: &str) -> PgEventStore {
    let _ = cluster.fresh_database(name);
    PgEventStore::connect(&cluster.database(name)).unwrap()
}

fn shards(name: &str) -> Vec<PgEventStore> {
    Cluster::SHARDS
        .iter()
        .map(|shard| pg_store(*shard, name))
        .collect()
}

#[test]
fn postgres_stores_conform_under_c_and_en_us() {
    let rt = runtime();
    for (cluster, name) in [
        (Cluster::C, "loom_it_store_c"),
        (Cluster::Icu, "loom_it_store_icu"),
    ] {
        let store = pg_store(cluster, name);
        rt.block_on(check_event_store(&store))
            .unwrap_or_else(|f| panic!("{cluster}: {f}"));
        let registry = PgBranchRegistry::new(store.pool().clone());
        rt.block_on(check_branch_registry(&registry))
            .unwrap_or_else(|f| panic!("{cluster}: {f}"));
    }
}

#[test]
fn sharded_and_tenant_scoped_postgres_stores_conform() {
    let rt = runtime();
    let sharded = ShardedEventStore::new(shards("loom_it_sharded"));
    rt.block_on(check_event_store(&sharded)).unwrap();

    let shared = Arc::new(pg_store(Cluster::Icu, "loom_it_tenants"));
    let neighbour = TenantScopedEventStore::new(shared.clone(), TenantId::new("acme-eu").unwrap());
    rt.block_on(neighbour.append(&[Event::new("run", 1, "started", serde_json::json!({}))]))
        .unwrap();
    let scoped = TenantScopedEventStore::new(shared.clone(), TenantId::new("acme").unwrap());
    rt.block_on(check_event_store(&scoped)).unwrap();

    let tenant_of_shards = TenantScopedEventStore::new(
        ShardedEventStore::new(shards("loom_it_tenant_of_shards")),
        TenantId::new("acme").unwrap(),
    );
    rt.block_on(check_event_store(&tenant_of_shards)).unwrap();
    let shards_of_tenant = ShardedEventStore::new(
        shards("loom_it_shards_of_tenant")
            .into_iter()
            .map(|s| TenantScopedEventStore::new(s, TenantId::new("acme").unwrap()))
            .collect(),
    );
    rt.block_on(check_event_store(&shards_of_tenant)).unwrap();
}

#[test]
fn a_configured_store_grows_to_shards_by_configuration_alone() {
    let rt = runtime();
    let shards: Vec<String> = Cluster::SHARDS
        .iter()
        .map(|shard| {
            let _ = shard.fresh_database("loom_it_configured");
            format!("postgres:{}", shard.database("loom_it_configured"))
        })
        .collect();
    let store: pgloom::event_store::StoreConfig = shards.join(";").parse().unwrap();
    rt.block_on(check_event_store(&store.open().unwrap()))
        .unwrap();
    let single: pgloom::event_store::StoreConfig = "sqlite::memory:".parse().unwrap();
    rt.block_on(check_event_store(&single.open().unwrap()))
        .unwrap();
}

#[test]
fn seventeen_mixed_case_ids_over_three_en_us_shards_come_back_once_each_in_order() {
    // ADR 0108's measurement: 12 came back, 9 missing and 3 duplicated,
    // when each shard paged in en-US order and the merge in another.
    let rt = runtime();
    let store = ShardedEventStore::new(shards("loom_it_adr_17"));
    for id in CONFORMANCE_IDS {
        rt.block_on(store.append(&[Event::new(id, 1, "started", serde_json::json!({}))]))
            .unwrap();
    }
    let used: std::collections::HashSet<usize> = CONFORMANCE_IDS
        .iter()
        .map(|id| store.shard_of(id))
        .collect();
    assert_eq!(used.len(), 3, "the ids spread over all three shards");
    let mut expected: Vec<String> = CONFORMANCE_IDS.iter().map(|s| s.to_string()).collect();
    expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    for page_size in [1, 2, 3, 5, 17] {
        let ids: Vec<String> = rt
            .block_on(iterate_execution_ids(&store, page_size).try_collect())
            .unwrap();
        assert_eq!(ids, expected, "page size {page_size}");
    }
}

#[test]
fn migrate_creates_and_upgrades_and_reports_soft_failures() {
    let rt = runtime();
    let _ = Cluster::Icu.fresh_database_without_loom("loom_it_migrate", "");
    let config = Cluster::Icu.database("loom_it_migrate");
    let created = rt
        .block_on(migrate(&config, MigrateOptions::new().to_version("0.1.0")))
        .unwrap();
    assert_eq!(
        (created.from_version, created.to_version.as_str()),
        (None, "0.1.0")
    );

    // A session holding events makes the conversion fail soft, reported
    // both in the result and to the callback.
    let mut holder = Cluster::Icu.connect("loom_it_migrate");
    holder
        .batch_execute("BEGIN; LOCK TABLE loom.events IN ACCESS SHARE MODE")
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let mut options = MigrateOptions::new();
    options
        .lock_timeout(std::time::Duration::from_millis(200))
        .on_warning(move |w| sink.lock().unwrap().push(w.to_owned()));
    // A short statement_timeout of the caller's does not stop it.
    let short = format!("{config} options='-c statement_timeout=50'");
    let upgraded = rt.block_on(migrate(&short, &options)).unwrap();
    holder.batch_execute("COMMIT").unwrap();
    assert_eq!(upgraded.from_version.as_deref(), Some("0.1.0"));
    assert_eq!(upgraded.to_version, LOOM_VERSION);
    // Skipped in the upgrade, and again in the re-run, both reported: the
    // collation conversion, 0.7.0's index drop and 0.11.0's metadata
    // column, each twice; 0.16.0's change feed columns once (no boot adds
    // them: loom_feed_enable does, when the feed is turned on).
    assert_eq!(upgraded.warnings.len(), 7, "{:?}", upgraded.warnings);
    assert_eq!(
        upgraded
            .warnings
            .iter()
            .filter(|w| w.contains("change feed's columns") && w.contains("loom_feed_enable()"))
            .count(),
        1,
        "{:?}",
        upgraded.warnings
    );
    for needle in [
        "loom.events.execution_id",
        "loom.idx_events_exec",
        "loom.events.metadata",
    ] {
        assert_eq!(
            upgraded
                .warnings
                .iter()
                .filter(|w| w.contains(needle))
                .count(),
            2,
            "{needle}: {:?}",
            upgraded.warnings
        );
    }
    assert_eq!(
        upgraded.collations[1],
        (
            "loom.events.execution_id".to_owned(),
            StepOutcome::Skipped {
                reason: "55P03".to_owned()
            }
        )
    );
    assert_eq!(
        upgraded
            .events_id_index
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("skipped: 55P03")
    );
    assert_eq!(
        upgraded
            .event_metadata
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("skipped: 55P03")
    );
    assert_eq!(*seen.lock().unwrap(), upgraded.warnings);

    // The next boot's re-run lands it.
    let again = rt
        .block_on(migrate(&config, &MigrateOptions::new()))
        .unwrap();
    assert_eq!(again.from_version.as_deref(), Some(LOOM_VERSION));
    assert_eq!(
        again.collations[1],
        (
            "loom.events.execution_id".to_owned(),
            StepOutcome::Done("converted".to_owned())
        )
    );
    assert_eq!(
        again
            .events_id_index
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("dropped")
    );
    assert_eq!(
        again
            .event_metadata
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("added")
    );
    assert!(again.warnings.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn random_unicode_ids_page_on_postgres_like_a_sorted_model(
        ids in prop::collection::vec("\\PC{1,6}", 1..30),
        page_size in 1usize..8,
    ) {
        let rt = runtime();
        let store = pg_store(Cluster::Icu, "loom_it_prop");
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        rt.block_on(check_event_ids(&store, &ids, page_size)).unwrap();
    }
}

/// `Error::is_transient` on what a server really sends: a statement
/// timeout and a terminated connection may succeed when retried, a
/// duplicate never.
#[test]
fn errors_say_whether_a_retry_may_succeed() {
    let rt = runtime();
    let db = "loom_it_transient";
    let mut admin = Cluster::C.fresh_database(db);
    let store = PgEventStore::connect(&format!(
        "{} options='-c statement_timeout=200'",
        Cluster::C.database(db)
    ))
    .unwrap();
    let event = Event::new("run-1", 1, "started", serde_json::json!({}));
    rt.block_on(store.append(std::slice::from_ref(&event)))
        .unwrap();

    let duplicate = rt
        .block_on(store.append(std::slice::from_ref(&event)))
        .unwrap_err();
    assert!(
        matches!(duplicate, pgloom::Error::DuplicateEvent { .. }),
        "{duplicate:?}"
    );
    assert!(!duplicate.is_transient());
    assert!(!duplicate.may_have_committed(), "the server said no");

    // An append that waits past statement_timeout on a held lock: 57014.
    let holder = Cluster::C.hold_lock(db, "events", "ACCESS EXCLUSIVE");
    let timed_out = rt
        .block_on(store.append(&[Event::new("run-1", 2, "step", serde_json::json!({}))]))
        .unwrap_err();
    drop(holder);
    assert_eq!(timed_out.sqlstate(), Some("57014"), "{timed_out:?}");
    assert!(timed_out.is_transient(), "{timed_out:?}");
    assert!(!timed_out.may_have_committed(), "cancelled: rolled back");

    // The connection terminated under a call (an append waiting on the
    // lock): 57P01 or a closed connection, and a retry, on a new
    // connection, succeeds.
    let patient = PgEventStore::connect(&Cluster::C.database(db)).unwrap();
    let holder = Cluster::C.hold_lock(db, "events", "ACCESS EXCLUSIVE");
    let terminator = std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let ended: i64 = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&db],
            )
            .unwrap()
            .get(0);
        if ended > 0 {
            break;
        }
    });
    let second = [Event::new("run-1", 2, "step", serde_json::json!({}))];
    let terminated = rt.block_on(patient.append(&second)).unwrap_err();
    terminator.join().unwrap();
    drop(holder);
    assert!(terminated.is_transient(), "{terminated:?}");
    // The server's 57P01 says the statement was cut off; a connection that
    // closed with no word may have committed first.
    assert_eq!(
        terminated.may_have_committed(),
        terminated.sqlstate().is_none(),
        "{terminated:?}"
    );
    // As a caller retries: again while the failure is transient (the
    // pool may hand out the dead connection once more, closed).
    let mut attempts = 0;
    while let Err(e) = rt.block_on(patient.append(&second)) {
        attempts += 1;
        assert!(e.is_transient() && attempts < 3, "{e:?}");
    }

    // What a retry cannot mend is not transient through a pool either: TLS
    // asked of a server without it, a refused connection is (the server
    // may be starting).
    let no_tls =
        PgEventStore::connect(&format!("{} sslmode=require", Cluster::C.database(db))).unwrap();
    let refused = rt.block_on(no_tls.read_events("run-1")).unwrap_err();
    assert!(!refused.is_transient(), "{refused:?}");
    let nobody =
        PgEventStore::connect("host=127.0.0.1 port=1 user=postgres connect_timeout=2").unwrap();
    let down = rt.block_on(nobody.read_events("run-1")).unwrap_err();
    assert!(down.is_transient(), "{down:?}");
    assert!(!down.may_have_committed(), "nothing was sent: {down:?}");

    // A pool closed by its service (at shutdown) never opens again: not
    // transient (issue 35: it was).
    patient.pool().close();
    let closed = rt.block_on(patient.read_events("run-1")).unwrap_err();
    assert!(
        matches!(&closed, pgloom::Error::Pool(e) if e.is_closed()) && patient.pool().is_closed(),
        "{closed:?}"
    );
    assert!(!closed.is_transient() && !closed.may_have_committed());
}

/// A store, `check_server` and `migrate` refuse an extension version this
/// client does not work with, naming both versions, before anything is
/// written; a migration to such a version changes nothing.
#[test]
fn an_extension_version_the_client_does_not_work_with_is_one_typed_error() {
    use pgloom::compat::{check_server, CLIENT_VERSION};
    use pgloom::snapshot_store::{PgSnapshotStore, PgSnapshotStoreOptions};
    use pgloom::Error;
    let rt = runtime();
    let db = "loom_it_compat";
    let mut admin = Cluster::C.fresh_database(db);
    let store = PgEventStore::connect(&Cluster::C.database(db)).unwrap();
    let server = rt.block_on(store.check_server()).unwrap();
    assert_eq!(server.extension_version, LOOM_VERSION);

    // A database whose extension claims the next major.
    admin
        .batch_execute(
            "UPDATE pg_catalog.pg_extension SET extversion = '1.2.0' WHERE extname = 'loom'",
        )
        .unwrap();
    let incompatible = |e: Error| match e {
        Error::IncompatibleExtension { installed, client } => {
            assert_eq!((installed.as_str(), client), ("1.2.0", CLIENT_VERSION));
        }
        other => panic!("expected IncompatibleExtension, got {other:?}"),
    };
    let fresh = PgEventStore::connect(&Cluster::C.database(db)).unwrap();
    let event = Event::new("run-1", 1, "started", serde_json::json!({}));
    incompatible(
        rt.block_on(fresh.append(std::slice::from_ref(&event)))
            .unwrap_err(),
    );
    incompatible(rt.block_on(fresh.check_server()).unwrap_err());
    let pool = loom_harness::pg_pool(&Cluster::C.database(db), 1).unwrap();
    incompatible(
        rt.block_on(PgSnapshotStore::start(
            pool.clone(),
            &PgSnapshotStoreOptions::new(),
        ))
        .unwrap_err(),
    );
    incompatible(
        rt.block_on(async { check_server(&pool.as_ref().get().await.unwrap()).await })
            .unwrap_err(),
    );
    incompatible(
        rt.block_on(migrate(&Cluster::C.database(db), &MigrateOptions::new()))
            .unwrap_err(),
    );
    let events: i64 = admin
        .query_one("SELECT count(*) FROM loom.events", &[])
        .unwrap()
        .get(0);
    assert_eq!(events, 0, "nothing is written through a refused store");

    // Back at loom's version, a migration asked to go to the next major is
    // refused before it changes anything.
    admin
        .execute(
            "UPDATE pg_catalog.pg_extension SET extversion = $1 WHERE extname = 'loom'",
            &[&LOOM_VERSION],
        )
        .unwrap();
    let refused = rt
        .block_on(migrate(
            &Cluster::C.database(db),
            MigrateOptions::new().to_version("1.0.0"),
        ))
        .unwrap_err();
    assert!(
        matches!(&refused, Error::IncompatibleExtension { installed, .. } if installed == "1.0.0"),
        "{refused:?}"
    );
    assert_eq!(loom_harness::version_of(&mut admin), LOOM_VERSION);
}

/// Every wait a store's caller sees is bounded: a pool's statement
/// timeout cancels an append held on a lock, and a zstd snapshot store's
/// start behind a peer's held migration lock writes JSONB for now instead
/// of waiting forever.
#[test]
fn waits_are_bounded_by_the_pool_and_the_store() {
    use loom_harness::pg_pool;
    use pgloom::snapshot_store::{
        Codec, FrameProvisioning, PgSnapshotStore, PgSnapshotStoreOptions,
    };
    use pgloom::PgPoolOptions;
    use std::time::{Duration, Instant};
    let rt = runtime();
    let db = "loom_it_bounded";
    let _ = Cluster::C.fresh_database(db);
    // The caller's own options string is kept beside the timeout.
    let pool = pgloom::PgPool::connect_with(
        &format!(
            "{} options='-c application_name=bounded'",
            Cluster::C.database(db)
        ),
        PgPoolOptions::new().statement_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let store = PgEventStore::new(pool.clone());
    let settings: (String, String) = rt.block_on(async {
        let client = pool.as_ref().get().await.unwrap();
        let row = client
            .query_one(
                "SELECT current_setting('statement_timeout'), current_setting('application_name')",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    });
    assert_eq!(settings, ("300ms".to_owned(), "bounded".to_owned()));
    let holder = Cluster::C.hold_lock(db, "events", "ACCESS EXCLUSIVE");
    let started = Instant::now();
    let cancelled = rt
        .block_on(store.append(&[Event::new("run-1", 1, "started", serde_json::json!({}))]))
        .unwrap_err();
    assert_eq!(cancelled.sqlstate(), Some("57014"), "{cancelled:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(holder);

    // A deployment from before frames (no frame column yet), and a peer
    // holding loom's migration lock (a long migration): the zstd store's
    // start gives up after its provision wait.
    let db = "loom_it_bounded_frames";
    let mut admin = Cluster::C.fresh_database_at(db, "0.2.0");
    loom_harness::upgrade_extension(&mut admin, LOOM_VERSION).unwrap();
    admin
        .batch_execute("BEGIN; SELECT public.loom_take_migration_lock()")
        .unwrap();
    let mut options = PgSnapshotStoreOptions::new();
    options
        .codec(Codec::Zstd)
        .provision_wait(Duration::from_millis(300));
    let started = Instant::now();
    let snapshots = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(20),
                PgSnapshotStore::start(pg_pool(&Cluster::C.database(db), 1).unwrap(), &options),
            )
            .await
        })
        .expect("the start is bounded")
        .unwrap();
    assert_eq!(snapshots.frame_provisioning(), FrameProvisioning::Deferred);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    admin.batch_execute("COMMIT").unwrap();
}

/// One PostgreSQL configuration opens events, snapshots and refs on one
/// pool per database, and a sharded one shards snapshots as it shards
/// events: the kits pass on each.
#[test]
fn a_postgres_configuration_opens_every_store_on_one_pool() {
    use pgloom::conformance::{
        check_branch_registry, check_resume_and_retention, check_snapshot_store, Fidelity,
    };
    use pgloom::event_store::StoreConfig;
    use pgloom::snapshot_store::Codec;
    use pgloom::stores::StoresOptions;
    use pgloom::PgPoolOptions;
    let rt = runtime();
    let db = "loom_it_stores";
    let mut admin = Cluster::Icu.fresh_database(db);
    let shards: Vec<String> = Cluster::SHARDS
        .iter()
        .map(|shard| {
            let _ = shard.fresh_database(db);
            format!("postgres:{}", shard.database(db))
        })
        .collect();
    for config in [
        format!("postgres:{}", Cluster::Icu.database(db)),
        shards.join(";"),
    ] {
        let parsed: StoreConfig = config.parse().unwrap();
        let mut options = StoresOptions::new();
        options
            .codec(Codec::Zstd)
            .pool(PgPoolOptions::new().max_size(3));
        let stores = rt.block_on(parsed.open_stores(&options)).unwrap();
        rt.block_on(async {
            check_event_store(&stores.events).await.unwrap();
            check_snapshot_store(&stores.snapshots, Codec::Zstd, Fidelity::Exact)
                .await
                .unwrap();
            check_branch_registry(&stores.refs).await.unwrap();
            check_resume_and_retention(&stores.events, &stores.snapshots)
                .await
                .unwrap();
        });
        if !config.contains(';') {
            // Three stores, one pool of three connections.
            let connections: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&db],
                )
                .unwrap()
                .get(0);
            assert!(connections <= 3, "{connections} connections");
        }
    }
}

/// Blocking stores that share a pool share its connections: a connection
/// one opened and another borrowed is driven all the same (with a runtime
/// per blocking store, the second call waited forever).
#[test]
fn blocking_stores_sharing_one_pool_do_not_wait_on_each_other() {
    use pgloom::blocking::{BlockingBranchRegistry, BlockingEventStore, BlockingSnapshotStore};
    use pgloom::branch_registry::PgBranchRegistry;
    use pgloom::snapshot_store::{JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions};
    let db = "loom_it_blocking_pool";
    let _ = Cluster::C.fresh_database(db);
    let pool = loom_harness::pg_pool(&Cluster::C.database(db), 1).unwrap();
    // Built on a runtime of its own, gone before the blocking calls.
    let snapshots = runtime()
        .block_on(PgSnapshotStore::start(
            pool.clone(),
            &PgSnapshotStoreOptions::new(),
        ))
        .unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let events = BlockingEventStore::new(PgEventStore::new(pool.clone())).unwrap();
        let snapshots = BlockingSnapshotStore::new(snapshots).unwrap();
        let refs = BlockingBranchRegistry::new(PgBranchRegistry::new(pool)).unwrap();
        events
            .append(&[Event::new("run-1", 1, "started", serde_json::json!({}))])
            .unwrap();
        snapshots
            .save(&NewSnapshot::new(
                "run-1",
                "agentLoop",
                1,
                JsonText::new("{}".to_owned()).unwrap(),
            ))
            .unwrap();
        refs.put_ref("main", "run-1", 1).unwrap();
        assert_eq!(events.read_events("run-1").unwrap().len(), 1);
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the blocking calls finish");
}

/// Issue 35: the client's version is its own, not the extension's. This
/// client, against extensions released before the SQL it carries (the
/// oldest it supports among them, one from before the tail reads, and the
/// last release before this one): each store works with what that version
/// has, and a method whose function came later says which one is missing,
/// never a server error about a function it called anyway.
#[test]
fn this_client_works_with_older_supported_extensions() {
    use pgloom::compat::{check_server, supports, OLDEST_EXTENSION};
    use pgloom::snapshot_store::{
        JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
    };
    use pgloom::Error;
    let rt = runtime();
    for version in [OLDEST_EXTENSION, "0.4.0", "0.10.0", "0.14.0"] {
        assert!(supports(version), "{version}");
        let db = format!("loom_it_old_{}", version.replace('.', "_"));
        let _admin = Cluster::C.fresh_database_at(&db, version);
        rt.block_on(async {
            let pool = loom_harness::pg_pool(&Cluster::C.database(&db), 2).unwrap();
            let events = PgEventStore::new(pool.clone());
            let server = events.check_server().await.unwrap();
            assert_eq!(server.extension_version, version);
            let client = pool.as_ref().get().await.unwrap();
            assert_eq!(
                check_server(&client).await.unwrap().extension_version,
                version
            );
            events
                .append(&[
                    Event::new("run-1", 1, "started", serde_json::json!({"v": version})),
                    Event::new("run-1", 2, "step", serde_json::json!({})),
                ])
                .await
                .unwrap_or_else(|e| panic!("{version}: append: {e:?}"));
            assert_eq!(
                events.list_executions_page(None, 10).await.unwrap().ids,
                ["run-1"],
                "{version}"
            );
            let snapshots =
                PgSnapshotStore::new(pool.clone(), &PgSnapshotStoreOptions::new()).unwrap();
            // As JSONB prints it: a version before frames stores JSONB.
            let state = JsonText::new(r#"{"turn": 1}"#.to_owned()).unwrap();
            snapshots
                .save(&NewSnapshot::new("run-1", "agent", 1, state.clone()))
                .await
                .unwrap_or_else(|e| panic!("{version}: save: {e:?}"));
            assert_eq!(
                snapshots
                    .load_latest("run-1")
                    .await
                    .unwrap()
                    .map(|s| s.state),
                Some(state),
                "{version}"
            );
            let tail = events.read_events_after("run-1", Some(1), 10).await;
            let activity = events.execution_activity(None, 10).await;
            // Tail reads came with 0.4.0.
            if version != OLDEST_EXTENSION {
                assert_eq!(tail.unwrap().len(), 1, "{version}");
            } else {
                assert!(
                    matches!(&tail, Err(Error::ExtensionMissing { .. })),
                    "{version}: {tail:?}"
                );
            }
            // resume() over one pool: in one statement from 0.4.0
            // (loom_resume), and before it the generic way, whose tail
            // read 0.1.0 lacks, said as such.
            let resumed = pgloom::resume::resume(&events, &snapshots, "run-1").await;
            if version != OLDEST_EXTENSION {
                let resumed = resumed.unwrap_or_else(|e| panic!("{version}: resume: {e:?}"));
                assert_eq!(resumed.snapshot.map(|s| s.sequence), Some(1), "{version}");
                assert_eq!(
                    resumed
                        .events
                        .iter()
                        .map(|e| e.sequence)
                        .collect::<Vec<_>>(),
                    [2],
                    "{version}"
                );
            } else {
                assert!(
                    matches!(&resumed, Err(Error::ExtensionMissing { .. })),
                    "{version}: {resumed:?}"
                );
            }
            // Retention by age came with 0.8.0.
            if ["0.10.0", "0.14.0"].contains(&version) {
                assert_eq!(activity.unwrap().len(), 1, "{version}");
            } else {
                assert!(
                    matches!(&activity, Err(Error::ExtensionMissing { .. })),
                    "{version}: {activity:?}"
                );
            }
        });
    }
}

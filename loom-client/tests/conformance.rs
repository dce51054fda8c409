//! The conformance kit on every store that needs no server: memory,
//! SQLite, and the compositions over them. (Postgres: `tests/` at the
//! repository root, against the Makefile's clusters.)

mod common;

use common::block_on;
use std::sync::Arc;

use pgloom::branch_registry::{MemoryBranchRegistry, SqliteBranchRegistry};
use pgloom::conformance::{check_branch_registry, check_event_ids, check_event_store};
use pgloom::contract::{check_compatibility, ContractVersion, EVENT_STORE_CONTRACT};
use pgloom::event_store::{
    Event, EventStore, MemoryEventStore, ShardedEventStore, SqliteEventStore, TenantId,
    TenantScopedEventStore,
};
use pgloom::Error;
use proptest::prelude::*;

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).unwrap()
}

#[test]
fn memory_and_sqlite_conform() {
    block_on(async {
        check_event_store(&MemoryEventStore::new()).await.unwrap();
        check_event_store(&SqliteEventStore::open_in_memory().unwrap())
            .await
            .unwrap();
        check_branch_registry(&MemoryBranchRegistry::new())
            .await
            .unwrap();
        check_branch_registry(&SqliteBranchRegistry::open_in_memory().unwrap())
            .await
            .unwrap();
    });
}

#[test]
fn compositions_conform() {
    block_on(async {
        let sharded = ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect());
        check_event_store(&sharded).await.unwrap();
        let shared = Arc::new(SqliteEventStore::open_in_memory().unwrap());
        // Another tenant's ids around ours, on both sides of the range.
        for other in ["acm", "acme-", "acmf", "ab"] {
            TenantScopedEventStore::new(shared.clone(), tenant(other))
                .append(&[Event::new("x", 1, "started", serde_json::json!({}))])
                .await
                .unwrap();
        }
        check_event_store(&TenantScopedEventStore::new(shared.clone(), tenant("acme")))
            .await
            .unwrap();
        let sharded_tenants = ShardedEventStore::new(
            (0..3)
                .map(|_| TenantScopedEventStore::new(shared.clone(), tenant("sharded")))
                .collect(),
        );
        check_event_store(&sharded_tenants).await.unwrap();
        let tenant_of_shards = TenantScopedEventStore::new(
            ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect()),
            tenant("acme"),
        );
        check_event_store(&tenant_of_shards).await.unwrap();
    });
}

#[test]
fn a_tenant_never_sees_another_tenants_ids() {
    block_on(async {
        let shared = Arc::new(MemoryEventStore::new());
        let (a, b) = (
            TenantScopedEventStore::new(shared.clone(), tenant("a")),
            TenantScopedEventStore::new(shared.clone(), tenant("a-")),
        );
        for i in 0..5 {
            a.append(&[Event::new(format!("run{i}"), 1, "s", serde_json::json!({}))])
                .await
                .unwrap();
            b.append(&[Event::new(format!("run{i}"), 1, "s", serde_json::json!({}))])
                .await
                .unwrap();
        }
        let page = a.list_executions_page(None, 100).await.unwrap();
        assert_eq!(page.ids, ["run0", "run1", "run2", "run3", "run4"]);
        assert_eq!(page.next_cursor, None);
        let page = a.list_executions_page(Some("run1"), 2).await.unwrap();
        assert_eq!(
            (page.ids, page.next_cursor.as_deref()),
            (vec!["run2".into(), "run3".into()], Some("run3"))
        );
        assert!(matches!(
            a.append(&[Event::new("", 1, "s", serde_json::json!({}))])
                .await,
            Err(Error::InvalidTenant(_))
        ));
    });
}

/// A store that fails every call as a server that went away does.
struct Down;

fn gone() -> Error {
    Error::from(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        Some("disk I/O error".into()),
    ))
}

impl EventStore for Down {
    fn id_scope(&self) -> pgloom::id_scope::IdScope {
        pgloom::id_scope::IdScope::unscoped()
    }
    async fn append(&self, _: &[Event]) -> pgloom::Result<()> {
        Err(gone())
    }
    async fn read_events(&self, _: &str) -> pgloom::Result<Vec<Event>> {
        Err(gone())
    }
    async fn list_executions_page(
        &self,
        _: Option<&str>,
        _: usize,
    ) -> pgloom::Result<pgloom::event_store::Page> {
        Err(gone())
    }
}

#[test]
fn a_failing_shard_fails_the_page_never_a_partial_one() {
    block_on(async {
        #[allow(clippy::large_enum_variant)]
        enum Shard {
            Up(MemoryEventStore),
            Down(Down),
        }
        impl EventStore for Shard {
            fn id_scope(&self) -> pgloom::id_scope::IdScope {
                pgloom::id_scope::IdScope::unscoped()
            }
            async fn append(&self, e: &[Event]) -> pgloom::Result<()> {
                match self {
                    Shard::Up(s) => s.append(e).await,
                    Shard::Down(s) => s.append(e).await,
                }
            }
            async fn read_events(&self, id: &str) -> pgloom::Result<Vec<Event>> {
                match self {
                    Shard::Up(s) => s.read_events(id).await,
                    Shard::Down(s) => s.read_events(id).await,
                }
            }
            async fn list_executions_page(
                &self,
                a: Option<&str>,
                l: usize,
            ) -> pgloom::Result<pgloom::event_store::Page> {
                match self {
                    Shard::Up(s) => s.list_executions_page(a, l).await,
                    Shard::Down(s) => s.list_executions_page(a, l).await,
                }
            }
        }
        let up = MemoryEventStore::new();
        up.append(&[Event::new("x", 1, "s", serde_json::json!({}))])
            .await
            .unwrap();
        let store = ShardedEventStore::new(vec![Shard::Up(up), Shard::Down(Down)]);
        match store.list_executions_page(None, 10).await {
            Err(Error::Shard {
                shard: 1,
                shards: 2,
                ..
            }) => {}
            other => panic!("expected shard 1's error, got {other:?}"),
        }

        // A batch over both shards, one of them down: refused whole, so the
        // healthy shard commits none of it (it once committed its half).
        let on = |shard: usize| {
            (0..)
                .map(|i| format!("exec-{i}"))
                .find(|id| store.shard_of(id) == shard)
                .unwrap()
        };
        let (healthy, failing) = (on(0), on(1));
        let batch = [
            Event::new(&healthy, 1, "s", serde_json::json!({})),
            Event::new(&failing, 1, "s", serde_json::json!({})),
        ];
        match store.append(&batch).await {
            Err(Error::BatchSpansShards { shards }) => assert_eq!(shards, [0, 1]),
            other => panic!("expected BatchSpansShards, got {other:?}"),
        }
        let Shard::Up(up) = &store.shards()[0] else {
            unreachable!()
        };
        assert!(up.read_events(&healthy).await.unwrap().is_empty());
        // A batch on the failing shard alone fails, naming it.
        assert!(matches!(
            store.append(&batch[1..]).await,
            Err(Error::Shard { shard: 1, .. })
        ));
        // Per shard, by request: each shard's outcome, the healthy one's
        // committed and the failing one's reported.
        let outcomes = store.append_per_shard(&batch).await;
        assert_eq!(outcomes.len(), 2);
        assert!(outcomes[0].shard == 0 && outcomes[0].events == 1 && outcomes[0].result.is_ok());
        assert!(matches!(
            outcomes[1].result,
            Err(Error::Shard { shard: 1, .. })
        ));
        assert_eq!(up.read_events(&healthy).await.unwrap().len(), 1);
    });
}

#[test]
fn a_1x_store_is_refused() {
    let err = check_compatibility("event", ContractVersion::new(1, 5, 0), EVENT_STORE_CONTRACT)
        .unwrap_err();
    assert!(
        err.to_string().contains("1.5.0") && err.to_string().contains("2.2.0"),
        "{err}"
    );
}

#[test]
fn the_memory_registry_tombstones_and_compacts() {
    block_on(async {
        use pgloom::branch_registry::BranchRegistry;
        let registry = MemoryBranchRegistry::new();
        for i in 0..10 {
            registry.put_ref(&format!("r{i}"), "e", 1).await.unwrap();
        }
        for i in 0..4 {
            registry.delete_ref(&format!("r{i}")).await.unwrap();
        }
        assert_eq!(registry.tombstones(), 4);
        registry.delete_ref("r4").await.unwrap(); // 5 of 10: swept
        assert_eq!(registry.tombstones(), 0);
        assert_eq!(
            registry.list_refs(None, 100).await.unwrap().ids,
            ["r5", "r6", "r7", "r8", "r9"]
        );
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_unicode_ids_page_like_a_sorted_model(
        ids in prop::collection::vec("\\PC{1,6}", 0..40),
        page_size in 1usize..12,
    ) {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        block_on(async {
            check_event_ids(&MemoryEventStore::new(), &ids, page_size).await.unwrap();
            check_event_ids(&SqliteEventStore::open_in_memory().unwrap(), &ids, page_size).await.unwrap();
            let sharded = ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect());
            check_event_ids(&sharded, &ids, page_size).await.unwrap();
            let scoped = TenantScopedEventStore::new(MemoryEventStore::new(), tenant("t"));
            check_event_ids(&scoped, &ids, page_size).await.unwrap();
        });
    }
}

#[test]
fn a_page_refills_a_shard_that_holds_more_than_its_share() {
    block_on(async {
        let store = ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect());
        // 250 ids that all live on shard 0, and a few elsewhere.
        let skewed: Vec<String> = (0..)
            .map(|i| format!("id-{i:05}"))
            .filter(|id| store.shard_of(id) == 0)
            .take(250)
            .collect();
        let others: Vec<String> = (0..)
            .map(|i| format!("other-{i}"))
            .filter(|id| store.shard_of(id) != 0)
            .take(5)
            .collect();
        let ids: Vec<&str> = skewed.iter().chain(&others).map(String::as_str).collect();
        check_event_ids(&store, &ids, 100).await.unwrap();
    });
}

/// Every first-party store says when it wrote each event it reads back,
/// and an event read back equals the one appended (`created_at` is not
/// part of the event).
#[test]
fn events_read_back_carry_when_they_were_written() {
    async fn check(store: &impl EventStore) {
        let before = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
        let appended = Event::new("e", 1, "started", serde_json::json!({"n": 1}));
        assert_eq!(appended.created_at, None);
        store.append(std::slice::from_ref(&appended)).await.unwrap();
        let read = store.read_events("e").await.unwrap();
        assert_eq!(read, [appended]);
        let at = read[0].created_at.expect("a stored event's time");
        assert!(at >= before && at <= std::time::SystemTime::now(), "{at:?}");
    }
    block_on(async {
        check(&MemoryEventStore::new()).await;
        check(&SqliteEventStore::open_in_memory().unwrap()).await;
        check(&TenantScopedEventStore::new(
            ShardedEventStore::new(vec![MemoryEventStore::new(), MemoryEventStore::new()]),
            tenant("acme"),
        ))
        .await;
    });
}

/// Stores as trait objects (`pgloom::dyn_stores`) keep every rule:
/// the kits run on boxed and shared ones, of each backend.
#[test]
fn stores_as_trait_objects_conform() {
    use pgloom::conformance::{check_snapshot_store, Fidelity};
    use pgloom::dyn_stores::{DynBranchRegistry, DynEventStore, DynSnapshotStore};
    use pgloom::snapshot_store::{Codec, MemorySnapshotStore, SqliteSnapshotStore};
    block_on(async {
        let events: Vec<Box<dyn DynEventStore>> = vec![
            Box::new(MemoryEventStore::new()),
            Box::new(SqliteEventStore::open_in_memory().unwrap()),
        ];
        for store in &events {
            check_event_store(store).await.unwrap();
        }
        let shared: Arc<dyn DynEventStore> = Arc::new(TenantScopedEventStore::new(
            MemoryEventStore::new(),
            tenant("acme"),
        ));
        check_event_store(&shared).await.unwrap();
        assert_eq!(
            EventStore::id_scope(&shared),
            pgloom::id_scope::IdScope::Prefix("acme/".into())
        );
        let snapshots: Vec<Arc<dyn DynSnapshotStore>> = vec![
            Arc::new(MemorySnapshotStore::new(Codec::Zstd).unwrap()),
            Arc::new(SqliteSnapshotStore::open_in_memory(Codec::None).unwrap()),
        ];
        for (store, codec) in snapshots.iter().zip([Codec::Zstd, Codec::None]) {
            check_snapshot_store(store, codec, Fidelity::Exact)
                .await
                .unwrap();
        }
        let registries: Vec<Box<dyn DynBranchRegistry>> = vec![
            Box::new(MemoryBranchRegistry::new()),
            Box::new(SqliteBranchRegistry::open_in_memory().unwrap()),
        ];
        for registry in &registries {
            check_branch_registry(registry).await.unwrap();
        }
    });
}

/// One configuration opens all three stores, sharded alike: the kits pass
/// on each, and each tenant resumes its own through views over them.
#[test]
fn one_configuration_opens_every_store() {
    use common::tenants::two_tenants;
    use pgloom::conformance::{check_resume_and_retention, check_snapshot_store, Fidelity};
    use pgloom::event_store::StoreConfig;
    use pgloom::snapshot_store::{Codec, TenantScopedSnapshotStore};
    use pgloom::stores::StoresOptions;
    let dir = std::env::temp_dir().join(format!("loom-stores-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("app.db");
    block_on(async {
        for (config, codec) in [
            ("memory:".to_owned(), Codec::Zstd),
            ("sqlite::memory:".to_owned(), Codec::None),
            (format!("sqlite:{}", file.display()), Codec::Zstd),
            ("memory:;memory:;memory:".to_owned(), Codec::Zstd),
        ] {
            let parsed: StoreConfig = config.parse().unwrap();
            let open = || async {
                parsed
                    .open_stores(StoresOptions::new().codec(codec))
                    .await
                    .unwrap()
            };
            let stores = open().await;
            check_event_store(&stores.events)
                .await
                .unwrap_or_else(|f| panic!("{config}: {f}"));
            check_snapshot_store(&stores.snapshots, codec, Fidelity::Exact)
                .await
                .unwrap_or_else(|f| panic!("{config}: {f}"));
            check_branch_registry(&stores.refs)
                .await
                .unwrap_or_else(|f| panic!("{config}: {f}"));
            check_resume_and_retention(&stores.events, &stores.snapshots)
                .await
                .unwrap_or_else(|f| panic!("{config}: {f}"));
            if config != "memory:" && !config.starts_with("sqlite:") {
                continue;
            }
            // Fresh stores of the same configuration (a file: the same
            // database again, so two tenants beside what the kits left).
            let stores = open().await;
            two_tenants(
                Arc::new(stores.events.clone()),
                Arc::new(stores.snapshots.clone()),
                TenantScopedEventStore::new,
                TenantScopedSnapshotStore::new,
            )
            .await;
        }
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

//! One tenant never reads another's state, through every composition of
//! the tenant views: events and snapshots on memory and SQLite, sealed,
//! profiled, sharded, nested; and a resume over stores that name
//! executions differently is refused before it reads anything.
//! (PostgreSQL: `tests/store/snapshot_stores.rs` at the repository root.)

mod common;

use std::sync::Arc;

use common::tenants::{refused, resumes_its_own, tenant, two_tenants, write};
use common::{block_on, snapshot};
use pgloom::conformance::{check_resume_and_retention, check_snapshot_store, Fidelity};
use pgloom::event_store::{
    EventStore, MemoryEventStore, ShardedEventStore, SqliteEventStore, TenantId,
    TenantScopedEventStore,
};
use pgloom::id_scope::IdScope;
use pgloom::snapshot_store::{
    Codec, EncryptingSnapshotStore, KeyRing, Measure, MemorySnapshotStore, ProfilingSnapshotStore,
    SnapshotStore, SqliteSnapshotStore, TenantScopedSnapshotStore,
};
use pgloom::Error;

fn keys() -> KeyRing {
    KeyRing::new("k1", [7; 32])
}

#[test]
fn each_tenant_resumes_its_own_on_memory_and_sqlite() {
    block_on(async {
        two_tenants(
            Arc::new(MemoryEventStore::new()),
            Arc::new(MemorySnapshotStore::new(Codec::None).unwrap()),
            TenantScopedEventStore::new,
            TenantScopedSnapshotStore::new,
        )
        .await;
        two_tenants(
            Arc::new(SqliteEventStore::open_in_memory().unwrap()),
            Arc::new(SqliteSnapshotStore::open_in_memory(Codec::Zstd).unwrap()),
            TenantScopedEventStore::new,
            TenantScopedSnapshotStore::new,
        )
        .await;
    });
}

#[test]
fn sealed_and_profiled_views_keep_their_tenant() {
    block_on(async {
        // The view outside the sealing (sealed under the stored id)...
        two_tenants(
            Arc::new(MemoryEventStore::new()),
            Arc::new(EncryptingSnapshotStore::new(
                MemorySnapshotStore::new(Codec::None).unwrap(),
                keys(),
            )),
            TenantScopedEventStore::new,
            TenantScopedSnapshotStore::new,
        )
        .await;
        // ...inside it, and under a profiler: decorators report the view's
        // scope, so they pair with the tenant's events alone.
        two_tenants(
            Arc::new(MemoryEventStore::new()),
            Arc::new(MemorySnapshotStore::new(Codec::Zstd).unwrap()),
            TenantScopedEventStore::new,
            |shared, tenant| {
                ProfilingSnapshotStore::new(
                    EncryptingSnapshotStore::new(
                        TenantScopedSnapshotStore::new(shared, tenant),
                        keys(),
                    ),
                    Measure::Json,
                )
                .unwrap()
            },
        )
        .await;
    });
}

#[test]
fn a_sealed_state_copied_to_another_tenant_does_not_open() {
    block_on(async {
        let shared = Arc::new(MemorySnapshotStore::new(Codec::None).unwrap());
        let sealed = Arc::new(EncryptingSnapshotStore::new(shared.clone(), keys()));
        let acme = TenantScopedSnapshotStore::new(sealed.clone(), tenant("acme"));
        let initech = TenantScopedSnapshotStore::new(sealed, tenant("initech"));
        acme.save(&snapshot("run-1", 1, r#"{"secret":1}"#))
            .await
            .unwrap();
        let stolen = shared.load_latest("acme/run-1").await.unwrap().unwrap();
        shared
            .save(&pgloom::snapshot_store::NewSnapshot::new(
                "initech/run-1",
                stolen.workflow_id,
                stolen.sequence,
                stolen.state,
            ))
            .await
            .unwrap();
        assert!(matches!(
            initech.load_latest("run-1").await,
            Err(Error::Seal(_))
        ));
    });
}

#[test]
fn sharded_and_nested_views_pair_only_with_their_own_scope() {
    block_on(async {
        // Shards each scoped to the tenant: the sharded store has the
        // tenant's scope, and pairs with its snapshot view.
        let shards = || {
            Arc::new(ShardedEventStore::new(
                (0..3).map(|_| Arc::new(MemoryEventStore::new())).collect(),
            ))
        };
        let shards_of = |sharded: Arc<ShardedEventStore<Arc<MemoryEventStore>>>, t: TenantId| {
            ShardedEventStore::new(
                sharded
                    .shards()
                    .iter()
                    .map(|shard| TenantScopedEventStore::new(shard.clone(), t.clone()))
                    .collect(),
            )
        };
        two_tenants(
            shards(),
            Arc::new(MemorySnapshotStore::new(Codec::None).unwrap()),
            shards_of,
            TenantScopedSnapshotStore::new,
        )
        .await;
        // A view of a sharded store.
        two_tenants(
            shards(),
            Arc::new(MemorySnapshotStore::new(Codec::None).unwrap()),
            TenantScopedEventStore::new,
            TenantScopedSnapshotStore::new,
        )
        .await;
        // Views of views: acme's eu tenant pairs with acme's eu snapshots
        // only, not with acme's, nor with an "eu" tenant of the shared store.
        let (events, snapshots) = (
            Arc::new(MemoryEventStore::new()),
            Arc::new(MemorySnapshotStore::new(Codec::None).unwrap()),
        );
        let acme_events = Arc::new(TenantScopedEventStore::new(events.clone(), tenant("acme")));
        let acme_snapshots = Arc::new(TenantScopedSnapshotStore::new(
            snapshots.clone(),
            tenant("acme"),
        ));
        let eu_events = TenantScopedEventStore::new(acme_events.clone(), tenant("eu"));
        let eu_snapshots = TenantScopedSnapshotStore::new(acme_snapshots.clone(), tenant("eu"));
        assert_eq!(eu_events.id_scope(), IdScope::Prefix("acme/eu/".into()));
        write("acme/eu", &eu_events, &eu_snapshots, 2, 1).await;
        resumes_its_own("acme/eu", &eu_events, &eu_snapshots, 2, 1).await;
        refused(&eu_events, &acme_snapshots).await;
        refused(
            &eu_events,
            &TenantScopedSnapshotStore::new(snapshots.clone(), tenant("eu")),
        )
        .await;
        assert!(snapshots
            .load_latest("acme/eu/run-1")
            .await
            .unwrap()
            .is_some());
        // Shards of different tenants name nothing together.
        let mixed = ShardedEventStore::new(vec![
            TenantScopedEventStore::new(events.clone(), tenant("acme")),
            TenantScopedEventStore::new(events.clone(), tenant("initech")),
        ]);
        assert_eq!(mixed.id_scope(), IdScope::Mixed);
        refused(
            &mixed,
            &TenantScopedSnapshotStore::new(snapshots, tenant("acme")),
        )
        .await;
    });
}

#[test]
fn a_tenant_view_conforms_beside_a_neighbour() {
    block_on(async {
        for codec in [Codec::None, Codec::Zstd] {
            let shared = Arc::new(MemorySnapshotStore::new(codec).unwrap());
            let events = Arc::new(MemoryEventStore::new());
            // A neighbour whose ids sort right beside acme's.
            let neighbour = TenantScopedSnapshotStore::new(shared.clone(), tenant("acme-eu"));
            neighbour
                .save(&snapshot("resume-kit", 1, r#"{"n":1}"#))
                .await
                .unwrap();
            let acme = TenantScopedSnapshotStore::new(shared.clone(), tenant("acme"));
            check_snapshot_store(&acme, codec, Fidelity::Exact)
                .await
                .unwrap_or_else(|f| panic!("{codec}: {f}"));
            let acme_events = TenantScopedEventStore::new(events, tenant("acme"));
            check_resume_and_retention(&acme_events, &acme)
                .await
                .unwrap_or_else(|f| panic!("{codec}: {f}"));
            // The neighbour's snapshot is untouched by acme's retention.
            assert_eq!(
                neighbour.latest_sequence("resume-kit").await.unwrap(),
                Some(1)
            );
        }
    });
}

#[test]
fn a_tenant_view_refuses_an_empty_id() {
    block_on(async {
        let acme = TenantScopedSnapshotStore::new(
            MemorySnapshotStore::new(Codec::None).unwrap(),
            tenant("acme"),
        );
        assert!(matches!(
            acme.save(&snapshot("", 1, "{}")).await,
            Err(Error::InvalidTenant(_))
        ));
        assert!(matches!(
            acme.load_latest("").await,
            Err(Error::InvalidTenant(_))
        ));
    });
}

#[test]
fn a_duplicate_through_a_tenant_view_names_the_tenants_own_id() {
    block_on(async {
        for inner in [
            Arc::new(MemoryEventStore::new()) as Arc<dyn pgloom::dyn_stores::DynEventStore>,
            Arc::new(SqliteEventStore::open_in_memory().unwrap()),
        ] {
            let acme = TenantScopedEventStore::new(inner, tenant("acme"));
            let event = pgloom::event_store::Event::new("run-1", 1, "s", serde_json::json!({}));
            acme.append(std::slice::from_ref(&event)).await.unwrap();
            match acme.append(std::slice::from_ref(&event)).await {
                Err(Error::DuplicateEvent {
                    execution_id,
                    sequence: 1,
                }) => assert_eq!(execution_id, "run-1"),
                other => panic!("expected a duplicate of run-1, got {other:?}"),
            }
        }
    });
}

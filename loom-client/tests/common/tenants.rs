//! The tenant-isolation kit the tenant tests share: two tenants over one
//! pair of shared stores, each resuming its own, no pairing across scopes.

use std::sync::Arc;

use pgloom::event_store::{Event, EventStore, TenantId};
use pgloom::resume::resume;
use pgloom::snapshot_store::SnapshotStore;
use pgloom::Error;

use super::snapshot;

pub fn tenant(id: &str) -> TenantId {
    TenantId::new(id).unwrap()
}

/// Writes `tenant`'s `run-1` through its two views: `events` events, and
/// a snapshot at `at` whose state names the tenant.
pub async fn write(
    name: &str,
    events: &impl EventStore,
    snapshots: &impl SnapshotStore,
    count: i64,
    at: i64,
) {
    for n in 1..=count {
        events
            .append(&[Event::new(
                "run-1",
                n,
                "step",
                serde_json::json!({ "tenant": name, "n": n }),
            )])
            .await
            .unwrap();
    }
    snapshots
        .save(&snapshot("run-1", at, &format!(r#"{{"tenant":"{name}"}}"#)))
        .await
        .unwrap();
}

/// What `tenant` resumes `run-1` from through its two views: its own
/// snapshot and its own events after it, named as it named them.
pub async fn resumes_its_own(
    name: &str,
    events: &impl EventStore,
    snapshots: &impl SnapshotStore,
    count: i64,
    at: i64,
) {
    let resumed = resume(events, snapshots, "run-1").await.unwrap();
    let snapshot = resumed.snapshot.expect("its snapshot");
    assert_eq!(snapshot.execution_id, "run-1", "{name}");
    assert_eq!(
        snapshot.state.parse::<serde_json::Value>().unwrap(),
        serde_json::json!({ "tenant": name }),
        "{name} read another tenant's state"
    );
    assert_eq!(
        resumed
            .events
            .iter()
            .map(|e| e.sequence)
            .collect::<Vec<_>>(),
        ((at + 1)..=count).collect::<Vec<_>>(),
        "{name}"
    );
    for event in &resumed.events {
        assert_eq!(event.execution_id, "run-1");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(event.payload.as_str()).unwrap(),
            serde_json::json!({ "tenant": name, "n": event.sequence }),
            "{name} read another tenant's event"
        );
    }
}

/// A resume over `events` and `snapshots` is refused, naming both scopes.
pub async fn refused(events: &impl EventStore, snapshots: &impl SnapshotStore) {
    match resume(events, snapshots, "run-1").await {
        Err(Error::ScopeMismatch {
            events: e,
            snapshots: s,
        }) => {
            assert_eq!(e, events.id_scope());
            assert_eq!(s, snapshots.id_scope());
        }
        other => panic!(
            "a resume over {} and {} must be refused, got {other:?}",
            events.id_scope(),
            snapshots.id_scope()
        ),
    }
}

/// Two tenants (acme, 3 events and a snapshot at 1; initech, 5 and at 3)
/// over the shared `events` and `snapshots`, through `event_view` and
/// `snapshot_view`: each resumes its own, and no tenant's events pair with
/// another's snapshots, or with the shared ones.
pub async fn two_tenants<E, S, EV, SV>(
    events: Arc<E>,
    snapshots: Arc<S>,
    event_view: impl Fn(Arc<E>, TenantId) -> EV,
    snapshot_view: impl Fn(Arc<S>, TenantId) -> SV,
) where
    E: EventStore,
    S: SnapshotStore,
    EV: EventStore,
    SV: SnapshotStore,
{
    let acme = (
        event_view(events.clone(), tenant("acme")),
        snapshot_view(snapshots.clone(), tenant("acme")),
    );
    let initech = (
        event_view(events.clone(), tenant("initech")),
        snapshot_view(snapshots.clone(), tenant("initech")),
    );
    write("acme", &acme.0, &acme.1, 3, 1).await;
    write("initech", &initech.0, &initech.1, 5, 3).await;
    resumes_its_own("acme", &acme.0, &acme.1, 3, 1).await;
    resumes_its_own("initech", &initech.0, &initech.1, 5, 3).await;
    refused(&acme.0, &initech.1).await;
    refused(&initech.0, &acme.1).await;
    refused(&acme.0, &snapshots).await;
    refused(&events, &acme.1).await;
    // The shared stores hold no bare `run-1`: each tenant's is under its
    // prefix.
    assert!(snapshots.load_latest("run-1").await.unwrap().is_none());
    assert!(events.read_events("run-1").await.unwrap().is_empty());
}

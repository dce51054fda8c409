//! The spans and metrics each store operation emits, on PostgreSQL and on
//! SQLite, caught by a capturing subscriber and a debugging recorder. Both
//! are process-wide (SQLite's work runs on tokio's blocking threads), so
//! each case takes [`observe`]'s lock: one case at a time emits, and each
//! sees only its own spans and metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use loom_harness::{runtime, Cluster};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use pgloom::event_store::{Event, EventStore, PgEventStore, SqliteEventStore};
use pgloom::migrate::{migrate, MigrateOptions, MigrationProgress};
use pgloom::retention::{sweep_idle_executions, sweep_idle_sqlite};
use pgloom::snapshot_store::{
    Codec, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotQuery,
    SnapshotStore, SqliteSnapshotStore,
};
use pgloom::telemetry::{OPERATION_DURATION, SNAPSHOT_DECODE_DURATION, SNAPSHOT_STORED_BYTES};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span as it closed: its fields, as text.
type Fields = BTreeMap<String, String>;

/// Keeps every closed span's fields.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Fields>>>);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut extensions = span.extensions_mut();
        values.record(&mut Visitor(extensions.get_mut::<Fields>().unwrap()));
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions_mut().remove::<Fields>().unwrap();
        self.0.lock().unwrap().push(fields);
    }
}

impl Capture {
    fn take(&self) -> Vec<Fields> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// The one span of `operation` among `spans`.
fn span<'a>(spans: &'a [Fields], operation: &str) -> &'a Fields {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.get("db.operation.name").map(String::as_str) == Some(operation))
        .collect();
    assert_eq!(found.len(), 1, "one {operation} span in {spans:#?}");
    found[0]
}

fn field<'a>(span: &'a Fields, name: &str) -> Option<&'a str> {
    span.get(name).map(String::as_str)
}

/// The metrics recorded since the last look: (name, labels) -> how many
/// histogram samples, or the counter's value.
fn metrics(snapshotter: &Snapshotter) -> BTreeMap<(String, Vec<String>), u64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (_, key) = key.into_parts();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let n = match value {
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Counter(n) => n,
                DebugValue::Gauge(_) => 0,
            };
            ((key.name().to_owned(), labels), n)
        })
        .collect()
}

const SECRET_PAYLOAD: &str = "secret-payload-7f3a";
const SECRET_STATE: &str = "secret-state-91c2";

fn state() -> JsonText {
    JsonText::new(format!(
        r#"{{"note":"{SECRET_STATE}","log":"{}"}}"#,
        "tool call ".repeat(100)
    ))
    .unwrap()
}

/// The process's subscriber and recorder, installed once.
struct Observer {
    capture: Capture,
    snapshotter: Snapshotter,
}

/// One case's hold on the observer: the spans and metrics of what ran
/// before it are dropped, and no other case emits until it ends (a case
/// that failed leaves the lock poisoned; the next takes it anyway).
fn observe() -> (MutexGuard<'static, ()>, &'static Observer) {
    static OBSERVER: OnceLock<Observer> = OnceLock::new();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let observer = OBSERVER.get_or_init(|| {
        let capture = Capture::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(capture.clone()),
        )
        .unwrap();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        Observer {
            capture,
            snapshotter,
        }
    });
    observer.capture.take();
    metrics(&observer.snapshotter);
    (guard, observer)
}

/// No payload, state or SQL in any of `spans`.
fn assert_nothing_secret(spans: &[Fields]) {
    for s in spans {
        for value in s.values() {
            assert!(
                !value.contains(SECRET_PAYLOAD)
                    && !value.contains(SECRET_STATE)
                    && !value.contains("SELECT"),
                "{s:?}"
            );
        }
    }
}

fn labels(pairs: &[&str]) -> Vec<String> {
    pairs.iter().map(|p| (*p).to_owned()).collect()
}

fn duration(system: &str, operation: &str) -> Vec<String> {
    labels(&[
        &format!("db.operation.name={operation}"),
        &format!("db.system.name={system}"),
    ])
}

fn secret_event(execution_id: &str, n: i64) -> Event {
    Event::new(
        execution_id,
        n,
        "step",
        serde_json::json!({ "p": SECRET_PAYLOAD }),
    )
}

/// The port a cluster's spans name.
fn port_of(cluster: Cluster) -> String {
    cluster
        .conninfo()
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port=").map(str::to_owned))
        .expect("a port in the conninfo")
}

/// A fresh database `db` on the icu cluster, migrated, with loom's event
/// and zstd snapshot stores over one pool.
struct PgStores {
    cluster: Cluster,
    db: &'static str,
    conninfo: String,
    events: PgEventStore,
    snapshots: PgSnapshotStore,
}

fn pg_stores(rt: &tokio::runtime::Runtime, db: &'static str) -> PgStores {
    let cluster = Cluster::Icu;
    drop(cluster.fresh_database_without_loom(db, ""));
    let conninfo = cluster.database(db);
    let mut options = MigrateOptions::new();
    options.snapshot_codec(Codec::Zstd);
    rt.block_on(migrate(&conninfo, &options)).unwrap();
    let pool = loom_harness::pg_pool(&conninfo, 2).unwrap();
    let events = PgEventStore::new(pool.clone());
    let mut snapshot_options = PgSnapshotStoreOptions::new();
    snapshot_options.codec(Codec::Zstd);
    let snapshots = rt
        .block_on(PgSnapshotStore::start(pool, &snapshot_options))
        .unwrap();
    PgStores {
        cluster,
        db,
        conninfo,
        events,
        snapshots,
    }
}

#[test]
fn migrate_reports_its_progress_and_emits_its_span() {
    let (_one, observer) = observe();
    let rt = runtime();
    let db = "loom_it_telemetry_migrate";
    drop(Cluster::Icu.fresh_database_without_loom(db, ""));
    let steps = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&steps);
    let mut options = MigrateOptions::new();
    options.snapshot_codec(Codec::Zstd).on_progress(move |p| {
        seen.lock().unwrap().push(match p {
            MigrationProgress::Started(step) => format!("start {step}"),
            MigrationProgress::Finished { step, outcome } => format!("{step}: {outcome}"),
            _ => "other".to_owned(),
        });
    });
    rt.block_on(migrate(&Cluster::Icu.database(db), &options))
        .unwrap();
    let steps = steps.lock().unwrap().clone();
    assert_eq!(
        steps.first().map(String::as_str),
        Some("start extension"),
        "{steps:?}"
    );
    assert!(
        steps.contains(&"snapshot frames: provisioned".to_owned()),
        "{steps:?}"
    );
    assert!(steps.contains(&"start collations".to_owned()), "{steps:?}");
    let spans = observer.capture.take();
    let s = span(&spans, "migrate");
    assert_eq!(field(s, "db.system.name"), Some("postgresql"), "{s:?}");
    assert_eq!(field(s, "otel.name"), Some("migrate"), "{s:?}");
    assert_eq!(field(s, "db.namespace"), Some(db), "{s:?}");
    assert_eq!(field(s, "server.address"), Some("127.0.0.1"), "{s:?}");
    assert_eq!(
        field(s, "server.port"),
        Some(port_of(Cluster::Icu).as_str()),
        "{s:?}"
    );
    assert_eq!(field(s, "error.type"), None, "{s:?}");
    assert_nothing_secret(&spans);
}

#[test]
fn every_postgres_operation_emits_its_span_naming_the_server_and_never_a_secret() {
    let (_one, observer) = observe();
    let rt = runtime();
    let pg = pg_stores(&rt, "loom_it_telemetry_spans");
    observer.capture.take();
    metrics(&observer.snapshotter);
    let (events, snapshots) = (&pg.events, &pg.snapshots);
    rt.block_on(async {
        events
            .append(&[secret_event("exec-1", 1), secret_event("exec-1", 2)])
            .await
            .unwrap();
        events.read_events_after("exec-1", None, 10).await.unwrap();
        events.list_executions_page(None, 10).await.unwrap();
        snapshots
            .save(&NewSnapshot::new("exec-1", "wf", 1, state()))
            .await
            .unwrap();
        snapshots
            .load("exec-1", SnapshotQuery::Latest)
            .await
            .unwrap()
            .unwrap();
        snapshots.resume("exec-1").await.unwrap();
        events.prune_events("exec-1", 100).await.unwrap();
        sweep_idle_executions(events, Duration::from_secs(86_400), 100, |_| {})
            .await
            .unwrap();
        events.delete_execution("exec-1", 100).await.unwrap();
        let check = events.verify_executions_index(100, |_| {}).await.unwrap();
        assert!(check.in_step(), "{check:?}");
        let repair = events.repair_executions_index(100, |_| {}).await.unwrap();
        assert_eq!((repair.added, repair.removed), (0, 0), "{repair:?}");
    });
    let spans = observer.capture.take();
    let port = port_of(pg.cluster);
    for operation in [
        "append",
        "read_events",
        "list_executions",
        "save_snapshot",
        "load_snapshot",
        "resume",
        "prune_events",
        "sweep_idle_executions",
        "delete_idle_executions",
        "delete_execution",
        "verify_executions_index",
        "repair_executions_index",
    ] {
        let s = span(&spans, operation);
        assert_eq!(field(s, "db.system.name"), Some("postgresql"), "{s:?}");
        assert_eq!(field(s, "otel.name"), Some(operation), "{s:?}");
        assert_eq!(field(s, "db.namespace"), Some(pg.db), "{s:?}");
        assert_eq!(field(s, "server.address"), Some("127.0.0.1"), "{s:?}");
        assert_eq!(field(s, "server.port"), Some(port.as_str()), "{s:?}");
        assert_eq!(field(s, "error.type"), None, "{s:?}");
    }
    for operation in [
        "append",
        "read_events",
        "save_snapshot",
        "load_snapshot",
        "resume",
        "prune_events",
    ] {
        assert_eq!(
            field(span(&spans, operation), "loom.execution_id"),
            Some("exec-1")
        );
    }
    assert_nothing_secret(&spans);

    let pg_metrics = metrics(&observer.snapshotter);
    for operation in ["append", "resume", "load_snapshot"] {
        assert_eq!(
            pg_metrics.get(&(OPERATION_DURATION.into(), duration("postgresql", operation))),
            Some(&1),
            "{operation}: {pg_metrics:#?}"
        );
    }
    assert!(
        pg_metrics[&(
            SNAPSHOT_STORED_BYTES.into(),
            labels(&["db.system.name=postgresql", "format=zstd"])
        )] > 0
    );
    // Loaded and resumed: two frames decoded in the client.
    assert_eq!(
        pg_metrics.get(&(SNAPSHOT_DECODE_DURATION.into(), labels(&["format=zstd"]))),
        Some(&2)
    );
}

#[test]
fn a_failed_append_is_a_span_and_a_metric_with_its_error_type() {
    let (_one, observer) = observe();
    let rt = runtime();
    let pg = pg_stores(&rt, "loom_it_telemetry_failed");
    rt.block_on(pg.events.append(&[secret_event("exec-1", 1)]))
        .unwrap();
    observer.capture.take();
    metrics(&observer.snapshotter);
    assert!(rt
        .block_on(pg.events.append(&[secret_event("exec-1", 1)]))
        .is_err());
    let spans = observer.capture.take();
    let failed = span(&spans, "append");
    // What a subscriber sees of a failed append (docs/client.md shows it).
    println!("failed append span: {failed:?}");
    assert_eq!(field(failed, "error.type"), Some("DuplicateEvent"));
    assert_eq!(field(failed, "loom.execution_id"), Some("exec-1"));
    assert_nothing_secret(&spans);
    let pg_metrics = metrics(&observer.snapshotter);
    assert_eq!(
        pg_metrics.get(&(
            OPERATION_DURATION.into(),
            labels(&[
                "db.operation.name=append",
                "db.system.name=postgresql",
                "error.type=DuplicateEvent"
            ])
        )),
        Some(&1),
        "{pg_metrics:#?}"
    );
    // None without an error: a series not recorded since the last look is
    // absent, or present with no samples.
    assert_eq!(
        pg_metrics
            .get(&(OPERATION_DURATION.into(), duration("postgresql", "append")))
            .map_or(0, |n| *n),
        0,
        "{pg_metrics:#?}"
    );
}

/// The generic resume over a PgEventStore and a PgSnapshotStore of one
/// pool sends loom_resume alone (issue 35: it made three round trips on
/// three checkouts); over another pool it reads the snapshot, the tail and
/// the latest sequence. Both give the same resume.
#[test]
fn resume_over_one_pool_is_one_operation_and_over_two_the_same_result() {
    let (_one, observer) = observe();
    let rt = runtime();
    let pg = pg_stores(&rt, "loom_it_telemetry_resume");
    let (events, snapshots) = (&pg.events, &pg.snapshots);
    rt.block_on(async {
        let event = |n| Event::new("exec-4", n, "step", serde_json::json!({ "n": n }));
        events.append(&[event(1), event(2)]).await.unwrap();
        snapshots
            .save(&NewSnapshot::new("exec-4", "wf", 1, state()))
            .await
            .unwrap();
        events.append(&[event(3)]).await.unwrap();
    });
    observer.capture.take();
    let shared = rt
        .block_on(pgloom::resume::resume(events, snapshots, "exec-4"))
        .unwrap();
    let operations = |spans: Vec<Fields>| -> Vec<String> {
        spans
            .iter()
            .filter_map(|s| field(s, "otel.name").map(str::to_owned))
            .collect()
    };
    assert_eq!(operations(observer.capture.take()), ["resume"]);
    let apart = PgEventStore::new(loom_harness::pg_pool(&pg.conninfo, 1).unwrap());
    let generic = rt
        .block_on(pgloom::resume::resume(&apart, snapshots, "exec-4"))
        .unwrap();
    let generic_operations = operations(observer.capture.take());
    assert!(
        generic_operations.len() >= 3 && !generic_operations.contains(&"resume".to_owned()),
        "{generic_operations:?}"
    );
    assert_eq!(shared.snapshot.as_ref().map(|s| s.sequence), Some(1));
    let sequences =
        |r: &pgloom::resume::Resume| r.events.iter().map(|e| e.sequence).collect::<Vec<_>>();
    assert_eq!(sequences(&shared), [2, 3]);
    assert_eq!(sequences(&generic), sequences(&shared));
    assert_eq!(
        shared
            .snapshot
            .as_ref()
            .map(|s| s.state.as_str().to_owned()),
        generic
            .snapshot
            .as_ref()
            .map(|s| s.state.as_str().to_owned())
    );
}

/// A SQLite file of its own, removed when dropped.
struct SqliteFile(std::path::PathBuf);

impl SqliteFile {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "loom-it-telemetry-{name}-{}.sqlite",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        SqliteFile(path)
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn every_sqlite_operation_emits_its_span_naming_the_file_and_never_a_secret() {
    let (_one, observer) = observe();
    let rt = runtime();
    let file = SqliteFile::new("spans");
    let events = SqliteEventStore::open(&file.0).unwrap();
    let snapshots = SqliteSnapshotStore::open(&file.0, Codec::Zstd).unwrap();
    rt.block_on(async {
        events.append(&[secret_event("exec-2", 1)]).await.unwrap();
        events.read_events_after("exec-2", None, 10).await.unwrap();
        events.list_executions_page(None, 0).await.unwrap_err();
        snapshots
            .save(&NewSnapshot::new("exec-2", "wf", 1, state()))
            .await
            .unwrap();
        snapshots
            .load("exec-2", SnapshotQuery::Latest)
            .await
            .unwrap()
            .unwrap();
        snapshots.verify_frames(10, |_| {}).await.unwrap();
    });
    let mut spans = observer.capture.take();
    // The sweep by age: its own span around those of the store operations
    // it runs.
    let swept = rt
        .block_on(sweep_idle_sqlite(
            &events,
            &snapshots,
            Duration::ZERO,
            100,
            |_| {},
        ))
        .unwrap();
    assert_eq!(swept.executions_deleted, 1);
    let sweep_spans = observer.capture.take();
    assert!(
        span(&sweep_spans, "execution_activity").contains_key("db.system.name"),
        "{sweep_spans:?}"
    );
    spans.push(span(&sweep_spans, "sweep_idle_executions").clone());
    let namespace = file.0.display().to_string();
    for operation in [
        "append",
        "read_events",
        "save_snapshot",
        "load_snapshot",
        "verify_frames",
        "sweep_idle_executions",
    ] {
        let s = span(&spans, operation);
        assert_eq!(field(s, "db.system.name"), Some("sqlite"), "{s:?}");
        assert_eq!(field(s, "db.namespace"), Some(namespace.as_str()), "{s:?}");
        assert_eq!(field(s, "server.address"), None, "{s:?}");
    }
    assert_eq!(
        field(span(&spans, "list_executions"), "error.type"),
        Some("InvalidPageSize")
    );
    assert_nothing_secret(&spans);
    assert_nothing_secret(&sweep_spans);
    let sqlite_metrics = metrics(&observer.snapshotter);
    assert!(
        sqlite_metrics[&(
            SNAPSHOT_STORED_BYTES.into(),
            labels(&["db.system.name=sqlite", "format=zstd"])
        )] > 0
    );
    // Loaded and verified.
    assert_eq!(
        sqlite_metrics.get(&(SNAPSHOT_DECODE_DURATION.into(), labels(&["format=zstd"]))),
        Some(&2)
    );
}

/// A state too small for zstd to shrink is stored as a 0x01 (json) frame,
/// and counted as one: its format byte and 7 bytes of JSON.
#[test]
fn a_state_too_small_to_shrink_is_counted_as_a_json_frame() {
    let (_one, observer) = observe();
    let rt = runtime();
    let file = SqliteFile::new("small");
    let snapshots = SqliteSnapshotStore::open(&file.0, Codec::Zstd).unwrap();
    rt.block_on(async {
        let small = JsonText::new(r#"{"a":1}"#.to_owned()).unwrap();
        snapshots
            .save(&NewSnapshot::new("exec-3", "wf", 1, small))
            .await
            .unwrap();
        snapshots
            .load("exec-3", SnapshotQuery::Latest)
            .await
            .unwrap()
            .unwrap();
    });
    assert_nothing_secret(&observer.capture.take());
    let sqlite_metrics = metrics(&observer.snapshotter);
    assert_eq!(
        sqlite_metrics.get(&(
            SNAPSHOT_STORED_BYTES.into(),
            labels(&["db.system.name=sqlite", "format=json"])
        )),
        Some(&8)
    );
    assert_eq!(
        sqlite_metrics.get(&(
            OPERATION_DURATION.into(),
            duration("sqlite", "load_snapshot")
        )),
        Some(&1)
    );
    assert_eq!(
        sqlite_metrics.get(&(SNAPSHOT_DECODE_DURATION.into(), labels(&["format=json"]))),
        Some(&1)
    );
    assert_eq!(
        sqlite_metrics
            .get(&(SNAPSHOT_DECODE_DURATION.into(), labels(&["format=zstd"])))
            .map_or(0, |n| *n),
        0
    );
}

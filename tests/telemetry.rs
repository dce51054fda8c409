//! The spans and metrics each store operation emits, on PostgreSQL and on
//! SQLite, caught by a capturing subscriber and a debugging recorder (both
//! process-wide: SQLite's work runs on tokio's blocking threads). One test,
//! so nothing else in this binary emits meanwhile.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
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

#[test]
fn every_store_operation_emits_its_span_and_metrics_on_postgres_and_sqlite() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let rt = runtime();

    // PostgreSQL: migrate first, with its progress.
    let db = "loom_it_telemetry";
    let cluster = Cluster::Icu;
    drop(cluster.fresh_database_without_loom(db, ""));
    let conninfo = cluster.database(db);
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
    rt.block_on(migrate(&conninfo, &options)).unwrap();
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

    let pool = loom_harness::pg_pool(&conninfo, 2).unwrap();
    let events = PgEventStore::new(pool.clone());
    let mut snapshot_options = PgSnapshotStoreOptions::new();
    snapshot_options.codec(Codec::Zstd);
    let snapshots = rt
        .block_on(PgSnapshotStore::start(pool, &snapshot_options))
        .unwrap();
    rt.block_on(async {
        let event = |n| {
            Event::new(
                "exec-1",
                n,
                "step",
                serde_json::json!({ "p": SECRET_PAYLOAD }),
            )
        };
        events.append(&[event(1), event(2)]).await.unwrap();
        assert!(events.append(&[event(2)]).await.is_err());
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
        sweep_idle_executions(&events, Duration::from_secs(86_400), 100, |_| {})
            .await
            .unwrap();
        events.delete_execution("exec-1", 100).await.unwrap();
        let check = events.verify_executions_index(100, |_| {}).await.unwrap();
        assert!(check.in_step(), "{check:?}");
        let repair = events.repair_executions_index(100, |_| {}).await.unwrap();
        assert_eq!((repair.added, repair.removed), (0, 0), "{repair:?}");
    });
    let spans = capture.take();
    let port = cluster
        .conninfo()
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port=").map(str::to_owned))
        .unwrap();
    for operation in [
        "migrate",
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
        assert_eq!(field(s, "db.namespace"), Some(db), "{s:?}");
        assert_eq!(field(s, "server.address"), Some("127.0.0.1"), "{s:?}");
        assert_eq!(field(s, "server.port"), Some(port.as_str()), "{s:?}");
        assert_eq!(field(s, "error.type"), None, "{s:?}");
    }
    for operation in [
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
    let appends: Vec<_> = spans
        .iter()
        .filter(|s| field(s, "db.operation.name") == Some("append"))
        .collect();
    assert_eq!(appends.len(), 2, "{appends:#?}");
    assert_eq!(field(appends[0], "error.type"), None);
    // What a subscriber sees of a failed append (docs/client.md shows it).
    println!("failed append span: {:?}", appends[1]);
    assert_eq!(field(appends[1], "error.type"), Some("DuplicateEvent"));
    assert_eq!(field(appends[1], "loom.execution_id"), Some("exec-1"));
    let pg_metrics = metrics(&snapshotter);

    // The generic resume over a PgEventStore and a PgSnapshotStore of one
    // pool sends loom_resume alone (issue 35: it made three round trips on
    // three checkouts); over another pool it reads the snapshot, the tail
    // and the latest sequence.
    rt.block_on(async {
        let event = |n| Event::new("exec-4", n, "step", serde_json::json!({ "n": n }));
        events.append(&[event(1), event(2)]).await.unwrap();
        snapshots
            .save(&NewSnapshot::new("exec-4", "wf", 1, state()))
            .await
            .unwrap();
        events.append(&[event(3)]).await.unwrap();
    });
    capture.take();
    let shared = rt
        .block_on(pgloom::resume::resume(&events, &snapshots, "exec-4"))
        .unwrap();
    let operations = |spans: Vec<Fields>| -> Vec<String> {
        spans
            .iter()
            .filter_map(|s| field(s, "otel.name").map(str::to_owned))
            .collect()
    };
    assert_eq!(operations(capture.take()), ["resume"]);
    let apart = PgEventStore::new(loom_harness::pg_pool(&conninfo, 1).unwrap());
    let generic = rt
        .block_on(pgloom::resume::resume(&apart, &snapshots, "exec-4"))
        .unwrap();
    let generic_operations = operations(capture.take());
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
    // Their decodes are not SQLite's, counted next.
    metrics(&snapshotter);

    // SQLite: the same operations, the file as the namespace.
    let path =
        std::env::temp_dir().join(format!("loom-it-telemetry-{}.sqlite", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let events = SqliteEventStore::open(&path).unwrap();
    let snapshots = SqliteSnapshotStore::open(&path, Codec::Zstd).unwrap();
    rt.block_on(async {
        let event = Event::new(
            "exec-2",
            1,
            "step",
            serde_json::json!({ "p": SECRET_PAYLOAD }),
        );
        events.append(&[event]).await.unwrap();
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
    let mut sqlite_spans = capture.take();
    // A state too small for zstd to shrink: stored as a 0x01 (json) frame,
    // and counted as one.
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
    let small_spans = capture.take();
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
    let sweep_spans = capture.take();
    assert!(
        span(&sweep_spans, "execution_activity").contains_key("db.system.name"),
        "{sweep_spans:?}"
    );
    sqlite_spans.push(span(&sweep_spans, "sweep_idle_executions").clone());
    let file = path.display().to_string();
    for operation in [
        "append",
        "read_events",
        "save_snapshot",
        "load_snapshot",
        "verify_frames",
        "sweep_idle_executions",
    ] {
        let s = span(&sqlite_spans, operation);
        assert_eq!(field(s, "db.system.name"), Some("sqlite"), "{s:?}");
        assert_eq!(field(s, "db.namespace"), Some(file.as_str()), "{s:?}");
        assert_eq!(field(s, "server.address"), None, "{s:?}");
    }
    assert_eq!(
        field(span(&sqlite_spans, "list_executions"), "error.type"),
        Some("InvalidPageSize")
    );
    let sqlite_metrics = metrics(&snapshotter);
    let _ = std::fs::remove_file(&path);

    // No payload, state or SQL in any span.
    for s in spans
        .iter()
        .chain(&sqlite_spans)
        .chain(&small_spans)
        .chain(&sweep_spans)
    {
        for value in s.values() {
            assert!(
                !value.contains(SECRET_PAYLOAD)
                    && !value.contains(SECRET_STATE)
                    && !value.contains("SELECT"),
                "{s:?}"
            );
        }
    }

    let labels = |pairs: &[&str]| pairs.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
    let duration = |system: &str, operation: &str| {
        labels(&[
            &format!("db.operation.name={operation}"),
            &format!("db.system.name={system}"),
        ])
    };
    assert_eq!(
        pg_metrics.get(&(OPERATION_DURATION.into(), duration("postgresql", "append"))),
        Some(&1)
    );
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
    assert_eq!(
        pg_metrics.get(&(OPERATION_DURATION.into(), duration("postgresql", "resume"))),
        Some(&1)
    );
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
    // exec-2's and the small state's.
    assert_eq!(
        sqlite_metrics.get(&(
            OPERATION_DURATION.into(),
            duration("sqlite", "load_snapshot")
        )),
        Some(&2)
    );
    assert!(
        sqlite_metrics[&(
            SNAPSHOT_STORED_BYTES.into(),
            labels(&["db.system.name=sqlite", "format=zstd"])
        )] > 0
    );
    // The small state's frame: its format byte and 7 bytes of JSON.
    assert_eq!(
        sqlite_metrics.get(&(
            SNAPSHOT_STORED_BYTES.into(),
            labels(&["db.system.name=sqlite", "format=json"])
        )),
        Some(&8)
    );
    // Loaded and verified; the small frame loaded.
    assert_eq!(
        sqlite_metrics.get(&(SNAPSHOT_DECODE_DURATION.into(), labels(&["format=zstd"]))),
        Some(&2)
    );
    assert_eq!(
        sqlite_metrics.get(&(SNAPSHOT_DECODE_DURATION.into(), labels(&["format=json"]))),
        Some(&1)
    );
}

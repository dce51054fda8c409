//! Traces and metrics of every store operation.
//!
//! **Traces.** Each operation of the PostgreSQL and SQLite stores (append,
//! reads, pages, saves, loads, resume, retention, frame checks, migrate)
//! runs in a [`tracing`] span attributed as OpenTelemetry's database
//! client conventions say: `db.system.name` (`postgresql`, `sqlite`),
//! `db.operation.name` (the loom operation, also `otel.name`),
//! `db.namespace` (the database, or the SQLite file), `server.address` and
//! `server.port` (PostgreSQL over TCP), `error.type` on failure (the
//! SQLSTATE when the server raised it, else the [`Error`](crate::Error)
//! variant, [`Error::variant_name`](crate::Error::variant_name)) with
//! `db.response.status_code`, and loom's own `loom.execution_id` where the
//! operation has one. No payload, state or SQL text ever goes into a span.
//! A subscriber that exports OpenTelemetry (`tracing-opentelemetry`) turns
//! them into client spans; without a subscriber they cost next to nothing.
//!
//! **Metrics** (feature `metrics`), through the [`metrics`](https://docs.rs/metrics)
//! facade, to whichever recorder the service installs:
//!
//! | name | kind | unit | labels |
//! |---|---|---|---|
//! | [`OPERATION_DURATION`] `db.client.operation.duration` | histogram | s | `db.system.name`, `db.operation.name`, `error.type` (failures only) |
//! | [`SNAPSHOT_STORED_BYTES`] `loom.snapshot.stored_bytes` | counter | By | `db.system.name`, `format` (`zstd`, `json`, `jsonb`) |
//! | [`SNAPSHOT_DECODE_DURATION`] `loom.snapshot.decode.duration` | histogram | s | `format` (`zstd`, `json`) |
//!
//! Histogram buckets are the exporter's to set: [`DURATION_BUCKETS`] are
//! OpenTelemetry's recommended boundaries for `db.client.operation.duration`
//! (with `metrics-exporter-prometheus`, `set_buckets_for_metric`):
//!
//! ```text
//! use pgloom::telemetry::{DURATION_BUCKETS, OPERATION_DURATION};
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//! PrometheusBuilder::new()
//!     .set_buckets_for_metric(Matcher::Full(OPERATION_DURATION.into()), &DURATION_BUCKETS)?
//!     .install()?;
//! ```
//!
//! Long operations report progress through callbacks as well:
//! [`crate::retention::sweep_idle_executions`], `verify_frames` on the
//! snapshot stores, and [`crate::migrate::MigrateOptions::on_progress`].

#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod spans;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use spans::*;

/// Says that loom goes on in a degraded way (a zstd store writing JSONB,
/// watchers left to poll, a listener that lost its connection): always as
/// a `tracing` WARN event with target `pgloom::degraded`, which a service
/// sees whatever callbacks it set, and also to `callback` where the caller
/// gave one.
pub(crate) fn degraded(message: &str, callback: Option<&(dyn Fn(&str) + Send + Sync)>) {
    tracing::warn!(target: "pgloom::degraded", "{message}");
    if let Some(callback) = callback {
        callback(message);
    }
}

/// `db.client.operation.duration`: seconds an operation took, from its
/// call to its result.
pub const OPERATION_DURATION: &str = "db.client.operation.duration";
/// `loom.snapshot.stored_bytes`: bytes of snapshot state written, by the
/// format they were stored in.
pub const SNAPSHOT_STORED_BYTES: &str = "loom.snapshot.stored_bytes";
/// `loom.snapshot.decode.duration`: seconds decoding a frame took in the
/// client.
pub const SNAPSHOT_DECODE_DURATION: &str = "loom.snapshot.decode.duration";
/// OpenTelemetry's recommended bucket boundaries (seconds) for
/// `db.client.operation.duration`.
pub const DURATION_BUCKETS: [f64; 9] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];

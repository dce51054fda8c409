//! The spans and metrics themselves, for the stores that talk to a
//! database (see the parent module for what they carry).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pgloom_core::frame::{self, DecodeFrameError, Format};
use pgloom_core::json::JsonString;
use tracing::field::Empty;
use tracing::Instrument;

#[cfg(feature = "metrics")]
use super::{OPERATION_DURATION, SNAPSHOT_DECODE_DURATION, SNAPSHOT_STORED_BYTES};
use crate::{Error, Result};

/// The database a store talks to, as the conventions name it. Shared by a
/// store's clones.
#[derive(Debug)]
pub(crate) struct Database {
    system: &'static str,
    place: OnceLock<Place>,
}

#[derive(Debug)]
struct Place {
    namespace: String,
    address: Option<String>,
    port: Option<u16>,
}

impl Database {
    /// A PostgreSQL database, named once a connection has told
    /// ([`Database::learn`]): a pool does not say what it connects to.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgresql() -> Arc<Self> {
        Arc::new(Database {
            system: "postgresql",
            place: OnceLock::new(),
        })
    }

    /// A SQLite database: its file, or `:memory:`.
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(path: Option<&std::path::Path>) -> Arc<Self> {
        let place = OnceLock::new();
        let _ = place.set(Place {
            namespace: path.map_or(":memory:".to_owned(), |p| p.display().to_string()),
            address: None,
            port: None,
        });
        Arc::new(Database {
            system: "sqlite",
            place,
        })
    }

    /// `db.system.name`.
    #[cfg(feature = "metrics")]
    pub(crate) fn system(&self) -> &'static str {
        self.system
    }

    /// Asks the server, once per store, which database and address it is
    /// (a failure leaves them unrecorded; the operation goes on).
    #[cfg(feature = "postgres")]
    pub(crate) async fn learn(&self, client: &tokio_postgres::Client) {
        if self.place.get().is_some() {
            return;
        }
        let asked = client.query_typed_one(WHERE_AM_I, &[]).await;
        if let Ok(row) = asked {
            let (Ok(namespace), Ok(address), Ok(port)) = (
                row.try_get::<_, String>(0),
                row.try_get::<_, Option<String>>(1),
                row.try_get::<_, Option<i32>>(2),
            ) else {
                return;
            };
            let _ = self.place.set(Place {
                namespace,
                address,
                port: port.and_then(|p| u16::try_from(p).ok()),
            });
        }
    }
}

/// Which database and address a connection is, asked of the server:
/// `pg_catalog`'s functions by name, as every statement loom sends
/// (`crate::pg_schema`), since it runs in the store's session.
#[cfg(feature = "postgres")]
const WHERE_AM_I: &str = "SELECT pg_catalog.current_database()::pg_catalog.text,
        pg_catalog.host(pg_catalog.inet_server_addr()), pg_catalog.inet_server_port()";

/// Runs `work` as the operation `operation` on `db`: in its span, timed,
/// its failure recorded.
pub(crate) async fn traced<T>(
    db: &Database,
    operation: &'static str,
    execution_id: Option<&str>,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    let span = tracing::info_span!(
        "loom",
        "otel.name" = operation,
        "otel.kind" = "client",
        "db.system.name" = db.system,
        "db.operation.name" = operation,
        "db.namespace" = Empty,
        "server.address" = Empty,
        "server.port" = Empty,
        "loom.execution_id" = execution_id,
        "error.type" = Empty,
        "db.response.status_code" = Empty,
    );
    let started = Instant::now();
    let result = work.instrument(span.clone()).await;
    let elapsed = started.elapsed();
    if let Some(place) = db.place.get() {
        span.record("db.namespace", place.namespace.as_str());
        if let Some(address) = &place.address {
            span.record("server.address", address.as_str());
        }
        if let Some(port) = place.port {
            span.record("server.port", port);
        }
    }
    let error_type = result.as_ref().err().map(error_type);
    if let (Err(e), Some(error_type)) = (&result, error_type) {
        span.record("error.type", error_type);
        if let Some(code) = e.sqlstate() {
            span.record("db.response.status_code", code);
        }
    }
    record_duration(db, operation, elapsed, error_type);
    result
}

/// OpenTelemetry's `error.type`: the SQLSTATE the server raised, else the
/// variant of loom's error.
fn error_type(e: &Error) -> &str {
    e.sqlstate().unwrap_or_else(|| e.variant_name())
}

#[cfg(feature = "metrics")]
fn record_duration(
    db: &Database,
    operation: &'static str,
    elapsed: Duration,
    error_type: Option<&str>,
) {
    describe_once();
    let histogram = match error_type {
        None => metrics::histogram!(OPERATION_DURATION,
            "db.system.name" => db.system(), "db.operation.name" => operation),
        Some(error_type) => metrics::histogram!(OPERATION_DURATION,
            "db.system.name" => db.system(), "db.operation.name" => operation,
            "error.type" => error_type.to_owned()),
    };
    histogram.record(elapsed.as_secs_f64());
}

#[cfg(not(feature = "metrics"))]
fn record_duration(_: &Database, _: &'static str, _: Duration, _: Option<&str>) {}

/// Counts `bytes` of snapshot state stored as `format`.
#[cfg(feature = "metrics")]
pub(crate) fn snapshot_stored(db: &Database, format: &'static str, bytes: usize) {
    describe_once();
    metrics::counter!(SNAPSHOT_STORED_BYTES, "db.system.name" => db.system(), "format" => format)
        .increment(bytes as u64);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn snapshot_stored(_: &Database, _: &'static str, _: usize) {}

/// Counts a frame's bytes stored, by the format its first byte names: the
/// zstd codec writes `0x01` (json) when zstd would not make a state smaller.
pub(crate) fn frame_stored(db: &Database, frame: &[u8]) {
    snapshot_stored(db, frame_format(frame), frame.len());
}

/// A frame's format as its first byte names it (`zstd`, `json`).
fn frame_format(frame: &[u8]) -> &'static str {
    frame
        .first()
        .copied()
        .and_then(Format::from_byte)
        .map_or("unknown", Format::as_str)
}

/// Decodes a stored frame, timing it: a delta with `base`, the frame of
/// the keyframe it names (`None` for a keyframe, or where none was found).
pub(crate) fn decode_frame(
    stored: &[u8],
    base: Option<&[u8]>,
) -> Result<JsonString, DecodeFrameError> {
    #[cfg(feature = "metrics")]
    let started = Instant::now();
    let decoded = frame::delta::decode_json_with_base(stored, base);
    #[cfg(feature = "metrics")]
    if decoded.is_ok() {
        describe_once();
        metrics::histogram!(SNAPSHOT_DECODE_DURATION, "format" => frame_format(stored))
            .record(started.elapsed().as_secs_f64());
    }
    decoded
}

/// Describes loom's metrics to the recorder, once per process.
#[cfg(feature = "metrics")]
fn describe_once() {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(|| {
        metrics::describe_histogram!(
            OPERATION_DURATION,
            metrics::Unit::Seconds,
            "Duration of database client operations."
        );
        metrics::describe_counter!(
            SNAPSHOT_STORED_BYTES,
            metrics::Unit::Bytes,
            "Bytes of snapshot state stored, by format."
        );
        metrics::describe_histogram!(
            SNAPSHOT_DECODE_DURATION,
            metrics::Unit::Seconds,
            "Duration of decoding a snapshot frame in the client."
        );
    });
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    #[test]
    fn the_server_question_resolves_nothing_through_the_search_path() {
        crate::pg_schema::assert_resolves_nothing(super::WHERE_AM_I);
    }
}

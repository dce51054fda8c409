//! The `loom` command line (feature `cli`): `loom snapshot show` prints a
//! stored snapshot DECODED (ADR 0141 D7), through the same stores a service
//! uses, so either format decodes and a sealed one opens with the key ring.
//! Read-only. Exit 0 with the snapshot, 1 when there is none (or it cannot
//! be read), 2 on usage errors.

mod pretty;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};

use crate::event_store::{pg_pool_with, PgPoolOptions};
use crate::snapshot_store::{
    is_sealed, Codec, EncryptingSnapshotStore, KeyRing, PgSnapshotStore, PgSnapshotStoreOptions,
    Snapshot, SnapshotQuery, SnapshotStore, SqliteSnapshotStore,
};

/// loom: durable-workflow snapshots and logs in PostgreSQL or SQLite.
#[derive(Debug, Parser)]
#[command(name = "loom", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Print one stored snapshot, decoded, as indented JSON.
    Show {
        /// The database: a PostgreSQL URL or connection string
        /// (postgres://… or host=…), or a SQLite file path.
        #[arg(long)]
        db: String,
        /// The execution.
        execution_id: String,
        /// The snapshot at exactly this sequence (default: the latest).
        #[arg(long)]
        at: Option<i64>,
        /// Keys whose values are replaced by "[redacted]" wherever they
        /// occur in the state (comma-separated).
        #[arg(long, value_delimiter = ',')]
        redact: Vec<String>,
        /// A key ring file, to open sealed snapshots (else LOOM_KEYRING;
        /// never a secret on the command line).
        #[arg(long)]
        keys: Option<PathBuf>,
        /// PostgreSQL only: how long connecting (TCP, TLS and
        /// authentication together) may take before giving up. TLS follows
        /// the connection string's sslmode (disable, allow, prefer,
        /// require, verify-ca, verify-full) and sslrootcert.
        #[arg(long, value_name = "SECS", default_value_t = 5,
              value_parser = clap::value_parser!(u64).range(1..))]
        connect_timeout: u64,
    },
}

/// Runs the command line with the process's arguments.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start: {e}")),
    };
    match cli.command {
        Command::Snapshot(SnapshotCommand::Show {
            db,
            execution_id,
            at,
            redact,
            keys,
            connect_timeout,
        }) => match runtime.block_on(show(
            &db,
            &execution_id,
            at,
            keys,
            Duration::from_secs(connect_timeout),
        )) {
            Ok(Some(snapshot)) => {
                println!("{}", render(&snapshot, &redact));
                ExitCode::SUCCESS
            }
            Ok(None) => fail(&match at {
                Some(sequence) => format!("no snapshot of {execution_id:?} at sequence {sequence}"),
                None => format!("no snapshot of {execution_id:?}"),
            }),
            Err(message) => fail(&message),
        },
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("loom: {message}");
    ExitCode::FAILURE
}

fn is_postgres(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://") || db.contains('=')
}

fn key_ring(keys: Option<PathBuf>) -> Result<Option<KeyRing>, String> {
    let text = match keys {
        Some(path) => std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        None => match std::env::var("LOOM_KEYRING") {
            Ok(text) => text,
            Err(_) => return Ok(None),
        },
    };
    KeyRing::from_json(&text)
        .map(Some)
        .map_err(|e| e.to_string())
}

fn query(at: Option<i64>) -> SnapshotQuery {
    at.map_or(SnapshotQuery::Latest, SnapshotQuery::At)
}

async fn show_from<S: SnapshotStore>(
    store: S,
    execution_id: &str,
    at: Option<i64>,
    keys: Option<KeyRing>,
) -> Result<Option<Snapshot>, String> {
    let Some(found) = store
        .load(execution_id, query(at))
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    if !is_sealed(found.state.as_str()) {
        return Ok(Some(found));
    }
    let keys =
        keys.ok_or("the snapshot is sealed: give the key ring with --keys FILE or LOOM_KEYRING")?;
    let sealed = EncryptingSnapshotStore::new(store, keys);
    sealed
        .load(execution_id, SnapshotQuery::At(found.sequence))
        .await
        .map_err(|e| e.to_string())
}

async fn show(
    db: &str,
    execution_id: &str,
    at: Option<i64>,
    keys: Option<PathBuf>,
    connect_timeout: Duration,
) -> Result<Option<Snapshot>, String> {
    let keys = key_ring(keys)?;
    if is_postgres(db) {
        // Read-only: every transaction of this session refuses to write,
        // and a store without a codec does no DDL.
        let separator = if db.contains("://") {
            if db.contains('?') {
                "&"
            } else {
                "?"
            }
        } else {
            " "
        };
        let read_only = if db.contains("://") {
            format!("{db}{separator}options=-c%20default_transaction_read_only%3Don")
        } else {
            format!("{db} options='-c default_transaction_read_only=on'")
        };
        // One connection, and no wait past the timeout asked for: a
        // database that does not answer is an error, never a hang.
        let pool = pg_pool_with(
            &read_only,
            PgPoolOptions::new()
                .max_size(1)
                .create_timeout(connect_timeout)
                .wait_timeout(connect_timeout)
                .recycle_timeout(connect_timeout),
        )
        .map_err(|e| e.to_string())?;
        let store = PgSnapshotStore::connect(pool, &PgSnapshotStoreOptions::new())
            .await
            .map_err(|e| e.to_string())?;
        show_from(store, execution_id, at, keys).await
    } else {
        let store =
            SqliteSnapshotStore::open_read_only(db, Codec::None).map_err(|e| e.to_string())?;
        show_from(store, execution_id, at, keys).await
    }
}

fn render(snapshot: &Snapshot, redact: &[String]) -> String {
    let quoted = |text: &str| serde_json::Value::from(text).to_string();
    // ADR 0141 D7's fields in its order, then the state: indented, but
    // otherwise exactly as stored (no parse: key order and escapes stay).
    format!(
        "{{\n  \"id\": {},\n  \"executionId\": {},\n  \"workflowId\": {},\n  \"sequence\": {},\n  \"createdAt\": {},\n  \"state\": {}\n}}",
        snapshot.id,
        quoted(&snapshot.execution_id),
        quoted(&snapshot.workflow_id),
        snapshot.sequence,
        quoted(&rfc3339(snapshot.created_at)),
        pretty::indent(snapshot.state.as_str(), redact, 1),
    )
}

/// UTC, to the microsecond: `2026-11-30T21:08:28.123456Z`.
fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_timestamps() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_micros(1_796_073_708_123_456);
        assert_eq!(rfc3339(t), "2026-11-30T21:21:48.123456Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000Z");
    }
}

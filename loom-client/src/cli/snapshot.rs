//! `loom snapshot show`: a stored snapshot, decoded (ADR 0141 D7), through
//! the same stores a service uses, opened with the key ring when sealed,
//! printed as it is read.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{describe, fail, is_postgres, not_found, pretty, read_only_pool, Target};
use crate::snapshot_store::{
    is_sealed, Codec, EncryptingSnapshotStore, KeyRing, PgSnapshotStore, PgSnapshotStoreOptions,
    Snapshot, SnapshotQuery, SnapshotStore, SqliteSnapshotStore,
};

/// Prints the snapshot of `execution_id` (the latest, or the one `at` a
/// sequence), its keys named in `redact` redacted; exit 4 when there is
/// none.
pub(super) fn show(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    execution_id: &str,
    at: Option<i64>,
    redact: &[String],
    keys: Option<PathBuf>,
    json: bool,
) -> ExitCode {
    match runtime.block_on(read(
        target.db(),
        execution_id,
        at,
        keys,
        target.connect_timeout(),
    )) {
        Ok(Some(snapshot)) => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match write_snapshot(&mut out, &snapshot, redact, json).and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&format!("cannot print the snapshot: {e}")),
            }
        }
        Ok(None) => not_found(&match at {
            Some(sequence) => format!("no snapshot of {execution_id:?} at sequence {sequence}"),
            None => format!("no snapshot of {execution_id:?}"),
        }),
        Err(message) => fail(&message),
    }
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
        .map_err(|e| describe(&e))
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
        .map_err(|e| describe(&e))?
    else {
        return Ok(None);
    };
    let found = if is_sealed(found.state.as_str()) {
        let keys = keys
            .ok_or("the snapshot is sealed: give the key ring with --keys FILE or LOOM_KEYRING")?;
        let sealed = EncryptingSnapshotStore::new(store, keys);
        match sealed
            .load(execution_id, SnapshotQuery::At(found.sequence))
            .await
            .map_err(|e| describe(&e))?
        {
            Some(opened) => opened,
            None => return Ok(None),
        }
    } else {
        found
    };
    printable(found).map(Some)
}

/// `snapshot`, once its state is one JSON text. The state is printed as
/// it came, into an object (`--json`) and through the redaction of keys,
/// so text that is not JSON (a hostile server's: the stores take the
/// server's jsonb output as JSON unscanned) could end the object early or
/// slip a key past redaction.
fn printable(snapshot: Snapshot) -> Result<Snapshot, String> {
    require_json(snapshot.state.as_str(), "state", || {
        format!(
            "snapshot {} of {:?}",
            snapshot.sequence, snapshot.execution_id
        )
    })?;
    Ok(snapshot)
}

/// Refuses `text`, the `field` of what `owner` names, unless it is one
/// JSON text: what the commands check before they splice stored JSON into
/// their output as it came.
pub(super) fn require_json(
    text: &str,
    field: &str,
    owner: impl FnOnce() -> String,
) -> Result<(), String> {
    pgloom_core::json::validate(text.as_bytes())
        .map_err(|e| format!("{}: the {field} is not JSON: {e}", owner()))
}

async fn read(
    db: &str,
    execution_id: &str,
    at: Option<i64>,
    keys: Option<PathBuf>,
    connect_timeout: Duration,
) -> Result<Option<Snapshot>, String> {
    let keys = key_ring(keys)?;
    if is_postgres(db) {
        let pool = read_only_pool(db, connect_timeout)?;
        let store = PgSnapshotStore::start(pool, &PgSnapshotStoreOptions::new())
            .await
            .map_err(|e| describe(&e))?;
        show_from(store, execution_id, at, keys).await
    } else {
        let store =
            SqliteSnapshotStore::open_read_only(db, Codec::None).map_err(|e| describe(&e))?;
        show_from(store, execution_id, at, keys).await
    }
}

/// Prints `snapshot` to `out` as it is read, never built whole: the state
/// alone can be as large as a frame declares ([`pretty`] says how deep
/// nesting stays linear). `compact`: the same object on one line.
fn write_snapshot(
    out: &mut impl Write,
    snapshot: &Snapshot,
    redact: &[String],
    compact: bool,
) -> std::io::Result<()> {
    let quoted = |text: &str| serde_json::Value::from(text).to_string();
    // ADR 0141 D7's fields in its order, then the state: indented, but
    // otherwise exactly as stored (no parse: key order and escapes stay).
    let fields = [
        ("id", snapshot.id.to_string()),
        ("executionId", quoted(&snapshot.execution_id)),
        ("workflowId", quoted(&snapshot.workflow_id)),
        ("sequence", snapshot.sequence.to_string()),
        ("createdAt", quoted(&rfc3339(snapshot.created_at))),
    ];
    let (open, separator, close) = if compact {
        ("{", ":", "}\n")
    } else {
        ("{\n  ", ": ", "\n}\n")
    };
    out.write_all(open.as_bytes())?;
    for (name, value) in fields {
        write!(out, "\"{name}\"{separator}{value},")?;
        if !compact {
            out.write_all(b"\n  ")?;
        }
    }
    write!(out, "\"state\"{separator}")?;
    // Past the deepest indented level, write_indented adds no white space.
    let depth = if compact {
        pretty::MAX_INDENTED_DEPTH + 1
    } else {
        1
    };
    pretty::write_indented(out, snapshot.state.as_str(), redact, depth)?;
    out.write_all(close.as_bytes())
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

    /// Issue 25, item 6: `loom snapshot show` of a 50,000-deep state
    /// built its whole output, 2.5 GB of indentation, and aborted. The
    /// snapshot is written as it is read, in output linear in the state.
    #[test]
    fn a_deep_state_prints_in_output_linear_in_the_state() {
        for depth in [50_000, 400_000] {
            let state = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let snapshot = Snapshot {
                id: 1,
                execution_id: "exec-1".to_owned(),
                workflow_id: "w".to_owned(),
                sequence: 1,
                created_at: UNIX_EPOCH,
                state: crate::snapshot_store::JsonText::new(state.clone()).unwrap(),
            };
            let mut out = Vec::new();
            write_snapshot(&mut out, &snapshot, &[], false).unwrap();
            assert!(
                out.len() < 2 * state.len() + 200,
                "{depth} levels: {} bytes printed for {} bytes of state",
                out.len(),
                state.len()
            );
            assert!(out.ends_with(b"]\n}\n"));
        }
    }

    /// Text a hostile server sent as jsonb output, which the stores take
    /// unscanned, is refused before it is printed: here it would close
    /// the object and add a key of its own.
    #[test]
    fn a_state_that_is_not_json_is_refused_before_it_is_printed() {
        let snapshot = |state: &str| Snapshot {
            id: 1,
            execution_id: "exec-1".to_owned(),
            workflow_id: "w".to_owned(),
            sequence: 2,
            created_at: UNIX_EPOCH,
            state: crate::snapshot_store::JsonText::printed_by_server(state.to_owned()),
        };
        let injected = printable(snapshot(r#"1}, "executionId": "other", "x": {"#));
        assert!(
            matches!(&injected, Err(e) if e.contains("snapshot 2 of \"exec-1\": the state is not JSON")),
            "{injected:?}"
        );
        assert!(printable(snapshot(r#"{"a": [1, 2]}"#)).is_ok());
    }

    /// `--json`: the same object as the indented print, on one line, the
    /// state's tokens as stored (key order, duplicates, `1.0`, escapes),
    /// redaction included.
    #[test]
    fn json_prints_the_same_object_on_one_line() {
        let stored = r#"{"b": 1.0, "a": [1, {"apiKey": "s3cret"}], "b": "\u00e9"}"#;
        let snapshot = Snapshot {
            id: 7,
            execution_id: "exec-\"1\"".to_owned(),
            workflow_id: "w".to_owned(),
            sequence: 3,
            created_at: UNIX_EPOCH,
            state: crate::snapshot_store::JsonText::new(stored.to_owned()).unwrap(),
        };
        let print = |compact, redact: &[String]| {
            let mut out = Vec::new();
            write_snapshot(&mut out, &snapshot, redact, compact).unwrap();
            String::from_utf8(out).unwrap()
        };
        let line = print(true, &[]);
        assert_eq!(
            line,
            concat!(
                r#"{"id":7,"executionId":"exec-\"1\"","workflowId":"w","sequence":3,"#,
                r#""createdAt":"1970-01-01T00:00:00.000000Z","#,
                r#""state":{"b":1.0,"a":[1,{"apiKey":"s3cret"}],"b":"\u00e9"}}"#,
                "\n"
            )
        );
        let parsed = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert_eq!(parsed(&line), parsed(&print(false, &[])));
        let redacted = print(true, &["apiKey".to_owned()]);
        assert!(
            redacted.contains(r#"{"apiKey":"[redacted]"}"#),
            "{redacted}"
        );
        assert_eq!(redacted.lines().count(), 1);
    }
}

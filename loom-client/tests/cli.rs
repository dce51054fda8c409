//! `loom snapshot show`, run as the binary, against SQLite databases.
//! (Against Postgres: `tests/cli_postgres.rs` at the repository root.)

mod common;

use common::{block_on, snapshot};
use std::path::{Path, PathBuf};
use std::process::Command;

use pgloom::snapshot_store::{
    Codec, EncryptingSnapshotStore, KeyRing, LengthLeak, SnapshotStore, SqliteSnapshotStore,
};

fn database(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("loom-cli-{name}-{}.db", std::process::id()));
    std::fs::remove_file(&path).ok();
    path
}

fn loom(args: &[&str], db: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_loom"))
        .args(["snapshot", "show", "--db"])
        .arg(db)
        .args(args)
        .env_remove("LOOM_KEYRING")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn shows_the_latest_or_exactly_one_decoded_in_either_format() {
    let db = database("show");
    let big = format!(
        r#"{{"z":"last key first","log":"{}","a":"\ud800"}}"#,
        "agent tool ".repeat(50)
    );
    block_on(async {
        let zstd = SqliteSnapshotStore::open(&db, Codec::Zstd).unwrap();
        zstd.save(&snapshot("exec-1", 1, r#"{"turn":1}"#))
            .await
            .unwrap();
        zstd.save(&snapshot("exec-1", 3, &big)).await.unwrap();
        zstd.with_codec(Codec::None)
            .save(&snapshot("exec-1", 2, r#"{"plain":[1,2]}"#))
            .await
            .unwrap();
    });
    let (code, out, _) = loom(&["exec-1"], &db);
    assert_eq!(code, 0);
    let shown: serde_json::Value = serde_json::from_str(&out.replace("\\ud800", "?")).unwrap();
    assert_eq!(shown["sequence"], 3);
    assert_eq!(shown["executionId"], "exec-1");
    assert_eq!(shown["workflowId"], "agentLoop$");
    assert!(shown["createdAt"].as_str().unwrap().ends_with('Z'));
    // The state's own text: key order and escapes as stored, indented.
    assert!(
        out.contains("\"state\": {\n    \"z\": \"last key first\",\n    \"log\""),
        "{out}"
    );
    assert!(out.contains(r#""a": "\ud800""#), "{out}");

    let (code, out, _) = loom(&["exec-1", "--at", "2"], &db);
    assert_eq!(code, 0);
    assert!(
        out.contains("\"plain\": [\n      1,\n      2\n    ]"),
        "{out}"
    );

    let (code, out, err) = loom(&["exec-1", "--at", "4"], &db);
    assert_eq!(
        (code, out.as_str()),
        (4, ""),
        "never a neighbour: not found"
    );
    assert_eq!(err, "loom: no snapshot of \"exec-1\" at sequence 4\n");
    let (code, _, err) = loom(&["nobody"], &db);
    assert_eq!(code, 4, "not found");
    assert_eq!(err.lines().count(), 1);
    std::fs::remove_file(&db).ok();
}

/// `loom snapshot show` of a run saved as deltas: every save shows its own
/// state, read with the keyframe it names; a keyframe gone under its
/// delta is a typed error, exit 3, never another state.
#[test]
fn shows_a_delta_with_its_keyframe_and_refuses_one_without() {
    let db = database("deltas");
    let states: Vec<String> = (20..32)
        .map(|turns| loom_fixtures::agent_state(turns, false))
        .collect();
    block_on(async {
        let store = SqliteSnapshotStore::open(&db, Codec::Delta).unwrap();
        for (i, state) in states.iter().enumerate() {
            store
                .save(&snapshot("exec-1", i as i64 + 1, state))
                .await
                .unwrap();
        }
    });
    let c = rusqlite::Connection::open(&db).unwrap();
    let (delta_at, frame): (i64, Vec<u8>) = c
        .query_row(
            "SELECT sequence, state FROM loom_snapshots WHERE substr(state, 1, 1) = x'03'
             ORDER BY sequence DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    for at in [delta_at, i64::try_from(states.len()).unwrap()] {
        let (code, out, err) = loom(&["exec-1", "--at", &at.to_string(), "--json"], &db);
        assert_eq!(code, 0, "{err}");
        let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
        let expected: serde_json::Value =
            serde_json::from_str(&states[usize::try_from(at).unwrap() - 1]).unwrap();
        assert_eq!(shown["state"], expected, "at {at}");
    }
    let base = pgloom_core::frame::delta::base_sequence(&frame).unwrap();
    c.execute("DELETE FROM loom_snapshots WHERE sequence = ?1", [base])
        .unwrap();
    let (code, out, err) = loom(&["exec-1", "--at", &delta_at.to_string()], &db);
    // 3: the database could not be read (docs/client.md, exit codes).
    assert_eq!((code, out.as_str()), (3, ""), "{err}");
    assert!(err.contains("keyframe"), "{err}");
    std::fs::remove_file(&db).ok();
}

#[test]
fn redacts_keys_wherever_they_occur() {
    let db = database("redact");
    block_on(async {
        let store = SqliteSnapshotStore::open(&db, Codec::Zstd).unwrap();
        store
            .save(&snapshot(
                "exec-1",
                1,
                r#"{"apiKey":"sk-123","turns":[{"apiKey":{"nested":"sk-456"},"tool":"search"}]}"#,
            ))
            .await
            .unwrap();
    });
    let (code, out, _) = loom(&["exec-1", "--redact", "apiKey,other"], &db);
    assert_eq!(code, 0);
    assert!(!out.contains("sk-123") && !out.contains("sk-456"), "{out}");
    assert_eq!(out.matches("[redacted]").count(), 2);
    assert!(out.contains(r#""tool": "search""#));
    std::fs::remove_file(&db).ok();
}

#[test]
fn opens_sealed_snapshots_only_with_the_key_ring_from_a_file_or_the_environment() {
    let db = database("sealed");
    let key = [5u8; 32];
    block_on(async {
        let store = EncryptingSnapshotStore::compressing(
            SqliteSnapshotStore::open(&db, Codec::None).unwrap(),
            KeyRing::new("k1", key),
            LengthLeak::Accept,
        )
        .unwrap();
        store
            .save(&snapshot("exec-1", 1, r#"{"secret":"plans"}"#))
            .await
            .unwrap();
    });
    let (code, _, err) = loom(&["exec-1"], &db);
    assert_eq!(code, 3, "cannot be read");
    assert!(err.contains("sealed") && err.contains("--keys"), "{err}");

    use base64::Engine as _;
    let ring = format!(
        r#"{{"current":"k1","keys":{{"k1":"{}"}}}}"#,
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let keys = db.with_extension("keys.json");
    std::fs::write(&keys, &ring).unwrap();
    let (code, out, err) = loom(&["exec-1", "--keys", keys.to_str().unwrap()], &db);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(r#""secret": "plans""#), "{out}");
    let out = Command::new(env!("CARGO_BIN_EXE_loom"))
        .args(["snapshot", "show", "--db"])
        .arg(&db)
        .arg("exec-1")
        .env("LOOM_KEYRING", &ring)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().contains("plans"));
    std::fs::remove_file(&db).ok();
    std::fs::remove_file(&keys).ok();
}

#[test]
fn usage_errors_exit_2_and_a_missing_database_is_not_created() {
    let mut bare = Command::new(env!("CARGO_BIN_EXE_loom"));
    bare.args(["snapshot", "show", "exec-1"]);
    for (name, _) in std::env::vars() {
        if name.starts_with("PG") || name == "LOOM_DB" || name == "DATABASE_URL" {
            bare.env_remove(name);
        }
    }
    let out = bare.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "no --db and nothing in the environment"
    );
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("no database: give --db"));
    let db = database("absent");
    let (code, _, err) = loom(&["exec-1"], &db);
    assert_eq!(code, 3, "{err}");
    assert!(!db.exists(), "read-only: nothing created");
}

/// Issue 25, item 6: a 50,000-deep state (a 35-byte zstd frame any writer
/// can save) made `snapshot show` build 2.5 GB of indentation and abort.
/// Now it prints quickly, under a 512 MiB address-space limit, in output
/// within a small multiple of the state, and the same at 8 times the depth.
#[test]
fn a_deeply_nested_state_prints_in_memory_and_output_linear_in_it() {
    let db = database("deep");
    for (sequence, depth) in [(1, 50_000), (2, 400_000)] {
        let state = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        block_on(async {
            let store = SqliteSnapshotStore::open(&db, Codec::Zstd).unwrap();
            store
                .save(&snapshot("exec-deep", sequence, &state))
                .await
                .unwrap();
        });
        let started = std::time::Instant::now();
        // `ulimit -v` bounds the whole address space (in KiB): an output
        // built whole, or anything quadratic, cannot fit.
        let out = Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 524288 && exec \"$0\" snapshot show --db \"$1\" exec-deep --at \"$2\"")
            .arg(env!("CARGO_BIN_EXE_loom"))
            .arg(&db)
            .arg(sequence.to_string())
            .output()
            .unwrap();
        let elapsed = started.elapsed();
        assert!(
            out.status.success(),
            "{depth} levels: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout.len() < 2 * state.len() + 200,
            "{depth} levels: {} bytes printed for a state of {}",
            out.stdout.len(),
            state.len()
        );
        assert!(
            elapsed < std::time::Duration::from_secs(10),
            "{depth} levels: {elapsed:?}"
        );
        let compact: Vec<u8> = out
            .stdout
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        assert!(compact.ends_with(format!("\"state\":{state}}}").as_bytes()));
    }
    std::fs::remove_file(&db).ok();
}

/// Issue 25, item 7: every command echoed a `--db` it could not parse,
/// password and all ("missing \"=\" after \"postgre://app:pw@db1/app\""),
/// as did clap for a connection string given without `--db`. No message
/// may carry the string, or any word of it.
#[test]
fn no_command_repeats_a_connection_string_it_cannot_use() {
    let commands: [&[&str]; 7] = [
        &["snapshot", "show", "exec-1"],
        &["status"],
        &["status", "--json"],
        &["executions", "list"],
        &["events", "show", "exec-1"],
        &["retention", "--dry-run", "--older-than", "1d"],
        &["repair"],
    ];
    let migrate: &[&str] = &["migrate"];
    for db in [
        "postgre://app:pw@db1/app",
        "host=db1 password=pw bogus",
        "host=db1 password=my pw=x",
        "host=db1 password='pw",
        "postgres://app:pw@db1/app?pw=1",
        "postgres://app:pw@db1:pw/app",
        // Refused at connect: nothing listens on port 1.
        "postgres://app:pw@127.0.0.1:1/app",
        "host=127.0.0.1 port=1 user=app password=pw",
    ] {
        for command in commands.iter().chain([&migrate]) {
            let out = Command::new(env!("CARGO_BIN_EXE_loom"))
                .args(*command)
                .args(["--db", db, "--connect-timeout", "2"].iter().filter(|a| {
                    // migrate has no --connect-timeout.
                    !(command[0] == "migrate" && (**a == "--connect-timeout" || **a == "2"))
                }))
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{command:?} {db}: {said}");
            assert!(!said.is_empty(), "{command:?} {db}: a reason");
            assert!(!said.contains("pw"), "{command:?} {db}: {said}");
        }
        // Without --db, clap quotes what it cannot place.
        let out = Command::new(env!("CARGO_BIN_EXE_loom"))
            .args(["status", db])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !said.contains("pw") && said.contains("<redacted>"),
            "{db}: {said}"
        );
    }
}

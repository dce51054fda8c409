//! `loom snapshot show`, run as the binary, against SQLite databases.
//! (Against Postgres: `tests/cli_postgres.rs` at the repository root.)

mod common;

use common::{block_on, snapshot};
use std::path::{Path, PathBuf};
use std::process::Command;

use loom_client::snapshot_store::{
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
    assert_eq!((code, out.as_str()), (1, ""), "never a neighbour");
    assert_eq!(err, "loom: no snapshot of \"exec-1\" at sequence 4\n");
    let (code, _, err) = loom(&["nobody"], &db);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1);
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
    assert_eq!(code, 1);
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
    let out = Command::new(env!("CARGO_BIN_EXE_loom"))
        .args(["snapshot", "show", "exec-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--db is required");
    let db = database("absent");
    let (code, _, err) = loom(&["exec-1"], &db);
    assert_eq!(code, 1, "{err}");
    assert!(!db.exists(), "read-only: nothing created");
}

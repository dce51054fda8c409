//! `loom snapshot show` run as the binary against a real ICU en-US
//! database: frame rows, JSONB rows, libpq strings and URLs, read-only.

#[path = "../loom-client/tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::snapshot;
use loom_client::event_store::pg_pool;
use loom_client::snapshot_store::{Codec, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore};
use loom_harness::cli::{loom_bin, snapshot_show};
use loom_harness::Cluster;

#[test]
fn shows_frame_and_jsonb_rows_from_postgres_without_writing() {
    let db = "loom_it_cli";
    let mut sql = Cluster::Icu.fresh_database(db);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut options = PgSnapshotStoreOptions::new();
    options.codec(Codec::Zstd);
    let store = rt
        .block_on(PgSnapshotStore::connect(
            pg_pool(&Cluster::Icu.database(db), 1).unwrap(),
            &options,
        ))
        .unwrap();
    let framed = format!(r#"{{"z":1,"log":"{}","a":2}}"#, "agent tool ".repeat(40));
    for (sequence, state) in [(1, framed.as_str()), (2, r#"{"b":1}"#)] {
        rt.block_on(store.save(&snapshot("exec-1", sequence, state)))
            .unwrap();
    }
    sql.batch_execute("SELECT loom_save_snapshot('exec-1', 'agentLoop$', 3, '{\"jsonb\":true}')")
        .unwrap();
    let frames: i64 = sql
        .query_one("SELECT count(state_z) FROM loom.snapshots", &[])
        .unwrap()
        .get(0);
    assert_eq!(frames, 2);

    let conninfo = Cluster::Icu.database(db);
    let (code, out, _) = snapshot_show(&conninfo, &["exec-1", "--at", "1"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("\"state\": {\n    \"z\": 1,\n    \"log\""),
        "the frame's exact key order: {out}"
    );
    let (code, out, _) = snapshot_show(&conninfo, &["exec-1"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("\"sequence\": 3") && out.contains("\"jsonb\": true"),
        "{out}"
    );
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/{db}",
        conninfo
            .split("port=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
    );
    let (code, out, _) = snapshot_show(&url, &["exec-1", "--at", "2"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"b\": 1"), "{out}");
    let (code, out, _) = snapshot_show(&conninfo, &["exec-1", "--at", "9"]);
    assert_eq!((code, out.lines().count()), (1, 1), "{out}");
    // Read-only: the session refuses writes, so nothing changed.
    let rows: i64 = sql
        .query_one("SELECT count(*) FROM loom.snapshots", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 3);
}

#[test]
fn a_sealed_snapshot_in_a_jsonb_row_is_never_printed_as_the_state() {
    use base64::Engine as _;
    use loom_client::snapshot_store::{EncryptingSnapshotStore, KeyRing};
    let db = "loom_it_cli_sealed";
    let mut sql = Cluster::Icu.fresh_database(db);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = [9u8; 32];
    let inner = rt
        .block_on(PgSnapshotStore::connect(
            pg_pool(&Cluster::Icu.database(db), 1).unwrap(),
            &PgSnapshotStoreOptions::new(),
        ))
        .unwrap();
    let sealed = EncryptingSnapshotStore::new(inner, KeyRing::new("k1", key));
    rt.block_on(sealed.save(&snapshot("exec-1", 1, r#"{"secret":"plans"}"#)))
        .unwrap();
    // JSONB gives the envelope's keys back in its own order: "ct" first.
    let stored: String = sql
        .query_one("SELECT state::text FROM loom.snapshots", &[])
        .unwrap()
        .get(0);
    assert!(stored.starts_with(r#"{"ct": "#), "{stored}");

    let conninfo = Cluster::Icu.database(db);
    let (code, out, _) = snapshot_show(&conninfo, &["exec-1"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("sealed") && !out.contains("\"ct\""),
        "no ciphertext as the state: {out}"
    );
    let ring = format!(
        r#"{{"current":"k1","keys":{{"k1":"{}"}}}}"#,
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let out = Command::new(loom_bin())
        .args(["snapshot", "show", "--db", &conninfo, "exec-1"])
        .env("LOOM_KEYRING", &ring)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(r#""secret": "plans""#), "{stdout}");
}

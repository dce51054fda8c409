//! `loom snapshot show` run as the binary against a real ICU en-US
//! database: frame rows, JSONB rows, libpq strings and URLs, read-only.

#[path = "../loom-client/tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::snapshot;
use loom_harness::cli::{loom, loom_bin, snapshot_show};
use loom_harness::pg_pool;
use loom_harness::Cluster;
use pgloom::snapshot_store::{Codec, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore};

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
        .block_on(PgSnapshotStore::start(
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
    // --json: the frame's state on one line, its key order kept.
    let (code, out, _) = snapshot_show(&conninfo, &["exec-1", "--at", "1", "--json"]);
    assert_eq!((code, out.lines().count()), (0, 1), "{out}");
    assert!(out.contains(&format!(r#""state":{framed}}}"#)), "{out}");
    let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed["sequence"], 1);
    let (code, out, _) = snapshot_show(&conninfo, &["exec-1", "--at", "9"]);
    assert_eq!((code, out.lines().count()), (4, 1), "not found: {out}");
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
    use pgloom::snapshot_store::{EncryptingSnapshotStore, KeyRing};
    let db = "loom_it_cli_sealed";
    let mut sql = Cluster::Icu.fresh_database(db);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = [9u8; 32];
    let inner = rt
        .block_on(PgSnapshotStore::start(
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
    assert_eq!(code, 3, "cannot be read: {out}");
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

#[test]
fn status_says_what_needs_action_and_exits_1_until_it_is_done() {
    let db = "loom_it_cli_status";
    let mut sql = Cluster::Icu.fresh_database(db);
    let conninfo = Cluster::Icu.database(db);
    let (code, out, _) = loom(&["status", "--db", &conninfo], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing needs action"), "{out}");
    assert!(out.contains("executions index"), "{out}");

    // Drift: an id the index lists that the log has not. Plain status
    // reads catalogs only and does not look; --verify does, in batches.
    sql.batch_execute(
        "SELECT loom_append_event('e' || i, 1, 'step', '{}') FROM generate_series(1, 25) i;
         INSERT INTO loom.executions VALUES ('ghost')",
    )
    .unwrap();
    let (code, out, _) = loom(&["status", "--db", &conninfo], &[]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = loom(
        &["status", "--db", &conninfo, "--verify", "--batch-size", "7"],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("0 ids of the log missing, 1 ids without events (26 ids checked)"),
        "{out}"
    );
    assert!(
        out.contains("1 item(s) need action:\n  executions index: loom repair --db <db> (online, in batches)"),
        "{out}"
    );
    let (code, out, _) = loom(&["status", "--db", &conninfo, "--json", "--verify"], &[]);
    assert_eq!(code, 1, "{out}");
    let status: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(status["needs_action"], true);
    assert!(status["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["item"] == "executions index" && i["needs_action"] == true));

    // Read-only: the status wrote nothing, the fix is the operator's.
    let (code, out, _) = loom(&["repair", "--db", &conninfo, "--batch-size", "4"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with(
            "executions index: repaired online, 0 ids added, 1 removed (26 ids checked in "
        ),
        "{out}"
    );
    let (code, out, _) = loom(&["status", "--db", &conninfo, "--verify"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("in step with the log (25 ids checked in 1 batches"),
        "{out}"
    );

    let (code, out, _) = loom(&["status", "--db", "/tmp/some.sqlite"], &[]);
    assert_eq!(code, 2, "{out}");
}

#[test]
fn migrate_prints_each_step_and_exits_1_while_one_failed_soft() {
    let db = "loom_it_cli_migrate";
    let _setup = Cluster::Icu.fresh_database_at(db, "0.6.0");
    let conninfo = Cluster::Icu.database(db);
    // A session holding loom.events: 0.7.0's index drop waits 200 ms, then
    // fails soft, in the update and in the re-run.
    let mut holder = Cluster::Icu.hold_lock(db, "events", "ACCESS SHARE");
    let (code, out, _) = loom(
        &["migrate", "--db", &conninfo, "--lock-timeout-ms", "200"],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("loom 0.6.0 -> "), "{out}");
    assert!(
        out.contains("loom.idx_events_exec: skipped: 55P03"),
        "{out}"
    );
    assert_eq!(
        out.matches("WARNING 01000: loom: could not drop loom.idx_events_exec")
            .count(),
        2,
        "{out}"
    );
    holder.batch_execute("COMMIT").unwrap();
    let (code, out, _) = loom(&["migrate", "--db", &conninfo], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("loom.idx_events_exec: dropped"), "{out}");
    assert!(!out.contains("WARNING"), "{out}");
    let (code, out, _) = loom(&["status", "--db", &conninfo], &[]);
    assert_eq!(code, 0, "after the migration nothing needs action: {out}");

    let (code, out, _) = loom(
        &["migrate", "--db", &conninfo, "--snapshot-codec", "brotli"],
        &[],
    );
    assert_eq!(code, 2, "{out}");
}

#[test]
fn executions_list_and_events_show_page_the_log_exactly() {
    let db = "loom_it_cli_log";
    let mut sql = Cluster::Icu.fresh_database(db);
    sql.batch_execute(
        r#"SELECT loom_append_events(ARRAY['b', 'a_b', 'A1', 'b'], ARRAY[1, 1, 1, 2]::bigint[],
                                     ARRAY['started', 'started', 'started', 'tool'],
                                     ARRAY['{}', '{}', '{}', '{"n": 1.50, "deep": [[[]]]}']::jsonb[])"#,
    )
    .unwrap();
    let conninfo = Cluster::Icu.database(db);
    // Code point order, whatever en-US says.
    let (code, out, _) = loom(&["executions", "list", "--db", &conninfo], &[]);
    assert_eq!((code, out.as_str()), (0, "A1\na_b\nb\n"));
    let (code, out, _) = loom(
        &[
            "executions",
            "list",
            "--db",
            &conninfo,
            "--after",
            "A1",
            "--limit",
            "1",
        ],
        &[],
    );
    assert_eq!((code, out.as_str()), (0, "a_b\n"));
    let (code, _, _) = loom(
        &["executions", "list", "--db", &conninfo, "--after", "b"],
        &[],
    );
    assert_eq!(code, 4, "none after the cursor: not found");

    let (code, out, _) = loom(
        &["events", "show", "b", "--db", &conninfo, "--after", "1"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        "{\"sequence\":2,\"kind\":\"tool\",\"payload\":{\"n\": 1.50, \"deep\": [[[]]]}}\n"
    );
    let (code, _, _) = loom(&["events", "show", "nobody", "--db", &conninfo], &[]);
    assert_eq!(code, 4, "not found");

    // --json: one document each, payloads still exactly as stored.
    let (code, out, _) = loom(
        &[
            "executions",
            "list",
            "--db",
            &conninfo,
            "--limit",
            "2",
            "--json",
        ],
        &[],
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "{\"ids\":[\"A1\",\"a_b\"],\"next_cursor\":\"a_b\"}\n")
    );
    let (code, out, _) = loom(
        &[
            "events", "show", "b", "--db", &conninfo, "--after", "1", "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        "{\"execution_id\":\"b\",\"events\":[{\"sequence\":2,\"kind\":\"tool\",\"payload\":{\"n\": 1.50, \"deep\": [[[]]]}}]}\n"
    );
    let (code, out, _) = loom(
        &[
            "executions",
            "list",
            "--db",
            &conninfo,
            "--after",
            "b",
            "--json",
        ],
        &[],
    );
    assert_eq!(
        (code, out.as_str()),
        (4, "{\"ids\":[],\"next_cursor\":null}\n"),
        "an empty page is still a document, and not found"
    );
}

/// Issue 35: `--db` was required, so passwords went on argv. The database
/// comes from `--db`, else `LOOM_DB`, else `DATABASE_URL`, else libpq's
/// `PG*` variables, as `psql` finds it; none of them is a usage error (2),
/// a server that is not there is 3.
#[test]
fn the_database_comes_from_the_environment_as_postgresql_tools_find_it() {
    use loom_harness::cli::loom_in_env;
    let db = "loom_it_cli_env";
    let mut sql = Cluster::Icu.fresh_database(db);
    sql.batch_execute("SELECT loom_append_event('only', 1, 'started', '{}')")
        .unwrap();
    let conninfo = Cluster::Icu.database(db);
    let port = conninfo
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .unwrap()
        .to_owned();
    let list = ["executions", "list"];
    let url = format!("postgres://postgres@127.0.0.1:{port}/{db}");
    for env in [
        vec![("LOOM_DB", conninfo.as_str())],
        vec![("DATABASE_URL", url.as_str())],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", port.as_str()),
            ("PGUSER", "postgres"),
            ("PGDATABASE", db),
        ],
        // LOOM_DB wins over DATABASE_URL, which names nothing that answers.
        vec![
            ("LOOM_DB", conninfo.as_str()),
            ("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nowhere"),
        ],
    ] {
        assert_eq!(
            loom_in_env(&list, &env),
            (0, "only\n".to_owned()),
            "{env:?}"
        );
    }
    let (code, out) = loom_in_env(&list, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no database"), "{out}");
    let (code, out) = loom_in_env(
        &list,
        &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nowhere")],
    );
    assert_eq!(code, 3, "cannot connect: {out}");
    // Completions for a shell, from the same command line.
    let (code, out) = loom_in_env(&["completions", "bash"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("executions") && out.contains("--db"), "{out}");
}

#[test]
fn retention_by_age_and_to_the_snapshot_counts_then_deletes_in_batches() {
    let db = "loom_it_cli_retention";
    let mut sql = Cluster::Icu.fresh_database(db);
    sql.batch_execute(
        "SELECT loom_append_events(array_agg('e' || (i % 30)), array_agg(i::bigint),
                                   array_agg('step'::text), array_agg('{}'::jsonb))
         FROM generate_series(1, 600) i;
         UPDATE loom.events SET created_at = now() - interval '40 days' WHERE execution_id < 'e2';
         SELECT loom_save_snapshot('e25', 'wf', 505, '{}');",
    )
    .unwrap();
    let conninfo = Cluster::Icu.database(db);
    let retention = |args: &[&str]| loom(&["retention", "--db", &conninfo], args);
    // e0, e1, e10..e19: 12 idle executions of 20 events.
    let (code, out, _) = retention(&["--older-than", "30d", "--dry-run"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("would delete 12 executions idle for more than 30d (of 30 examined)"),
        "{out}"
    );
    let (code, out, _) = retention(&["--older-than", "30d", "--batch-size", "50"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("deleted 12 executions idle for more than 30d (240 rows) in "),
        "{out}"
    );
    assert!(out.contains("batches of at most 50 rows"), "{out}");
    let (code, out, _) = retention(&["--older-than", "30d", "--dry-run"]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            "would delete 0 executions idle for more than 30d (of 18 examined)"
        )
    );
    let left: i64 = sql
        .query_one("SELECT count(*) FROM loom.events", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 600 - 240);

    // e25's events 25, 55, ..., 475 are older than its snapshot at 505
    // (the last at or before it, 505, stays).
    let (code, out, _) = retention(&["--prune-to-snapshot", "--dry-run"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "would prune 16 events older than the latest snapshot of 1 executions (of 18)"
        ),
        "{out}"
    );
    let (code, out, _) = retention(&["--prune-to-snapshot", "--batch-size", "5"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("pruned 16 events older than the latest snapshot of 1 executions (of 18)"),
        "{out}"
    );
    let first: i64 = sql
        .query_one(
            "SELECT min(sequence) FROM loom.events WHERE execution_id = 'e25'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(first, 505);

    // Usage: exit 2, nothing run.
    for args in [
        vec!["--older-than", "30"],
        vec!["--older-than", "30d", "--prune-to-snapshot"],
        vec!["--older-than", "1d", "--batch-size", "0"],
        vec![],
    ] {
        let (code, out, _) = retention(&args);
        assert_eq!(code, 2, "{args:?}: {out}");
    }
    let missing = "/tmp/loom-it-no-such.sqlite";
    let (code, out, _) = loom(&["retention", "--db", missing, "--older-than", "1d"], &[]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("no SQLite database at"), "{out}");
    assert!(!std::path::Path::new(missing).exists(), "never created");
}

#[test]
fn retention_to_the_snapshot_and_by_age_on_sqlite() {
    let path =
        std::env::temp_dir().join(format!("loom-it-retention-{}.sqlite", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    {
        use pgloom::event_store::{Event, EventStore, SqliteEventStore};
        use pgloom::snapshot_store::SqliteSnapshotStore;
        let events = SqliteEventStore::open(&path).unwrap();
        let snapshots = SqliteSnapshotStore::open(&path, Codec::None).unwrap();
        for n in 1..=10 {
            rt.block_on(events.append(&[Event::new("a", n, "step", serde_json::json!({}))]))
                .unwrap();
        }
        rt.block_on(snapshots.save(&snapshot("a", 7, "{}")))
            .unwrap();
    }
    let db = path.to_str().unwrap();
    let (code, out, _) = loom(
        &["retention", "--db", db, "--prune-to-snapshot", "--dry-run"],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("would prune 6 events"), "{out}");
    let (code, out, _) = loom(
        &[
            "retention",
            "--db",
            db,
            "--prune-to-snapshot",
            "--batch-size",
            "4",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("pruned 6 events older than the latest snapshot of 1 executions (of 1)"),
        "{out}"
    );
    let (code, out, _) = loom(&["events", "show", "a", "--db", db], &[]);
    assert_eq!((code, out.lines().count()), (0, 4), "{out}");

    // By age: "old" was last written 40 days ago, "a" just now.
    {
        use pgloom::event_store::{Event, EventStore, SqliteEventStore};
        let old = Event::new("old", 1, "step", serde_json::json!({}));
        let events = SqliteEventStore::open(&path).unwrap();
        rt.block_on(events.append(&[old])).unwrap();
    }
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "UPDATE loom_events SET created_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-40 days')
             WHERE execution_id = 'old';
             INSERT INTO loom_snapshots (execution_id, workflow_id, sequence, created_at_us, state)
             VALUES ('old', 'wf', 1, 0, '{}');",
        )
        .unwrap();
    let by_age = |extra: &[&str]| loom(&["retention", "--db", db, "--older-than", "30d"], extra);
    let (code, out, _) = by_age(&["--dry-run"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("would delete 1 executions idle for more than 30d (of 2 examined)"),
        "{out}"
    );
    let (code, out, _) = by_age(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("deleted 1 executions idle for more than 30d (2 rows) in "),
        "{out}"
    );
    let (code, out, _) = loom(&["executions", "list", "--db", db], &[]);
    assert_eq!((code, out.trim()), (0, "a"));
    let _ = std::fs::remove_file(&path);
}

/// A zstd frame's content checksum is its last 4 bytes: flipping one is
/// a checksum mismatch, cutting the frame short is a truncation.
const DAMAGE_CHECKSUM: &str =
    "set_byte(state_z, length(state_z) - 1, get_byte(state_z, length(state_z) - 1) # 255)";
const DAMAGE_LENGTH: &str = "substring(state_z FROM 1 FOR length(state_z) - 10)";

#[test]
fn repair_rebuilds_the_index_and_lists_unreadable_frames_leaving_them_be() {
    let db = "loom_it_cli_repair";
    let mut sql = Cluster::Icu.fresh_database(db);
    let state = format!(r#"{{"log":"{}"}}"#, "tool call ".repeat(200));
    sql.batch_execute(&format!(
        "SELECT loom_append_event('e' || i, 1, 'step', '{{}}') FROM generate_series(1, 5) i;
         SELECT loom_save_snapshot('e' || i, 'wf', 1, '{state}', 'zstd') FROM generate_series(1, 3) i;
         UPDATE loom.snapshots SET state_z = {DAMAGE_CHECKSUM} WHERE execution_id = 'e1';
         UPDATE loom.snapshots SET state_z = {DAMAGE_LENGTH} WHERE execution_id = 'e2';
         DELETE FROM loom.executions WHERE execution_id IN ('e4', 'e5');"
    ))
    .unwrap();
    let stored = |sql: &mut postgres::Client| -> Vec<Vec<u8>> {
        sql.query("SELECT state_z FROM loom.snapshots ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let before = stored(&mut sql);
    let conninfo = Cluster::Icu.database(db);
    let (code, out, _) = loom(&["repair", "--db", &conninfo, "--verify-frames"], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("executions index: repaired online, 2 ids added, 0 removed (5 ids checked in 1 batches, longest "),
        "{out}"
    );
    assert!(
        out.contains(r#"of "e1" at sequence 1: snapshot frame content checksum mismatch"#),
        "{out}"
    );
    assert!(
        out.contains(r#"of "e2" at sequence 1: snapshot frame is truncated"#),
        "{out}"
    );
    assert!(
        out.contains("frames: 3 read, 2 unreadable (left as they are"),
        "{out}"
    );
    assert_eq!(
        stored(&mut sql),
        before,
        "repair never modifies a row it cannot read"
    );
    assert_eq!(loom_harness::listed_executions(&mut sql).len(), 5);
    let (code, out, _) = loom(&["repair", "--db", &conninfo], &[]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            "executions index: in step with the log (5 ids checked in 1 batches)"
        )
    );
}

#[test]
fn repair_verifies_the_frames_of_a_sqlite_file() {
    let path = std::env::temp_dir().join(format!("loom-it-repair-{}.sqlite", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = pgloom::snapshot_store::SqliteSnapshotStore::open(&path, Codec::Zstd).unwrap();
    let state = format!(r#"{{"log":"{}"}}"#, "tool call ".repeat(200));
    for id in ["a", "b"] {
        rt.block_on(store.save(&snapshot(id, 1, &state))).unwrap();
    }
    drop(store);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE loom_snapshots SET state = substr(state, 1, length(state) - 10) WHERE execution_id = 'b'",
            [],
        )
        .unwrap();
    let db = path.to_str().unwrap();
    let (code, out, _) = loom(&["repair", "--db", db, "--verify-frames"], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            r#"unreadable frame: snapshot 2 of "b" at sequence 1: snapshot frame is truncated"#
        ),
        "{out}"
    );
    assert!(out.contains("frames: 2 read, 1 unreadable"), "{out}");
    let _ = std::fs::remove_file(&path);
}

/// Issue 25, item 7: no message carries a connection string or its
/// password, also when a real server refuses the connection (an unknown
/// role, an unknown database, TLS required of a server without it) or
/// the string does not parse.
#[test]
fn a_refused_connection_never_repeats_its_password() {
    let conninfo = Cluster::Icu.conninfo();
    let port = conninfo
        .split("port=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap();
    let dbs = [
        format!("postgres://nobody:pw@127.0.0.1:{port}/postgres"),
        format!("postgres://postgres:pw@127.0.0.1:{port}/loom_it_no_such_db"),
        format!("host=127.0.0.1 port={port} user=nobody password=pw"),
        format!("postgres://postgres:pw@127.0.0.1:{port}/postgres?sslmode=require"),
        format!("postgre://postgres:pw@127.0.0.1:{port}/postgres"),
        format!("host=127.0.0.1 port={port} password=pw bogus"),
    ];
    let commands: [&[&str]; 7] = [
        &["snapshot", "show", "exec-1"],
        &["status"],
        &["status", "--json"],
        &["executions", "list"],
        &["events", "show", "exec-1"],
        &["repair"],
        &["migrate"],
    ];
    for db in &dbs {
        for command in commands {
            let (code, said, _) = loom(command, &["--db", db]);
            assert_ne!(code, 0, "{command:?} {db}: {said}");
            assert!(!said.trim().is_empty(), "{command:?} {db}: a reason");
            assert!(!said.contains("pw"), "{command:?} {db}: {said}");
        }
    }
}

/// Issue 34: every command against a database whose loom is in a schema,
/// and is written by a role, whose names need quoting ("Loom Api",
/// "Svc Writer"): created there by `loom migrate --schema`, then each
/// command as the superuser, and the reading ones as the writer.
#[test]
fn every_command_serves_a_schema_and_a_role_whose_names_need_quoting() {
    let db = "loom_it_cli_quoted";
    let mut sql = Cluster::Icu.fresh_database_without_loom(db, "");
    sql.batch_execute(
        "CREATE SCHEMA \"Loom Api\";
         DO $$ BEGIN CREATE ROLE \"Svc Writer\" LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;",
    )
    .unwrap();
    let conninfo = Cluster::Icu.database(db);
    let (code, out, _) = loom(&["migrate", "--db", &conninfo, "--schema", "Loom Api"], &[]);
    assert_eq!(code, 0, "{out}");
    let schema: String = sql
        .query_one(
            "SELECT n.nspname::text FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'loom'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(schema, "Loom Api");
    sql.batch_execute(
        r#"SELECT "Loom Api".loom_grant_access('"Svc Writer"'::regrole, 'writer'::text);"#,
    )
    .unwrap();
    let writer = format!("{conninfo} user='Svc Writer'");
    let mut as_writer = postgres::Client::connect(&writer, postgres::NoTls).unwrap();
    as_writer
        .batch_execute(
            r#"SELECT "Loom Api".loom_append_events(ARRAY['old', 'new'], ARRAY[1, 1]::bigint[], ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[], NULL::jsonb[]);
               SELECT "Loom Api".loom_save_snapshot('new'::text, 'wf'::text, 1::bigint, '{"a": 1}'::text, 'none'::text);"#,
        )
        .unwrap();
    sql.batch_execute(
        "UPDATE loom.events SET created_at = now() - interval '40 days' WHERE execution_id = 'old'",
    )
    .unwrap();
    for (args, expected_code, expect) in [
        (vec!["status"], 0, "loom version"),
        (vec!["status", "--verify"], 0, "executions index"),
        (vec!["repair"], 0, "executions index"),
        (vec!["executions", "list"], 0, "new"),
        (vec!["events", "show", "new"], 0, "\"sequence\":1"),
        (
            vec!["retention", "--older-than", "30d", "--dry-run"],
            1,
            "1",
        ),
        (vec!["retention", "--prune-to-snapshot", "--dry-run"], 0, ""),
        (vec!["migrate"], 0, "->"),
        (vec!["retention", "--older-than", "30d"], 0, "1"),
    ] {
        let mut command = args.clone();
        command.extend(["--db", conninfo.as_str()]);
        let (code, out, _) = loom(&command, &[]);
        assert!(
            code == expected_code && out.contains(expect),
            "loom {args:?} in \"Loom Api\": exit {code}: {out}"
        );
        assert!(
            !out.contains("does not exist") && !out.contains("syntax error"),
            "loom {args:?}: {out}"
        );
    }
    for args in [vec!["executions", "list"], vec!["events", "show", "new"]] {
        let mut command = args.clone();
        command.extend(["--db", writer.as_str()]);
        let (code, out, _) = loom(&command, &[]);
        assert_eq!(code, 0, "loom {args:?} as \"Svc Writer\": {out}");
    }
    let left: Vec<String> = sql
        .query("SELECT execution_id FROM loom.executions ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["new"], "the sweep deleted the idle execution alone");
}

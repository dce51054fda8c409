//! Payloads PostgreSQL holds, read and written by pgloom exactly
//! (issue 16, defect 5), and a duplicate reported as `DuplicateEvent` to a
//! writer that may INSERT but not SELECT (defect 9).

use loom_harness::{runtime, Cluster};
use pgloom::conformance::conformance_payloads;
use pgloom::event_store::{Event, EventStore, Payload, PgEventStore};
use pgloom::snapshot_store::{PgSnapshotStore, PgSnapshotStoreOptions};
use pgloom::Error;

const DB: &str = "loom_it_payloads";

/// What psql (or any other service) can write: deeper than serde_json's
/// 128 levels, and numbers no f64 holds.
const WRITTEN_BY_SQL: [(&str, &str); 7] = [
    (
        "arrays 10,000 deep",
        "repeat('[', 10000) || '1' || repeat(']', 10000)",
    ),
    (
        "objects 5,000 deep",
        r#"repeat('{"a":', 5000) || '12345678901234567890123' || repeat('}', 5000)"#,
    ),
    ("1e400", "'1e400'"),
    ("1e-400", "'-1e-400'"),
    ("a 23-digit integer", "'12345678901234567890123'"),
    ("a 31-digit decimal", "'0.1000000000000000000000000000001'"),
    (
        "an object of them",
        r#"'{"z": 1.50, "a": [1e400, 0.1000000000000000000000000000001], "é": "\ud834\udd1e"}'"#,
    ),
];

#[test]
fn payloads_postgres_holds_read_back_exactly() {
    let rt = runtime();
    let mut admin = Cluster::C.fresh_database(DB);
    for (n, (name, sql)) in WRITTEN_BY_SQL.iter().enumerate() {
        admin
            .execute(
                &format!("SELECT loom_append_event('sql', $1, 'k', ({sql})::jsonb)"),
                &[&(n as i64 + 1)],
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let printed: Vec<String> = admin
        .query(
            "SELECT payload::text FROM loom.events WHERE execution_id = 'sql' ORDER BY sequence",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let store = PgEventStore::connect(&Cluster::C.database(DB)).unwrap();
    let read = rt.block_on(store.read_events("sql")).unwrap();
    let snapshots = rt
        .block_on(PgSnapshotStore::start(
            store.pool().clone(),
            &PgSnapshotStoreOptions::new(),
        ))
        .unwrap();
    let resumed = rt.block_on(snapshots.resume("sql")).unwrap();
    for events in [&read, &resumed.events] {
        assert_eq!(events.len(), WRITTEN_BY_SQL.len());
        for ((event, text), (name, _)) in events.iter().zip(&printed).zip(WRITTEN_BY_SQL) {
            // Exactly the text the server prints, byte for byte.
            assert_eq!(event.payload.as_str(), text, "{name}");
        }
    }
    // A typed view is the caller's choice, and an error, never a panic.
    assert!(read[0].payload.to_value().is_err());
    assert!(read[2].payload.to_value().is_err());
    // What Rust reads, Rust writes back: the same values, in another log.
    let copies: Vec<Event> = read
        .iter()
        .map(|e| Event::new("copy", e.sequence, "k", e.payload.clone()))
        .collect();
    rt.block_on(store.append(&copies)).unwrap();
    let copied = rt.block_on(store.read_events("copy")).unwrap();
    assert_eq!(copied, copies);
    let same: bool = admin
        .query_one(
            "SELECT bool_and(a.payload = b.payload) AND count(*) = $1
             FROM loom.events a JOIN loom.events b USING (sequence)
             WHERE a.execution_id = 'sql' AND b.execution_id = 'copy'",
            &[&(WRITTEN_BY_SQL.len() as i64)],
        )
        .unwrap()
        .get(0);
    assert!(same, "the copies are the same jsonb values");
    println!(
        "read back exactly: {}",
        WRITTEN_BY_SQL.map(|(name, _)| name).join(", ")
    );
}

#[test]
fn payloads_rust_writes_are_the_values_postgres_reads() {
    let rt = runtime();
    let _ = Cluster::Icu.fresh_database(DB);
    let mut admin = Cluster::Icu.connect(DB);
    let store = PgEventStore::connect(&Cluster::Icu.database(DB)).unwrap();
    let payloads = conformance_payloads();
    let events: Vec<Event> = payloads
        .iter()
        .zip(1..)
        .map(|((_, text), n)| Event::new("rust", n, "k", Payload::new(text.as_str()).unwrap()))
        .collect();
    rt.block_on(store.append(&events)).unwrap();
    for (event, (name, text)) in events.iter().zip(&payloads) {
        // The server's own comparison: the text as jsonb, and what is stored.
        let same: bool = admin
            .query_one(
                "SELECT payload = $2::text::jsonb FROM loom.events WHERE execution_id = 'rust' AND sequence = $1",
                &[&event.sequence, text],
            )
            .unwrap()
            .get(0);
        assert!(same, "{name}");
    }
    // jsonb refuses U+0000 itself (22P05); the client refuses it first,
    // as every store does, with one typed error.
    let err = admin
        .execute(r#"SELECT '"\u0000"'::jsonb"#, &[])
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("22P05"));
    let refused = rt.block_on(store.append(&[Event::new(
        "rust",
        100,
        "k",
        Payload::new(r#"{"s":"\u0000"}"#).unwrap(),
    )]));
    assert!(
        matches!(
            refused,
            Err(Error::UnsupportedPayload { sequence: 100, .. })
        ),
        "{refused:?}"
    );
}

#[test]
fn a_writer_without_select_gets_duplicate_event() {
    let rt = runtime();
    let mut admin = Cluster::C.fresh_database("loom_it_insert_only");
    admin
        .batch_execute(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'loom_it_insert_only') THEN
                     CREATE ROLE loom_it_insert_only LOGIN;
                 END IF;
             END $$;
             GRANT USAGE ON SCHEMA loom TO loom_it_insert_only;
             GRANT INSERT ON loom.events TO loom_it_insert_only;
             SELECT loom_append_event('taken', 1, 'k', '{}');",
        )
        .unwrap();
    let writer = PgEventStore::connect(&format!(
        "{} user=loom_it_insert_only",
        Cluster::C.database("loom_it_insert_only")
    ))
    .unwrap();
    // The setup is what it says: no SELECT.
    let mut as_writer = Cluster::C.connect_as("loom_it_insert_only", "loom_it_insert_only");
    let denied = as_writer
        .query("SELECT 1 FROM loom.events", &[])
        .unwrap_err();
    assert_eq!(denied.code().map(|c| c.code()), Some("42501"));
    rt.block_on(writer.append(&[Event::new("new", 1, "k", serde_json::json!({}))]))
        .unwrap();
    for (batch, expected) in [
        (vec![("taken", 1)], ("taken", 1)),
        (vec![("fresh", 1), ("taken", 1), ("fresh", 2)], ("taken", 1)),
        (vec![("twice", 1), ("twice", 1)], ("twice", 1)),
    ] {
        let events: Vec<Event> = batch
            .iter()
            .map(|(id, n)| Event::new(*id, *n, "k", serde_json::json!({})))
            .collect();
        match rt.block_on(writer.append(&events)) {
            Err(Error::DuplicateEvent {
                execution_id,
                sequence,
            }) => assert_eq!((execution_id.as_str(), sequence), expected, "{batch:?}"),
            other => panic!("{batch:?}: {other:?}"),
        }
    }
    // Nothing of the refused batches (nor of the replay) stayed.
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM loom.events WHERE execution_id IN ('fresh', 'twice')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

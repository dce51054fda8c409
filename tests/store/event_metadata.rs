//! Events' metadata (loom 0.11.0) against real PostgreSQL: kept exactly by
//! every append path (one event, a batch, notifying, the caller's
//! transaction, SQL), read back by every read (`loom_read_events`,
//! `loom_resume`); refused, with nothing written, by an extension from
//! before; never lost by a store that last saw the extension before its
//! update; and the column itself added failing soft behind a held lock,
//! then by the next migration.

use loom_harness::{describe, runtime, sqlstate, version_of, Cluster, LOOM_VERSION};
use pgloom::event_store::{Event, EventStore, Payload, PgEventStore};
use pgloom::migrate::{migrate, MigrateOptions};
use pgloom::snapshot_store::{PgSnapshotStore, PgSnapshotStoreOptions};
use pgloom::Error;

fn trace(id: &str) -> serde_json::Value {
    serde_json::json!({ "trace_id": id, "actor": "scheduler" })
}

#[test]
fn every_append_and_read_path_keeps_metadata_exactly() {
    let db = "loom_it_metadata_paths";
    let mut admin = Cluster::C.fresh_database(db);
    let rt = runtime();
    let store = PgEventStore::connect(&Cluster::C.database(db)).unwrap();
    // Numbers beyond f64 and a depth serde_json stops at stay as written.
    let exact = Payload::new(r#"{"n": 12345678901234567890123, "x": 1.50}"#).unwrap();
    let one = Event::new("run-1", 1, "started", serde_json::json!({})).with_metadata(exact.clone());
    let batch = vec![
        Event::new("run-1", 2, "step", serde_json::json!({})).with_metadata(trace("t2")),
        Event::new("run-1", 3, "step", serde_json::json!({})),
        Event::new("run-2", 1, "step", serde_json::json!({})).with_metadata(trace("t3")),
    ];
    rt.block_on(store.append(std::slice::from_ref(&one)))
        .unwrap();
    rt.block_on(store.append(&batch)).unwrap();
    // Notifying appends send the statements with notify beside them.
    let notifying = PgEventStore::connect(&Cluster::C.database(db))
        .unwrap()
        .with_append_notifications(true);
    let notified = [
        Event::new("run-3", 1, "step", serde_json::json!({})).with_metadata(trace("n1")),
        Event::new("run-3", 2, "step", serde_json::json!({})).with_metadata(trace("n2")),
    ];
    rt.block_on(notifying.append(&notified[..1])).unwrap();
    rt.block_on(notifying.append(&notified[1..])).unwrap();

    let read = rt.block_on(store.read_events("run-1")).unwrap();
    assert_eq!(read, [one.clone(), batch[0].clone(), batch[1].clone()]);
    assert_eq!(read[0].metadata.as_ref(), Some(&exact));
    assert!(read[0]
        .metadata
        .as_ref()
        .unwrap()
        .as_str()
        .contains("12345678901234567890123"));
    assert_eq!(read[2].metadata, None);
    assert_eq!(
        rt.block_on(store.read_events("run-3")).unwrap(),
        notified.to_vec()
    );

    // Resume reads the tail after the snapshot with its metadata.
    let snapshots = rt
        .block_on(async {
            let pool = loom_harness::pg_pool(&Cluster::C.database(db), 2)?;
            PgSnapshotStore::start(pool, &PgSnapshotStoreOptions::new()).await
        })
        .unwrap();
    let resumed = rt.block_on(snapshots.resume("run-1")).unwrap();
    assert_eq!(resumed.events, read);

    // What SQL sees: jsonb, NULL for none.
    let stored: Vec<Option<serde_json::Value>> = admin
        .query(
            "SELECT metadata FROM loom.events WHERE execution_id = 'run-1' ORDER BY sequence",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        stored,
        [
            Some(serde_json::json!({"n": 12345678901234567890123_f64, "x": 1.5})),
            Some(trace("t2")),
            None
        ]
    );

    // The caller's transaction: metadata beside a row of its own, rolled
    // back with it.
    rt.block_on(async {
        let pool = loom_harness::pg_pool(&Cluster::C.database(db), 1)?;
        let mut client = pool.as_ref().get().await?;
        let tx = client.transaction().await?;
        store
            .on(&tx)
            .append(&[
                Event::new("run-4", 1, "step", serde_json::json!({})).with_metadata(trace("tx"))
            ])
            .await?;
        let read = store.on(&tx).read_events("run-4").await?;
        assert_eq!(read[0].metadata, Some(trace("tx").into()));
        tx.rollback().await?;
        Ok::<_, Error>(())
    })
    .unwrap();
    assert!(rt.block_on(store.read_events("run-4")).unwrap().is_empty());
}

#[test]
fn sql_appends_take_metadata_and_refuse_arrays_of_other_lengths() {
    let db = "loom_it_metadata_sql";
    let mut client = Cluster::C.fresh_database(db);
    // Four arguments, as every caller before 0.11.0 wrote them: no metadata.
    client
        .batch_execute(
            "SELECT loom_append_event('a', 1, 'k', '{}');
             SELECT loom_append_events(ARRAY['a', 'b'], ARRAY[2, 1]::bigint[], ARRAY['k', 'k'], ARRAY['{}', '{}']::jsonb[]);
             SELECT loom_append_event('a', 3, 'k', '{}', '{\"by\": \"sql\"}');
             SELECT loom_append_events(ARRAY['a', 'b'], ARRAY[4, 2]::bigint[], ARRAY['k', 'k'],
                                       ARRAY['{}', '{}']::jsonb[], ARRAY['[1]', NULL]::jsonb[]);
             SELECT loom_append_events(ARRAY['b'], ARRAY[3]::bigint[], ARRAY['k'], ARRAY['{}']::jsonb[], NULL);",
        )
        .unwrap();
    let read: Vec<(i64, Option<serde_json::Value>)> = client
        .query("SELECT sequence, metadata FROM loom_read_events('a')", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        read,
        [
            (1, None),
            (2, None),
            (3, Some(serde_json::json!({"by": "sql"}))),
            (4, Some(serde_json::json!([1])))
        ]
    );
    let resumed: Vec<Option<serde_json::Value>> = client
        .query("SELECT metadata FROM loom_resume('b')", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(resumed, [None, None, None]);
    let err = client
        .batch_execute(
            "SELECT loom_append_events(ARRAY['c', 'c'], ARRAY[1, 2]::bigint[], ARRAY['k', 'k'],
                                       ARRAY['{}', '{}']::jsonb[], ARRAY['{}']::jsonb[])",
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{}", describe(&err));
    assert!(describe(&err).contains("1 metadata"), "{}", describe(&err));
    let none: i64 = client
        .query_one(
            "SELECT count(*) FROM loom.events WHERE execution_id = 'c'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(none, 0);
}

#[test]
fn an_extension_before_metadata_refuses_it_and_a_stale_store_loses_none() {
    let db = "loom_it_metadata_before";
    let mut admin = Cluster::C.fresh_database_at(db, "0.10.0");
    let rt = runtime();
    let conninfo = Cluster::C.database(db);
    let stale = PgEventStore::connect(&conninfo).unwrap();
    let plain = Event::new("run-1", 1, "started", serde_json::json!({}));
    rt.block_on(stale.append(std::slice::from_ref(&plain)))
        .unwrap();
    let with_metadata =
        Event::new("run-1", 2, "step", serde_json::json!({})).with_metadata(trace("t"));
    match rt.block_on(stale.append(std::slice::from_ref(&with_metadata))) {
        Err(Error::ExtensionTooOld {
            needs: "0.11.0",
            installed,
            ..
        }) => assert_eq!(installed, "0.10.0"),
        other => panic!("expected ExtensionTooOld, got {other:?}"),
    }
    assert_eq!(
        rt.block_on(stale.read_events("run-1")).unwrap(),
        std::slice::from_ref(&plain),
        "nothing of the refused append was written"
    );
    // The snapshot store as of 0.10.0 resumes too (no metadata column yet).
    let snapshots = rt
        .block_on(async {
            let pool = loom_harness::pg_pool(&conninfo, 2)?;
            PgSnapshotStore::start(pool, &PgSnapshotStoreOptions::new()).await
        })
        .unwrap();
    assert_eq!(
        rt.block_on(snapshots.resume("run-1")).unwrap().events,
        std::slice::from_ref(&plain)
    );

    // A peer updates the extension and appends with metadata; the stores
    // that last saw 0.10.0 read it all the same.
    rt.block_on(migrate(&conninfo, &MigrateOptions::new()))
        .unwrap();
    assert_eq!(version_of(&mut admin), LOOM_VERSION);
    let peer = PgEventStore::connect(&conninfo).unwrap();
    rt.block_on(peer.append(std::slice::from_ref(&with_metadata)))
        .unwrap();
    let expected = [plain, with_metadata];
    assert_eq!(rt.block_on(stale.read_events("run-1")).unwrap(), expected);
    assert_eq!(
        rt.block_on(snapshots.resume("run-1")).unwrap().events,
        expected
    );
    // And the stale store appends metadata now: it reads the catalog again
    // before refusing.
    let third = Event::new("run-1", 3, "step", serde_json::json!({})).with_metadata(trace("3"));
    rt.block_on(stale.append(std::slice::from_ref(&third)))
        .unwrap();
    assert_eq!(
        rt.block_on(peer.read_events("run-1")).unwrap()[2].metadata,
        third.metadata
    );
}

#[test]
fn behind_a_held_lock_the_column_fails_soft_and_lands_at_the_next_migration() {
    let db = "loom_it_metadata_lock";
    let mut admin = Cluster::C.fresh_database_at(db, "0.10.0");
    let rt = runtime();
    let conninfo = Cluster::C.database(db);
    let plain = Event::new("run-1", 1, "started", serde_json::json!({}));
    let store = PgEventStore::connect(&conninfo).unwrap();
    rt.block_on(store.append(std::slice::from_ref(&plain)))
        .unwrap();
    // A long reader of loom.events: the update lands, the column waits.
    let holder = Cluster::C.hold_lock(db, "events", "ACCESS SHARE");
    let started = std::time::Instant::now();
    let migration = rt
        .block_on(migrate(
            &conninfo,
            MigrateOptions::new().lock_timeout(std::time::Duration::from_millis(200)),
        ))
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(migration.to_version, LOOM_VERSION);
    assert_eq!(
        migration
            .event_metadata
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("skipped: 55P03"),
        "{migration:?}"
    );
    assert!(
        migration
            .warnings
            .iter()
            .any(|w| w.contains("loom.events.metadata")),
        "{:?}",
        migration.warnings
    );
    // Meanwhile events are appended and read as before, and metadata is
    // refused, never dropped.
    let second = Event::new("run-1", 2, "step", serde_json::json!({}));
    rt.block_on(store.append(std::slice::from_ref(&second)))
        .unwrap();
    let refused = rt
        .block_on(store.append(&[
            Event::new("run-1", 3, "step", serde_json::json!({})).with_metadata(trace("t")),
        ]))
        .unwrap_err();
    assert_eq!(refused.sqlstate(), Some("55000"), "{refused:?}");
    assert!(
        refused.to_string().contains("metadata") || format!("{refused:?}").contains("metadata")
    );
    assert_eq!(
        rt.block_on(store.read_events("run-1")).unwrap(),
        [plain.clone(), second.clone()]
    );
    let snapshots = rt
        .block_on(async {
            let pool = loom_harness::pg_pool(&conninfo, 2)?;
            PgSnapshotStore::start(pool, &PgSnapshotStoreOptions::new()).await
        })
        .unwrap();
    assert_eq!(
        rt.block_on(snapshots.resume("run-1")).unwrap().events,
        [plain.clone(), second.clone()]
    );
    let status: Vec<(String, bool, Option<String>)> = admin
        .query(
            "SELECT value, needs_action, statement FROM loom_status() WHERE item LIKE 'loom.events.metadata%'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!((status[0].0.as_str(), status[0].1), ("missing", true));
    assert!(status[0]
        .2
        .as_deref()
        .is_some_and(|s| s.contains("loom_ensure_event_metadata")));
    drop(holder);

    let again = rt
        .block_on(migrate(
            &conninfo,
            MigrateOptions::new().lock_timeout(std::time::Duration::from_millis(200)),
        ))
        .unwrap();
    assert_eq!(
        again
            .event_metadata
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("added")
    );
    let third = Event::new("run-1", 3, "step", serde_json::json!({})).with_metadata(trace("t"));
    rt.block_on(store.append(std::slice::from_ref(&third)))
        .unwrap();
    assert_eq!(
        rt.block_on(store.read_events("run-1")).unwrap(),
        [plain, second, third]
    );
    let once_more = rt
        .block_on(migrate(&conninfo, &MigrateOptions::new()))
        .unwrap();
    assert_eq!(
        once_more
            .event_metadata
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("present")
    );
    assert_eq!(version_of(&mut admin), LOOM_VERSION);
}

/// Where no trigger keeps loom.executions (Citus, a disabled trigger), the
/// PL/pgSQL path stores metadata as the C one does, whatever the arrays'
/// bounds or dimensions.
#[test]
fn the_path_without_the_trigger_keeps_metadata_too() {
    let db = "loom_it_metadata_no_trigger";
    let mut client = Cluster::C.fresh_database(db);
    client
        .batch_execute(
            r#"ALTER TABLE loom.events DISABLE TRIGGER USER;
               SELECT loom_append_events(ARRAY['x'], ARRAY[1]::bigint[], ARRAY['k'], ARRAY['{}']::jsonb[],
                                         '[0:0]={"{\"a\": 1}"}'::jsonb[]);
               SELECT loom_append_events(ARRAY['x'], ARRAY[2]::bigint[], ARRAY['k'], ARRAY['{}']::jsonb[],
                                         ARRAY[ARRAY['{"a": 2}'::jsonb]]);
               SELECT loom_append_events(ARRAY['x', 'y'], ARRAY[3, 1]::bigint[], ARRAY['k', 'k'],
                                         ARRAY['{}', '{}']::jsonb[], ARRAY['{"a": 3}', NULL]::jsonb[]);
               SELECT loom_append_events(ARRAY['x'], ARRAY[4]::bigint[], ARRAY['k'], ARRAY['{}']::jsonb[]);"#,
        )
        .unwrap();
    let stored: Vec<Option<String>> = client
        .query("SELECT metadata::text FROM loom_read_events('x')", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        stored,
        [
            Some(r#"{"a": 1}"#.to_owned()),
            Some(r#"{"a": 2}"#.to_owned()),
            Some(r#"{"a": 3}"#.to_owned()),
            None
        ]
    );
    // Its executions are tracked, as loom_track_appended does there.
    let listed: Vec<String> = client
        .query("SELECT * FROM loom_list_executions()", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(listed, ["x", "y"]);
    let err = client
        .batch_execute(
            "SELECT loom_append_events_without_trigger(ARRAY['z', 'z'], ARRAY[1, 2]::bigint[], ARRAY['k', 'k'],
                                                       ARRAY['{}', '{}']::jsonb[], ARRAY['{}']::jsonb[])",
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{}", describe(&err));
}

/// The update freed the four-argument signatures: a database owner who
/// creates one beside loom's (as any role could in `public` before
/// PostgreSQL 15) must not make loom's appends ambiguous. Every append
/// from 0.11.0 passes all five arguments.
#[test]
fn an_overload_planted_where_the_update_freed_a_signature_changes_nothing() {
    let db = "loom_it_metadata_overload";
    let mut owner = Cluster::C.fresh_database(db);
    owner
        .batch_execute(
            "CREATE FUNCTION public.loom_append_event(text, bigint, text, jsonb) RETURNS void
                 LANGUAGE sql AS 'SELECT NULL::void';
             CREATE FUNCTION public.loom_append_events(text[], bigint[], text[], jsonb[]) RETURNS bigint
                 LANGUAGE sql AS 'SELECT 0::bigint';
             CREATE FUNCTION public.loom_append_events_without_trigger(text[], bigint[], text[], jsonb[])
                 RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';",
        )
        .unwrap();
    let rt = runtime();
    let store = PgEventStore::connect(&Cluster::C.database(db)).unwrap();
    let one = [Event::new("run-1", 1, "s", serde_json::json!({}))];
    let batch = [
        Event::new("run-1", 2, "s", serde_json::json!({})),
        Event::new("run-1", 3, "s", serde_json::json!({})),
    ];
    rt.block_on(store.append(&one)).unwrap();
    rt.block_on(store.append(&batch)).unwrap();
    // The path without the trigger: the C function calls the PL/pgSQL one.
    owner
        .batch_execute("ALTER TABLE loom.events DISABLE TRIGGER USER")
        .unwrap();
    rt.block_on(store.append(&[
        Event::new("run-1", 4, "s", serde_json::json!({})),
        Event::new("run-1", 5, "s", serde_json::json!({})),
    ]))
    .unwrap();
    assert_eq!(rt.block_on(store.read_events("run-1")).unwrap().len(), 5);
}

/// A column named metadata of another type is someone else's: the update
/// leaves it and fails soft, loom never reads it as jsonb (a crash in C),
/// and refuses metadata it would have to write there.
#[test]
fn a_metadata_column_of_another_type_is_never_read_as_loom_s() {
    let db = "loom_it_metadata_other_type";
    let mut admin = Cluster::C.fresh_database_at(db, "0.10.0");
    admin
        .batch_execute(
            r#"SELECT loom_append_event('a', 1, 'k', '{}');
               ALTER TABLE loom.events ADD COLUMN metadata json;
               UPDATE loom.events SET metadata = '{"theirs": 1}';"#,
        )
        .unwrap();
    let rt = runtime();
    let conninfo = Cluster::C.database(db);
    let migration = rt
        .block_on(migrate(&conninfo, &MigrateOptions::new()))
        .unwrap();
    assert_eq!(migration.to_version, LOOM_VERSION);
    assert_eq!(
        migration
            .event_metadata
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("skipped: 42804"),
        "{migration:?}"
    );
    assert!(migration.warnings.iter().any(|w| w.contains("type json")));
    let read: Vec<(i64, Option<serde_json::Value>)> = admin
        .query("SELECT sequence, metadata FROM loom_read_events('a')", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(read, [(1, None)]);
    let resumed: Vec<Option<serde_json::Value>> = admin
        .query("SELECT metadata FROM loom_resume('a')", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(resumed, [None]);
    let store = PgEventStore::connect(&conninfo).unwrap();
    let refused = rt
        .block_on(
            store.append(&[
                Event::new("a", 2, "k", serde_json::json!({})).with_metadata(trace("t"))
            ]),
        )
        .unwrap_err();
    assert_eq!(refused.sqlstate(), Some("55000"), "{refused:?}");
    // Events without metadata go on.
    rt.block_on(store.append(&[Event::new("a", 2, "k", serde_json::json!({}))]))
        .unwrap();
}

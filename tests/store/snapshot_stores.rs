//! PgSnapshotStore against a real ICU en-US cluster (ADR 0141 D2, D5):
//! both codecs and both decode sites through the conformance kit, mixed
//! rows, flips that clear the other column, a store that probed before a
//! peer opted in, and corruption.

#[path = "../../loom-client/tests/common/mod.rs"]
mod common;

use common::snapshot;
use loom_harness::pg_pool;
use loom_harness::{runtime, save_delta_run, upgrade_extension, Cluster};
use pgloom::conformance::{check_snapshot_store, Fidelity};
use pgloom::snapshot_store::{
    Codec, Decode, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};
use pgloom::Error;

fn store(rt: &tokio::runtime::Runtime, db: &str, codec: Codec, decode: Decode) -> PgSnapshotStore {
    let pool = pg_pool(&Cluster::Icu.database(db), 2).unwrap();
    let mut options = PgSnapshotStoreOptions::new();
    options.codec(codec).decode(decode);
    rt.block_on(PgSnapshotStore::start(pool, &options)).unwrap()
}

#[test]
fn postgres_snapshot_stores_conform_in_every_codec_and_decode_site() {
    let rt = runtime();
    for (codec, decode, fidelity) in [
        (Codec::None, Decode::Client, Fidelity::Jsonb),
        (Codec::Zstd, Decode::Client, Fidelity::Exact),
        (Codec::Zstd, Decode::Server, Fidelity::Exact),
        (Codec::Delta, Decode::Client, Fidelity::Exact),
        (Codec::Delta, Decode::Server, Fidelity::Exact),
    ] {
        let db = format!("loom_it_snap_{codec}_{decode:?}").to_lowercase();
        let _ = Cluster::Icu.fresh_database(&db);
        let store = store(&rt, &db, codec, decode);
        rt.block_on(check_snapshot_store(&store, codec, fidelity))
            .unwrap_or_else(|f| panic!("{codec} {decode:?}: {f}"));
    }
}

#[test]
fn rows_of_either_format_read_and_flip_without_a_stale_frame() {
    let rt = runtime();
    let db = "loom_it_snap_mixed";
    let mut sql = Cluster::Icu.fresh_database(db);
    let plain = store(&rt, db, Codec::None, Decode::Client);
    let zstd = store(&rt, db, Codec::Zstd, Decode::Client);
    let big = format!(r#"{{"z":1,"a":"{}"}}"#, "agent tool result ".repeat(50));
    rt.block_on(plain.save(&snapshot("e", 1, r#"{"old":"jsonb row"}"#)))
        .unwrap();
    rt.block_on(zstd.save(&snapshot("e", 2, &big))).unwrap();
    for store in [&plain, &zstd] {
        assert_eq!(
            rt.block_on(store.load_at("e", 1))
                .unwrap()
                .unwrap()
                .state
                .as_str(),
            r#"{"old": "jsonb row"}"#
        );
        assert_eq!(
            rt.block_on(store.load_at("e", 2))
                .unwrap()
                .unwrap()
                .state
                .as_str(),
            big,
            "exact text"
        );
    }
    // Flip the frame row to JSONB: the frame is cleared.
    rt.block_on(plain.save(&snapshot("e", 2, r#"{"now":"jsonb"}"#)))
        .unwrap();
    let (frames, sentinels): (i64, i64) = {
        let row = sql
            .query_one("SELECT count(state_z), count(*) FILTER (WHERE state ? '__loomEnc') FROM loom.snapshots", &[])
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((frames, sentinels), (0, 0));
}

#[test]
fn a_store_that_probed_before_a_peer_opted_in_clears_the_frame_and_reads_it() {
    let rt = runtime();
    let db = "loom_it_snap_probe";
    let mut sql = Cluster::Icu.fresh_database_at(db, "0.2.0");
    // Probes now: no frame column.
    let early = store(&rt, db, Codec::None, Decode::Client);
    upgrade_extension(&mut sql, "0.3.0").unwrap();
    let peer = store(&rt, db, Codec::Zstd, Decode::Client);
    assert!(peer.writes_frames());
    let big = format!(r#"{{"log":"{}"}}"#, "words ".repeat(100));
    rt.block_on(peer.save(&snapshot("e", 1, &big))).unwrap();
    // The early store reads the peer's frame (it re-probes on the sentinel)...
    assert_eq!(
        rt.block_on(early.load_at("e", 1))
            .unwrap()
            .unwrap()
            .state
            .as_str(),
        big
    );
    // ...and its JSONB re-save, refused by the check at first, clears it.
    let early = store(&rt, db, Codec::None, Decode::Client);
    rt.block_on(early.save(&snapshot("e", 1, r#"{"v":2}"#)))
        .unwrap();
    let frame: Option<Vec<u8>> = sql
        .query_one("SELECT state_z FROM loom.snapshots", &[])
        .unwrap()
        .get(0);
    assert_eq!(frame, None);
}

#[test]
fn corruption_is_an_error_never_a_state() {
    let rt = runtime();
    let db = "loom_it_snap_corrupt";
    let mut sql = Cluster::Icu.fresh_database(db);
    let zstd = store(&rt, db, Codec::Zstd, Decode::Client);
    rt.block_on(zstd.save(&snapshot(
        "e",
        1,
        &format!(r#"{{"log":"{}"}}"#, "words ".repeat(100)),
    )))
    .unwrap();
    rt.block_on(zstd.save(&snapshot("e", 2, r#"{"v":1}"#)))
        .unwrap();
    sql.batch_execute(
        r#"UPDATE loom.snapshots SET state_z = substr(state_z, 1, length(state_z) - 2) WHERE sequence = 1;
           UPDATE loom.snapshots SET state_z = NULL WHERE sequence = 2;"#,
    )
    .unwrap();
    assert!(matches!(
        rt.block_on(zstd.load_at("e", 1)),
        Err(Error::Decode(_))
    ));
    assert!(matches!(
        rt.block_on(zstd.load_at("e", 2)),
        Err(Error::SentinelWithoutFrame { .. })
    ));
    let server = store(&rt, db, Codec::Zstd, Decode::Server);
    assert!(matches!(rt.block_on(server.load_at("e", 1)), Err(e) if e.sqlstate() == Some("XX001")));
    assert!(matches!(
        rt.block_on(server.load_at("e", 2)),
        Err(Error::SentinelWithoutFrame { .. })
    ));
    // resume decodes where load does: the store's own resume and the
    // generic one over an event store of the same pool (one statement).
    sql.batch_execute("DELETE FROM loom.snapshots WHERE sequence = 2")
        .unwrap();
    for decode in [Decode::Client, Decode::Server] {
        let pool = pg_pool(&Cluster::Icu.database(db), 1).unwrap();
        let mut options = PgSnapshotStoreOptions::new();
        options.codec(Codec::Zstd).decode(decode);
        let snapshots = rt
            .block_on(PgSnapshotStore::start(pool.clone(), &options))
            .unwrap();
        let events = pgloom::event_store::PgEventStore::new(pool);
        for resumed in [
            rt.block_on(snapshots.resume("e")),
            rt.block_on(pgloom::resume::resume(&events, &snapshots, "e")),
        ] {
            match (decode, resumed) {
                (Decode::Client, Err(Error::Decode(_))) => {}
                (Decode::Server, Err(e)) if e.sqlstate() == Some("XX001") => {}
                (decode, other) => panic!("{decode:?}: {other:?}"),
            }
        }
    }
}

/// A zstd store whose start could not add the frame column writes JSONB,
/// and starts writing frames once a peer added it: it reads the catalog
/// again at its first save after `reprobe_interval`, not only on the
/// check's 23514 (which never comes while it is the one writing JSONB) or
/// at a restart.
#[test]
fn a_deferred_zstd_store_writes_frames_once_a_peer_added_the_column() {
    let db = "loom_it_snap_reprobe";
    // A deployment from before frames: no frame column yet.
    let mut setup = Cluster::Icu.fresh_database_at(db, "0.2.0");
    upgrade_extension(&mut setup, loom_harness::LOOM_VERSION).unwrap();
    let rt = runtime();
    let holder = Cluster::Icu.hold_lock(db, "snapshots", "ACCESS SHARE");
    let mut options = PgSnapshotStoreOptions::new();
    options
        .codec(Codec::Zstd)
        .reprobe_interval(std::time::Duration::from_millis(200));
    let deferred = rt
        .block_on(PgSnapshotStore::start(
            pg_pool(&Cluster::Icu.database(db), 1).unwrap(),
            &options,
        ))
        .unwrap();
    assert_eq!(
        deferred.frame_provisioning(),
        pgloom::snapshot_store::FrameProvisioning::Deferred
    );
    assert!(!deferred.writes_frames());
    rt.block_on(deferred.save(&snapshot("reprobe", 1, r#"{"n":1}"#)))
        .unwrap();
    drop(holder);
    // A peer (another replica's start) adds the column.
    let _peer = store(&rt, db, Codec::Zstd, Decode::Client);
    std::thread::sleep(std::time::Duration::from_millis(250));
    rt.block_on(deferred.save(&snapshot("reprobe", 2, r#"{"n":2}"#)))
        .unwrap();
    assert!(deferred.writes_frames());
    let framed: Vec<bool> = Cluster::Icu
        .connect(db)
        .query(
            "SELECT state_z IS NOT NULL FROM loom.snapshots WHERE execution_id = 'reprobe' ORDER BY sequence",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(framed, [false, true]);
}

#[test]
fn each_tenant_resumes_its_own_through_postgres_views() {
    use std::sync::Arc;

    use common::tenants::{tenant, two_tenants};
    use pgloom::conformance::check_resume_and_retention;
    use pgloom::event_store::{PgEventStore, TenantScopedEventStore};
    use pgloom::snapshot_store::TenantScopedSnapshotStore;

    let rt = runtime();
    for (codec, decode, fidelity) in [
        (Codec::None, Decode::Client, Fidelity::Jsonb),
        (Codec::Zstd, Decode::Server, Fidelity::Exact),
    ] {
        let db = format!("loom_it_tenants_{codec}").to_lowercase();
        let _ = Cluster::Icu.fresh_database(&db);
        let snapshots = Arc::new(store(&rt, &db, codec, decode));
        let events = Arc::new(PgEventStore::new(
            pg_pool(&Cluster::Icu.database(&db), 2).unwrap(),
        ));
        rt.block_on(two_tenants(
            events.clone(),
            snapshots.clone(),
            TenantScopedEventStore::new,
            TenantScopedSnapshotStore::new,
        ));
        // The kits over one tenant's views, beside the two above.
        let view = TenantScopedSnapshotStore::new(snapshots.clone(), tenant("kit"));
        rt.block_on(check_snapshot_store(&view, codec, fidelity))
            .unwrap_or_else(|f| panic!("{codec}: {f}"));
        rt.block_on(check_resume_and_retention(
            &TenantScopedEventStore::new(events, tenant("kit")),
            &view,
        ))
        .unwrap_or_else(|f| panic!("{codec}: {f}"));
    }
}

/// `PgSnapshotStore::new` builds without I/O and does no DDL: a zstd store
/// writes JSONB, saying so once, while the frame column is missing, and
/// frames once `migrate()` has provisioned it.
#[test]
fn a_store_built_by_new_frames_once_migrate_has_provisioned_the_column() {
    use pgloom::migrate::{migrate, MigrateOptions};
    use pgloom::snapshot_store::FrameProvisioning;
    use std::sync::{Arc, Mutex};
    let rt = runtime();
    let db = "loom_it_snap_new";
    // Upgraded from before frames: no column until asked for.
    let mut admin = Cluster::Icu.fresh_database_at(db, "0.2.0");
    upgrade_extension(&mut admin, loom_harness::LOOM_VERSION).unwrap();
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&warnings);
    let mut options = PgSnapshotStoreOptions::new();
    options
        .codec(Codec::Zstd)
        .reprobe_interval(std::time::Duration::from_millis(1))
        .on_warning(move |w| sink.lock().unwrap().push(w.to_owned()));
    let pool = pg_pool(&Cluster::Icu.database(db), 2).unwrap();
    let store = PgSnapshotStore::new(pool, &options).unwrap();
    assert_eq!(store.frame_provisioning(), FrameProvisioning::LeftToMigrate);
    let framed = |admin: &mut postgres::Client, sequence: i64| -> bool {
        admin
            .query_one(
                "SELECT state_z IS NOT NULL FROM loom.snapshots_stored WHERE execution_id = 'run-1' AND sequence = $1",
                &[&sequence],
            )
            .unwrap()
            .get(0)
    };
    rt.block_on(store.save(&snapshot("run-1", 1, r#"{"n":1}"#)))
        .unwrap();
    rt.block_on(store.save(&snapshot("run-1", 2, r#"{"n":2}"#)))
        .unwrap();
    assert!(!framed(&mut admin, 1) && !framed(&mut admin, 2));
    assert_eq!(warnings.lock().unwrap().len(), 1, "said once");

    rt.block_on(migrate(
        &Cluster::Icu.database(db),
        MigrateOptions::new().snapshot_codec(Codec::Zstd),
    ))
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    rt.block_on(store.save(&snapshot("run-1", 3, r#"{"n":3}"#)))
        .unwrap();
    assert!(framed(&mut admin, 3), "a frame once the column is there");
    let latest = rt.block_on(store.load_latest("run-1")).unwrap().unwrap();
    assert_eq!(latest.state.as_str(), r#"{"n":3}"#);
    assert_eq!(warnings.lock().unwrap().len(), 1);
}

/// Deltas the server wrote (`loom_save_snapshot(..., 'delta')`), read by
/// the client's store as exactly what was saved, decoded in the client
/// and in the server, by load, resume and the frame check; and, once a
/// keyframe is gone behind loom's back, a typed error, never a state.
#[test]
fn a_store_reads_the_deltas_the_server_wrote() {
    use pgloom::snapshot_store::SnapshotQuery;
    use pgloom_core::frame::DecodeFrameError;
    let rt = runtime();
    let db = "loom_it_snap_deltas";
    let mut client = Cluster::Icu.fresh_database(db);
    client
        .batch_execute("SELECT loom_ensure_snapshot_zstd()")
        .unwrap();
    let (states, keyframe) = save_delta_run(&mut client, "d", 25);
    let keyframe = keyframe.expect("the latest save is a delta");
    let deltas: i64 = client
        .query_one(
            "SELECT count(*) FROM loom.snapshots WHERE loom_snapshot_base_sequence(state_z) IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(deltas >= 15, "{deltas} deltas of 25");
    for decode in [Decode::Client, Decode::Server] {
        let store = store(&rt, db, Codec::Zstd, decode);
        rt.block_on(async {
            for (i, state) in states.iter().enumerate() {
                let sequence = i as i64 + 1;
                let at = store
                    .load("d", SnapshotQuery::At(sequence))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(at.state.as_str(), state, "{decode:?}: at {sequence}");
                let before = store
                    .load("d", SnapshotQuery::Before(sequence + 1))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(before.sequence, sequence, "{decode:?}");
            }
            let latest = store
                .load("d", SnapshotQuery::Latest)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(latest.state.as_str(), states[24], "{decode:?}");
            let resumed = store.resume("d").await.unwrap();
            assert_eq!(
                resumed
                    .snapshot
                    .map(|s| s.state.as_str().to_owned())
                    .as_deref(),
                Some(states[24].as_str()),
                "{decode:?}: resume"
            );
        });
    }
    let store = store(&rt, db, Codec::Zstd, Decode::Client);
    let check = rt.block_on(store.verify_frames(7, |_| {})).unwrap();
    assert_eq!((check.frames, check.unreadable.len()), (25, 0));
    // The latest delta's keyframe deleted by hand: its load and resume are
    // typed errors, and the frame check names the row.
    client
        .execute(
            "DELETE FROM loom.snapshots WHERE execution_id = 'd' AND sequence = $1",
            &[&keyframe],
        )
        .unwrap();
    let missing = |result: Result<_, Error>| match result {
        Err(Error::Decode(DecodeFrameError::DeltaBaseMissing { base_sequence })) => {
            assert_eq!(base_sequence, keyframe)
        }
        other => panic!("expected DeltaBaseMissing, got {:?}", other.map(|_| ())),
    };
    missing(
        rt.block_on(store.load("d", SnapshotQuery::Latest))
            .map(|_| ()),
    );
    missing(rt.block_on(store.resume("d")).map(|_| ()));
    let check = rt.block_on(store.verify_frames(7, |_| {})).unwrap();
    assert!(
        !check.unreadable.is_empty()
            && check.unreadable.iter().all(|u| matches!(
                u.cause,
                DecodeFrameError::DeltaBaseMissing { base_sequence } if base_sequence == keyframe
            )),
        "{check:?}"
    );
}

/// A client store saving over a keyframe the server's deltas name is
/// refused (55006), whatever it writes, and every delta still decodes;
/// the same state, framed as before, is allowed.
#[test]
fn a_store_never_saves_over_a_keyframe_that_deltas_name() {
    use pgloom::snapshot_store::{JsonText, NewSnapshot, SnapshotQuery};
    let rt = runtime();
    let db = "loom_it_snap_keyframe_kept";
    let mut client = Cluster::Icu.fresh_database(db);
    client
        .batch_execute("SELECT loom_ensure_snapshot_zstd()")
        .unwrap();
    let keyframe = save_delta_run(&mut client, "k", 12)
        .1
        .expect("the last save is a delta");
    let other = JsonText::new(r#"{"other":true}"#.to_owned()).unwrap();
    let same = JsonText::new(loom_fixtures::agent_state(keyframe as usize, false)).unwrap();
    for codec in [Codec::Zstd, Codec::None] {
        let store = store(&rt, db, codec, Decode::Client);
        let refused = rt
            .block_on(store.save(&NewSnapshot::new("k", "wf", keyframe, other.clone())))
            .unwrap_err();
        assert_eq!(refused.sqlstate(), Some("55006"), "{codec}: {refused}");
    }
    let store = store(&rt, db, Codec::Zstd, Decode::Client);
    rt.block_on(store.save(&NewSnapshot::new("k", "wf", keyframe, same)))
        .unwrap();
    for sequence in 1..=12 {
        let loaded = rt
            .block_on(store.load("k", SnapshotQuery::At(sequence)))
            .unwrap()
            .unwrap();
        assert_eq!(
            loaded.state.as_str(),
            loom_fixtures::agent_state(sequence as usize, false)
        );
    }
}

//! Delta snapshots written by the client (`Codec::Delta`): the server reads
//! them as it reads its own; a store whose cached keyframe a peer saved
//! over or deleted encodes again and never stores a delta no reader can
//! decode; `loom_store_snapshot` refuses a delta without its keyframe;
//! the same state saved again over a keyframe is taken, and a delete then
//! a save in the caller's transaction commits.

use loom_harness::{pg_pool, runtime, sqlstate, Cluster};
use pgloom::interop::deadpool_postgres::tokio_postgres::{self, NoTls};
use pgloom::snapshot_store::{
    Codec, Decode, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotQuery,
    SnapshotStore,
};
use postgres::Client;

const CLUSTER: Cluster = Cluster::Icu;

fn turn(n: i64) -> String {
    loom_fixtures::agent_state(usize::try_from(n).unwrap(), false)
}

fn delta_store(rt: &tokio::runtime::Runtime, db: &str, decode: Decode) -> PgSnapshotStore {
    let pool = pg_pool(&CLUSTER.database(db), 2).unwrap();
    let mut options = PgSnapshotStoreOptions::new();
    options.codec(Codec::Delta).decode(decode);
    rt.block_on(PgSnapshotStore::start(pool, &options)).unwrap()
}

/// Execution 'e' at `sequence` holding `state`.
fn snapshot(sequence: i64, state: &str) -> NewSnapshot {
    NewSnapshot::new(
        "e",
        "wf",
        sequence,
        JsonText::new(state.to_owned()).unwrap(),
    )
}

fn save(rt: &tokio::runtime::Runtime, store: &PgSnapshotStore, sequence: i64, state: &str) {
    rt.block_on(store.save(&snapshot(sequence, state)))
        .unwrap_or_else(|e| panic!("save {sequence}: {e}"));
}

/// A plain tokio-postgres connection to `db`, for a caller's transaction.
async fn caller(db: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&CLUSTER.database(db), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Each save `1..=turns` of execution 'e' reads back exactly, decoded in
/// the server (`loom_load_snapshot`, the view) and in the client.
fn every_save_reads_back(
    rt: &tokio::runtime::Runtime,
    client: &mut Client,
    store: &PgSnapshotStore,
    turns: i64,
) {
    for sequence in 1..=turns {
        let server: String = client
            .query_one(
                "SELECT loom_snapshot_state_text(s.state_z, b.state_z)
                 FROM loom.snapshots s LEFT JOIN loom.snapshots b
                   ON b.execution_id = s.execution_id
                  AND b.sequence = loom_snapshot_base_sequence(s.state_z)
                 WHERE s.execution_id = 'e' AND s.sequence = $1",
                &[&sequence],
            )
            .unwrap()
            .get(0);
        assert_eq!(server, turn(sequence), "server, turn {sequence}");
        let loaded = rt
            .block_on(store.load("e", SnapshotQuery::At(sequence)))
            .unwrap()
            .unwrap();
        assert_eq!(
            loaded.state.as_str(),
            turn(sequence),
            "client, turn {sequence}"
        );
    }
}

fn deltas_in(client: &mut Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM loom.snapshots WHERE substring(state_z FROM 1 FOR 1) = '\\x03'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// A run saved after every turn by a delta store is mostly deltas, and
/// every save reads back exactly wherever it is decoded.
#[test]
fn a_delta_store_writes_deltas_the_server_reads() {
    let rt = runtime();
    let db = "loom_it_client_deltas";
    let mut client = CLUSTER.fresh_database(db);
    let store = delta_store(&rt, db, Decode::Client);
    for sequence in 1..=40 {
        save(&rt, &store, sequence, &turn(sequence));
    }
    assert!(
        deltas_in(&mut client) >= 30,
        "{} deltas",
        deltas_in(&mut client)
    );
    every_save_reads_back(&rt, &mut client, &store, 40);
    let server = delta_store(&rt, db, Decode::Server);
    let latest = rt.block_on(server.load_latest("e")).unwrap().unwrap();
    assert_eq!(latest.state.as_str(), turn(40));
    let resumed = rt.block_on(store.resume("e")).unwrap();
    assert_eq!(resumed.snapshot.unwrap().state.as_str(), turn(40));
}

/// The keyframe a store cached is saved over by a peer (no delta named it
/// yet), then deleted with everything else: each time the store's next
/// save is refused by the server (40001), fetches the keyframe as it is,
/// encodes again, and stores a delta that decodes.
#[test]
fn a_store_whose_cached_keyframe_changed_encodes_again() {
    let rt = runtime();
    let db = "loom_it_client_deltas_stale";
    let mut client = CLUSTER.fresh_database(db);
    let store = delta_store(&rt, db, Decode::Client);
    let peer = delta_store(&rt, db, Decode::Client);
    save(&rt, &store, 1, &turn(20));
    // The peer saves another state over the keyframe the store cached.
    save(&rt, &peer, 1, &turn(21));
    save(&rt, &store, 2, &turn(22));
    assert_eq!(
        deltas_in(&mut client),
        1,
        "turn 22 is a delta of the new keyframe"
    );
    for (sequence, state) in [(1, turn(21)), (2, turn(22))] {
        let loaded = rt
            .block_on(store.load("e", SnapshotQuery::At(sequence)))
            .unwrap()
            .unwrap();
        assert_eq!(loaded.state.as_str(), state, "at {sequence}");
    }
    // Everything deleted under the store's cache: its next save has no
    // keyframe to name, so it is one.
    while rt.block_on(peer.delete_snapshots("e", 1000)).unwrap() > 0 {}
    save(&rt, &store, 3, &turn(23));
    assert_eq!(deltas_in(&mut client), 0);
    save(&rt, &store, 4, &turn(24));
    assert_eq!(deltas_in(&mut client), 1);
    let loaded = rt
        .block_on(store.load("e", SnapshotQuery::At(4)))
        .unwrap()
        .unwrap();
    assert_eq!(loaded.state.as_str(), turn(24));
}

/// `loom_store_snapshot` keeps a delta only beside its keyframe.
#[test]
fn a_delta_without_its_keyframe_is_refused() {
    let db = "loom_it_client_deltas_refused";
    let mut client = CLUSTER.fresh_database(db);
    client
        .batch_execute("SELECT loom_ensure_snapshot_zstd()")
        .unwrap();
    let (base, next) = (turn(5), turn(6));
    let delta = pgloom_core::frame::delta::encode_delta(
        &next,
        pgloom_core::frame::delta::Keyframe {
            sequence: 5,
            text: &base,
        },
    )
    .unwrap();
    let store = |client: &mut Client, sequence: i64, digest: Option<Vec<u8>>| {
        client
            .execute(
                "SELECT loom_store_snapshot('e', 'wf', $1, NULL, $2, $3)",
                &[&sequence, &delta, &digest],
            )
            .map(|_| ())
    };
    // No keyframe at 5: not a conflict to retry, a delta to encode again.
    let err = store(&mut client, 6, None).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    // The same with the digest of a keyframe read before it went: a race
    // lost, to retry.
    let err = store(&mut client, 6, Some(vec![0; 32])).unwrap_err();
    assert_eq!(sqlstate(&err), "40001", "{err}");
    // Named at or after its own sequence.
    let err = store(&mut client, 5, None).unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    client
        .execute(
            "SELECT loom_save_snapshot('e', 'wf', 5, $1, 'zstd')",
            &[&base],
        )
        .unwrap();
    // A digest that is not the keyframe's frame's.
    let err = store(&mut client, 6, Some(vec![0; 32])).unwrap_err();
    assert_eq!(sqlstate(&err), "40001", "{err}");
    // Outside READ COMMITTED.
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()
        .unwrap();
    let err = tx
        .execute(
            "SELECT loom_store_snapshot('e', 'wf', 6, NULL, $1)",
            &[&delta],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    drop(tx);
    let digest: Vec<u8> = client
        .query_one(
            "SELECT sha256(state_z) FROM loom.snapshots WHERE execution_id = 'e' AND sequence = 5",
            &[],
        )
        .unwrap()
        .get(0);
    store(&mut client, 6, Some(digest)).unwrap();
    let text: String = client
        .query_one("SELECT state::text FROM loom_load_snapshot('e', 6)", &[])
        .unwrap()
        .get(0);
    let expected: serde_json::Value = serde_json::from_str(&next).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        expected
    );
}

/// The same state saved again over a keyframe that later deltas name is
/// taken, even when the store's cached keyframe (an older one, cached by
/// a save further back) does not know of those deltas: the server says
/// 55006, and the store asks which keyframe to use before it gives up.
#[test]
fn the_same_state_again_over_a_named_keyframe_is_taken_whatever_is_cached() {
    let rt = runtime();
    let db = "loom_it_client_deltas_again";
    let mut client = CLUSTER.fresh_database(db);
    // A keyframe every fifth save, by count alone: a keyframe cached a
    // few saves back may still take deltas.
    let mut options = PgSnapshotStoreOptions::new();
    options
        .codec(Codec::Delta)
        .keyframe_policy(pgloom_core::frame::delta::KeyframePolicy {
            max_deltas: 4,
            max_delta_percent: 100,
        });
    let pool = pg_pool(&CLUSTER.database(db), 2).unwrap();
    let store = rt.block_on(PgSnapshotStore::start(pool, &options)).unwrap();
    for sequence in 1..=40 {
        save(&rt, &store, sequence, &turn(sequence));
    }
    // The last keyframe that deltas name, and an earlier save to cache
    // the keyframe before it.
    let named: i64 = client
        .query_one(
            "SELECT max(k.sequence) FROM loom.snapshots k
             WHERE k.execution_id = 'e' AND EXISTS (
                 SELECT 1 FROM loom.snapshots d WHERE d.execution_id = 'e'
                    AND loom_snapshot_base_sequence(d.state_z) = k.sequence)",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(named > 6, "a keyframe after the first: {named}");
    // Saved again a few saves back: the keyframe before `named`, cached
    // with fewer deltas than it has, still takes one.
    save(&rt, &store, named - 3, &turn(named - 3));
    save(&rt, &store, named, &turn(named));
    every_save_reads_back(&rt, &mut client, &store, 40);
    // Another state there is refused, typed, and nothing changes.
    let refused = rt
        .block_on(store.save(&snapshot(named, &turn(3))))
        .unwrap_err();
    assert!(
        matches!(refused, pgloom::Error::KeyframeInUse { sequence, .. } if sequence == named),
        "{refused:?}"
    );
    assert_eq!(refused.sqlstate(), Some("55006"));
    every_save_reads_back(&rt, &mut client, &store, 40);
}

/// On the caller's transaction, a delete of the execution's snapshots
/// then a save: the save does not name the keyframe the delete took.
#[test]
fn a_delete_then_a_save_in_the_callers_transaction_commits() {
    let rt = runtime();
    let db = "loom_it_client_deltas_caller";
    let mut client = CLUSTER.fresh_database(db);
    let store = delta_store(&rt, db, Decode::Client);
    for sequence in 1..=5 {
        save(&rt, &store, sequence, &turn(sequence + 20));
    }
    rt.block_on(async {
        let mut caller = caller(db).await;
        let tx = caller.transaction().await.unwrap();
        let on = store.on(&tx);
        while on.delete_snapshots("e", 1000).await.unwrap() > 0 {}
        on.save(&snapshot(6, &turn(26))).await.unwrap();
        tx.commit().await.unwrap();
    });
    assert_eq!(
        deltas_in(&mut client),
        0,
        "the first save after a delete is a keyframe"
    );
    let loaded = rt
        .block_on(store.load("e", SnapshotQuery::At(6)))
        .unwrap()
        .unwrap();
    assert_eq!(loaded.state.as_str(), turn(26));
}

/// A keyframe saved on the caller's transaction that rolls back is not
/// what the next save on another of its transactions writes against: the
/// keyframe is read in the caller's transaction, never from the cache.
#[test]
fn a_rolled_back_keyframe_is_never_a_later_deltas_keyframe() {
    let rt = runtime();
    let db = "loom_it_client_deltas_rollback";
    let mut client = CLUSTER.fresh_database(db);
    let store = delta_store(&rt, db, Decode::Client);
    rt.block_on(async {
        let mut caller = caller(db).await;
        let tx = caller.transaction().await.unwrap();
        store.on(&tx).save(&snapshot(1, &turn(20))).await.unwrap();
        tx.rollback().await.unwrap();
        let tx = caller.transaction().await.unwrap();
        store.on(&tx).save(&snapshot(2, &turn(21))).await.unwrap();
        tx.commit().await.unwrap();
    });
    // And through the pool, the same.
    save(&rt, &store, 3, &turn(22));
    assert_eq!(deltas_in(&mut client), 1, "turn 22 is a delta of turn 21");
    let loaded = rt
        .block_on(store.load("e", SnapshotQuery::At(3)))
        .unwrap()
        .unwrap();
    assert_eq!(loaded.state.as_str(), turn(22));
}

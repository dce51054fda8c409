//! Delta snapshots (0x03) under concurrency, saved in the server: a save over a
//! keyframe and a delta save that takes it as its keyframe, in either
//! order, never leave a delta that does not decode; outside READ
//! COMMITTED both refuse; a role granted DELETE by hand still deletes.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use loom_harness::{describe, save_delta_run, sqlstate, Cluster};
use postgres::Client;

const CLUSTER: Cluster = Cluster::Icu;

/// A database with frames and `turns` saves of execution 'e' as deltas:
/// the keyframe the last one names.
fn run_of(db: &str, turns: usize) -> (Client, i64) {
    let mut client = CLUSTER.fresh_database(db);
    client
        .batch_execute("SELECT loom_ensure_snapshot_zstd()")
        .unwrap();
    let (_, keyframe) = save_delta_run(&mut client, "e", turns);
    (client, keyframe.expect("the last save is a delta"))
}

fn save(
    client: &mut Client,
    sequence: i64,
    state: &str,
    codec: &str,
) -> Result<(), postgres::Error> {
    client
        .execute(
            "SELECT loom_save_snapshot('e', 'wf', $1, $2, $3)",
            &[&sequence, &state, &codec],
        )
        .map(|_| ())
}

/// A role granted what a hand-written grant gives a deleter (SELECT and
/// DELETE on loom.snapshots), and no EXECUTE on the execution's delete
/// lock: a delete without the lock loom_grant_access gives.
fn hand_granted_deleter(client: &mut Client, role: &str) {
    client
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role};
             CREATE ROLE {role};
             GRANT USAGE ON SCHEMA loom TO {role};
             GRANT SELECT, DELETE ON loom.snapshots TO {role};
             REVOKE EXECUTE ON FUNCTION loom_lock_execution_for_delete(text) FROM PUBLIC"
        ))
        .unwrap();
}

/// Every row of the execution decodes through the view.
fn every_row_decodes(client: &mut Client) {
    let rows: i64 = client
        .query_one(
            "SELECT count(*) FROM loom.snapshots_decoded WHERE execution_id = 'e' AND state IS NOT NULL",
            &[],
        )
        .unwrap_or_else(|e| panic!("a row does not decode: {}", describe(&e)))
        .get(0);
    assert!(rows > 0);
}

/// A save over the keyframe holds it; a delta save that takes it waits,
/// then writes against the keyframe as saved over.
#[test]
fn a_delta_save_waits_for_a_save_over_its_keyframe_and_uses_the_new_one() {
    let db = "loom_it_deltas_over_first";
    let (mut over, keyframe) = run_of(db, 12);
    let mut tx = over.transaction().unwrap();
    // The keyframe the last delta names, saved over with another state:
    // refused, whoever asks.
    let err = tx
        .execute(
            "SELECT loom_save_snapshot('e', 'wf', $1, $2, 'zstd')",
            &[&keyframe, &loom_fixtures::agent_state(2, true)],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "55006", "{}", describe(&err));
    drop(tx);
    // Now a keyframe no delta names yet, saved over in an open
    // transaction while a delta save takes it.
    let fresh = 13;
    save(
        &mut over,
        fresh,
        &loom_fixtures::agent_state(13, false),
        "zstd",
    )
    .unwrap();
    let mut tx = over.transaction().unwrap();
    tx.execute(
        "SELECT loom_save_snapshot('e', 'wf', $1, $2, 'zstd')",
        &[&fresh, &loom_fixtures::agent_state(13, true)],
    )
    .unwrap();
    let (done, waited) = mpsc::channel();
    let saver = thread::spawn(move || {
        let mut client = CLUSTER.connect(db);
        let saved = save(
            &mut client,
            14,
            &loom_fixtures::agent_state(14, false),
            "delta",
        );
        done.send(()).unwrap();
        saved.map_err(|e| describe(&e))
    });
    assert!(
        waited.recv_timeout(Duration::from_millis(500)).is_err(),
        "the delta save did not wait for the save over its keyframe"
    );
    tx.commit().unwrap();
    saver.join().unwrap().unwrap();
    every_row_decodes(&mut over);
}

/// A delta save holds its keyframe; a save over that keyframe waits, then
/// sees the delta and is refused.
#[test]
fn a_save_over_a_keyframe_waits_for_a_delta_save_and_is_refused() {
    let db = "loom_it_deltas_delta_first";
    let (mut client, _) = run_of(db, 12);
    let mut tx = client.transaction().unwrap();
    tx.execute(
        "SELECT loom_save_snapshot('e', 'wf', 13, $1, 'delta')",
        &[&loom_fixtures::agent_state(13, false)],
    )
    .unwrap();
    let keyframe: i64 = tx
        .query_one(
            "SELECT loom_snapshot_base_sequence(state_z) FROM loom.snapshots
             WHERE execution_id = 'e' AND sequence = 13",
            &[],
        )
        .unwrap()
        .get::<_, Option<i64>>(0)
        .expect("13 is a delta");
    let (done, waited) = mpsc::channel();
    let over = thread::spawn(move || {
        let mut client = CLUSTER.connect(db);
        let saved = save(&mut client, keyframe, "{\"other\":true}", "zstd");
        done.send(()).unwrap();
        saved.map_err(|e| sqlstate(&e))
    });
    assert!(
        waited.recv_timeout(Duration::from_millis(500)).is_err(),
        "the save over the keyframe did not wait for the delta save"
    );
    tx.commit().unwrap();
    assert_eq!(over.join().unwrap(), Err("55006".to_owned()));
    every_row_decodes(&mut client);
}

#[test]
fn outside_read_committed_saves_over_and_deletes_are_refused() {
    let db = "loom_it_deltas_isolation";
    let (mut client, keyframe) = run_of(db, 12);
    for isolation in ["REPEATABLE READ", "SERIALIZABLE"] {
        for sql in [
            format!("SELECT loom_save_snapshot('e', 'wf', {keyframe}, '[]', 'zstd')"),
            "SELECT loom_save_snapshot('e', 'wf', 99, '[]', 'delta')".to_owned(),
            "SELECT loom_delete_snapshots('e', 1)".to_owned(),
        ] {
            let mut tx = client.transaction().unwrap();
            tx.batch_execute(&format!("SET TRANSACTION ISOLATION LEVEL {isolation}"))
                .unwrap();
            let err = tx.execute(&sql, &[]).unwrap_err();
            assert_eq!(
                sqlstate(&err),
                "0A000",
                "{isolation}: {sql}: {}",
                describe(&err)
            );
        }
    }
    // A new snapshot, not a delta, saves as before in any isolation.
    let mut tx = client.transaction().unwrap();
    tx.batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    tx.execute(
        "SELECT loom_save_snapshot('e', 'wf', 200, '[]', 'zstd')",
        &[],
    )
    .unwrap();
    tx.commit().unwrap();
    every_row_decodes(&mut client);
}

/// A role granted DELETE on loom.snapshots by hand (no lock function)
/// still deletes an execution's snapshots, as it deleted events before.
#[test]
fn a_role_granted_delete_by_hand_still_deletes_snapshots() {
    let db = "loom_it_deltas_hand_grant";
    let (mut client, _) = run_of(db, 6);
    hand_granted_deleter(&mut client, "loom_it_hand_deleter");
    let mut tx = client.transaction().unwrap();
    tx.batch_execute("SET LOCAL ROLE loom_it_hand_deleter")
        .unwrap();
    let deleted: i64 = tx
        .query_one("SELECT loom_delete_snapshots('e', 100)", &[])
        .unwrap_or_else(|e| panic!("{}", describe(&e)))
        .get(0);
    assert_eq!(deleted, 6);
    tx.rollback().unwrap();
}

/// A role granted DELETE by hand deletes without the execution's lock, so
/// its delete can wait on a keyframe that a delta save holds, and then,
/// its snapshot older than the delta, take the keyframe: the batch is
/// undone (40001) instead, and the next one deletes the delta first.
#[test]
fn a_hand_granted_delete_racing_a_delta_save_is_undone_never_strands_it() {
    let db = "loom_it_deltas_hand_race";
    let mut client = CLUSTER.fresh_database(db);
    client
        .batch_execute("SELECT loom_ensure_snapshot_zstd()")
        .unwrap();
    hand_granted_deleter(&mut client, "loom_it_hand_racer");
    let turn = |n| loom_fixtures::agent_state(n, false);
    save(&mut client, 1, &turn(20), "zstd").unwrap();
    // The delta save, held open: it holds its keyframe FOR SHARE.
    let mut saver = CLUSTER.connect(db);
    let mut saving = saver.transaction().unwrap();
    saving
        .execute(
            "SELECT loom_save_snapshot('e', 'wf', 2, $1, 'delta')",
            &[&turn(21)],
        )
        .unwrap();
    let (done, result) = mpsc::channel();
    let deleter = thread::spawn(move || {
        let mut deleter = CLUSTER.connect(db);
        let outcome = deleter
            .batch_execute("SET ROLE loom_it_hand_racer; SELECT loom_delete_snapshots('e', 1)")
            .map_err(|e| sqlstate(&e));
        done.send(outcome).unwrap();
    });
    // The deleter waits on the keyframe's row until the save commits:
    // commit only once it does (its snapshot is then older than the delta).
    let started = std::time::Instant::now();
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&db],
            )
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the delete never waited on the keyframe"
        );
        assert!(result.try_recv().is_err(), "the delete ran without waiting");
        thread::sleep(Duration::from_millis(20));
    }
    saving.commit().unwrap();
    let outcome = result.recv_timeout(Duration::from_secs(30)).unwrap();
    deleter.join().unwrap();
    assert_eq!(outcome, Err("40001".to_owned()));
    let deltas: i64 = client
        .query_one(
            "SELECT count(*) FROM loom.snapshots WHERE execution_id = 'e'
               AND loom_snapshot_base_sequence(state_z) = 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(deltas, 1, "the save was a delta of the keyframe");
    every_row_decodes(&mut client);
    // Called again, it takes the delta first.
    let mut tx = client.transaction().unwrap();
    tx.batch_execute("SET LOCAL ROLE loom_it_hand_racer")
        .unwrap();
    let first: i64 = tx
        .query_one("SELECT loom_delete_snapshots('e', 1)", &[])
        .unwrap()
        .get(0);
    assert_eq!(first, 1);
    let left: i64 = tx
        .query_one(
            "SELECT min(sequence) FROM loom.snapshots WHERE execution_id = 'e'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 1, "the keyframe outlives its delta");
    tx.commit().unwrap();
}

/// A delta that names another delta (only ever made by hand: every writer
/// names a keyframe) is undecodable already: a hand-granted delete of the
/// delta it names goes on, never refused batch after batch.
#[test]
fn a_delta_of_a_delta_made_by_hand_never_blocks_a_delete() {
    use pgloom_core::frame::delta::{encode_delta, Keyframe};
    let db = "loom_it_deltas_of_deltas";
    let mut client = CLUSTER.fresh_database(db);
    client
        .batch_execute("SELECT loom_ensure_snapshot_zstd()")
        .unwrap();
    hand_granted_deleter(&mut client, "loom_it_hand_chain");
    let turn = |n| loom_fixtures::agent_state(n, false);
    let keyframe = pgloom_core::frame::encode(&turn(20), pgloom_core::frame::Codec::Zstd).unwrap();
    let first = encode_delta(
        &turn(21),
        Keyframe {
            sequence: 5,
            text: &turn(20),
        },
    )
    .unwrap();
    let second = encode_delta(
        &turn(22),
        Keyframe {
            sequence: 6,
            text: &turn(21),
        },
    )
    .unwrap();
    for (sequence, frame) in [(5_i64, &keyframe), (6, &first), (8, &second)] {
        client
            .execute(
                "INSERT INTO loom.snapshots (execution_id, workflow_id, sequence, state, state_z)
                 VALUES ('e', 'wf', $1, '{\"__loomEnc\":\"loom.snapshot-frame/state_z\"}', $2)",
                &[&sequence, frame],
            )
            .unwrap();
    }
    let mut deleted = 0;
    for _ in 0..3 {
        let mut tx = client.transaction().unwrap();
        tx.batch_execute("SET LOCAL ROLE loom_it_hand_chain")
            .unwrap();
        deleted += tx
            .query_one("SELECT loom_delete_snapshots('e', 1)", &[])
            .unwrap_or_else(|e| panic!("{}", describe(&e)))
            .get::<_, i64>(0);
        tx.commit().unwrap();
    }
    assert_eq!(deleted, 3);
}

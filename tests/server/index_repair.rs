//! The executions index verified and repaired online (issue 26): in
//! batches, beside writers appending to and deleting the same executions,
//! in an ICU database with ids whose code point order differs from the
//! locale's. Afterwards the index must hold exactly the log's ids, and a
//! verification that ran beside the writers on an index in step must have
//! found nothing: each batch reads both sides in one snapshot.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use loom_harness::{adversarial_id, describe, sqlstate, Cluster};
use postgres::Client;

const EXECUTIONS: u64 = 3000;

/// Ids of the log not in the index, and of the index without events,
/// counted by a plain full comparison (the reference the batches must
/// agree with).
fn disagreement(client: &mut Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM (SELECT DISTINCT execution_id FROM loom.events) e
                     WHERE NOT EXISTS (SELECT 1 FROM loom.executions x WHERE x.execution_id = e.execution_id)),
                    (SELECT count(*) FROM loom.executions x
                     WHERE NOT EXISTS (SELECT 1 FROM loom.events e WHERE e.execution_id = x.execution_id))",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// Runs `function` (verify or repair) batch after batch from the first id,
/// each in its own transaction, and sums its two counts.
fn walk(client: &mut Client, function: &str, max_ids: i32) -> (i64, i64, i64) {
    let (mut checked, mut first, mut second) = (0, 0, 0);
    let mut after: Option<String> = None;
    loop {
        let row = client
            .query_one(
                &format!("SELECT * FROM {function}($1, $2)"),
                &[&after, &max_ids],
            )
            .unwrap_or_else(|e| panic!("{function}: {}", describe(&e)));
        checked += row.get::<_, i64>(0);
        first += row.get::<_, i64>(1);
        second += row.get::<_, i64>(2);
        let next: Option<String> = row.get(3);
        if row.get::<_, bool>(4) {
            return (checked, first, second);
        }
        assert!(next > after || after.is_none(), "the cursor moves on");
        after = next;
    }
}

/// Writers on the same executions until `stop`: one appending (to ids
/// that exist and to new ones), one deleting whole executions. Returns
/// once both have written, so that what runs next runs beside them (on a
/// busy machine a short walk could otherwise end before either connects).
fn writers(db: &'static str, stop: &Arc<AtomicBool>) -> Vec<thread::JoinHandle<u64>> {
    let writing = Arc::new(AtomicU64::new(0));
    let appender = {
        let stop = Arc::clone(stop);
        let writing = Arc::clone(&writing);
        thread::spawn(move || {
            let mut client = Cluster::Icu.connect(db);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let id = adversarial_id(if n % 3 == 0 {
                    EXECUTIONS + n
                } else {
                    (n * 7) % EXECUTIONS
                });
                client
                    .execute(
                        "SELECT loom_append_event($1, coalesce((SELECT max(sequence) FROM loom.events WHERE execution_id = $1), 0) + 1, 'step', '{}')",
                        &[&id],
                    )
                    .ok();
                if n == 0 {
                    writing.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
            n
        })
    };
    let deleter = {
        let stop = Arc::clone(stop);
        let writing = Arc::clone(&writing);
        thread::spawn(move || {
            let mut client = Cluster::Icu.connect(db);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let id = adversarial_id((n * 13 + 5) % EXECUTIONS);
                client
                    .execute("SELECT loom_delete_execution($1)", &[&id])
                    .unwrap();
                if n == 0 {
                    writing.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
            n
        })
    };
    let started = Instant::now();
    while writing.load(Ordering::Relaxed) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the writers did not start within a minute"
        );
        thread::sleep(Duration::from_millis(5));
    }
    vec![appender, deleter]
}

fn loaded(db: &'static str) -> Client {
    let mut client = Cluster::Icu.fresh_database(db);
    let ids: Vec<String> = (0..EXECUTIONS).map(adversarial_id).collect();
    client
        .execute(
            "SELECT loom_append_events(i, array_fill(1::bigint, ARRAY[cardinality(i)]),
                                       array_fill('step'::text, ARRAY[cardinality(i)]),
                                       array_fill('{}'::jsonb, ARRAY[cardinality(i)]))
             FROM (SELECT $1::text[] AS i) a",
            &[&ids],
        )
        .unwrap();
    client
}

#[test]
fn a_repair_beside_appends_and_deletes_leaves_the_index_exact() {
    let db = "loom_it_index_repair";
    let mut owner = loaded(db);
    // Damage both ways, as a restore without triggers would: a tenth of
    // the ids dropped from the index, and ids it lists without events,
    // some between the log's ids, some after all of them.
    owner
        .execute(
            "DELETE FROM loom.executions WHERE execution_id = ANY($1)",
            &[&(0..EXECUTIONS)
                .step_by(10)
                .map(adversarial_id)
                .collect::<Vec<_>>()],
        )
        .unwrap();
    owner
        .batch_execute(
            "INSERT INTO loom.executions SELECT 'ghost-' || i FROM generate_series(1, 150) i;
             INSERT INTO loom.executions VALUES ('\u{10FFFF}ghost');",
        )
        .unwrap();
    let damaged = disagreement(&mut owner);
    assert_eq!(damaged, (300, 151));

    let stop = Arc::new(AtomicBool::new(false));
    let writing = writers(db, &stop);
    let mut repairer = Cluster::Icu.connect(db);
    let (checked, added, removed) = walk(&mut repairer, "loom_repair_executions", 97);
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = writing.into_iter().map(|w| w.join().unwrap()).collect();
    let (appends, deletes) = (counts[0], counts[1]);
    let writes = appends + deletes;
    assert!(writes > 0);
    // Every id no delete reached was there for the whole walk, so it was
    // checked: the deleter may empty any of the others first (it cycles
    // through all of them), however fast it runs beside the walk.
    assert!(
        checked + deletes as i64 >= EXECUTIONS as i64,
        "{checked} checked, {deletes} deletes"
    );
    assert!(added > 0 && removed > 0, "{added} {removed}");
    assert_eq!(
        disagreement(&mut owner),
        (0, 0),
        "after the repair and {writes} writes"
    );
}

#[test]
fn a_verification_beside_writers_finds_nothing_on_an_index_in_step() {
    let db = "loom_it_index_verify";
    let mut owner = loaded(db);
    owner
        .batch_execute(
            "DROP ROLE IF EXISTS loom_verify_reader; CREATE ROLE loom_verify_reader LOGIN;
             SELECT loom_grant_access('loom_verify_reader', 'reader');",
        )
        .unwrap();
    let mut reader = Cluster::Icu.connect_as(db, "loom_verify_reader");
    let stop = Arc::new(AtomicBool::new(false));
    let writing = writers(db, &stop);
    let rounds = AtomicU64::new(0);
    for max_ids in [1, 13, 1000] {
        let (checked, missing, orphaned) = walk(&mut reader, "loom_verify_executions", max_ids);
        assert_eq!(
            (missing, orphaned),
            (0, 0),
            "batches of {max_ids}, {checked} checked"
        );
        rounds.fetch_add(1, Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    for w in writing {
        w.join().unwrap();
    }
    // A reader verifies; only the owner repairs.
    let refused = reader
        .query_one("SELECT * FROM loom_repair_executions()", &[])
        .unwrap_err();
    assert_eq!(sqlstate(&refused), "42501", "{}", describe(&refused));
    assert_eq!(disagreement(&mut owner), (0, 0));
}

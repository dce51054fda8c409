//! Claims with fencing against a real server (issue 38): a worker stopped
//! past its lease (SIGSTOP) cannot write once another worker claimed its
//! execution; a timer is not claimable before its time and is after;
//! eight workers share a queue, each execution run by one at a time; a
//! reader can neither claim nor see ids it may not read.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use loom_harness::{pg_pool, runtime, Cluster};
use pgloom::claims::{ClaimOptions, Outcome, PgClaims};
use pgloom::event_store::{Event, EventStore, PgEventStore};

fn claims(conninfo: &str, queue: &str, worker: &str, lease: Duration) -> PgClaims {
    PgClaims::new(
        pg_pool(conninfo, 4).unwrap(),
        ClaimOptions::new(queue, worker).lease(lease),
    )
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

#[test]
fn a_worker_stopped_past_its_lease_is_fenced_out_of_every_write() {
    let rt = runtime();
    let db = "loom_it_claims_zombie";
    let mut admin = Cluster::C.fresh_database(db);
    let conninfo = Cluster::C.database(db);
    let second = claims(&conninfo, "zombies", "second", Duration::from_secs(30));
    rt.block_on(second.schedule("run-z", None)).unwrap();
    let mut zombie = Command::new(env!("CARGO_BIN_EXE_loom-claim-worker"))
        .args([conninfo.as_str(), "zombies", "run-z", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(zombie.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "claimed 1");
    // Stopped, as a GC pause or a SIGSTOP stops it, past its 1 s lease.
    signal(zombie.id(), "-STOP");
    let started = Instant::now();
    let taken = loop {
        let batch = rt.block_on(second.claim(1)).unwrap();
        if let Some(claim) = batch.into_iter().next() {
            break claim;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the lapsed lease was never claimable"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Not before the lease lapsed: order, not exact times.
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "claimed after {:?}",
        started.elapsed()
    );
    assert_eq!(
        (
            taken.fence,
            taken
                .lapsed_holder
                .as_deref()
                .map(|h| h.starts_with("zombie-"))
        ),
        (2, Some(true))
    );
    // The new holder writes, fenced.
    rt.block_on(async {
        let pool = pg_pool(&conninfo, 2).unwrap();
        let events = PgEventStore::new(pool.clone());
        let mut conn = pool.as_ref().get().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        second.check_fence(&tx, &taken).await.unwrap();
        events
            .on(&tx)
            .append(&[
                Event::new("run-z", 1, "second", serde_json::json!({})),
                Event::new("run-z", 2, "second", serde_json::json!({})),
            ])
            .await
            .unwrap();
        tx.commit().await.unwrap();
    });
    // The zombie wakes and writes as if it still held the claim.
    signal(zombie.id(), "-CONT");
    zombie.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let said: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(zombie.wait().unwrap().success());
    assert_eq!(
        said,
        [
            "append FencedOut",
            "save FencedOut",
            "put_ref FencedOut",
            "renew FencedOut"
        ]
    );
    // The history is the second worker's alone; nothing of the zombie's.
    let rows: Vec<(i64, String)> = admin
        .query(
            "SELECT sequence, kind FROM loom.events WHERE execution_id = 'run-z' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, [(1, "second".to_owned()), (2, "second".to_owned())]);
    let leftovers: i64 = admin
        .query_one(
            "SELECT (SELECT count(*) FROM loom.snapshots) + (SELECT count(*) FROM loom.refs)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(leftovers, 0);
    // And the new holder completes; the zombie's token stays spent.
    rt.block_on(second.complete(&taken, None)).unwrap();
}

#[test]
fn a_timer_is_claimable_only_from_its_time_on() {
    let rt = runtime();
    let db = "loom_it_claims_timer";
    let _ = Cluster::C.fresh_database(db);
    let worker = claims(
        &Cluster::C.database(db),
        "timers",
        "w",
        Duration::from_secs(30),
    );
    rt.block_on(async {
        let scheduled_at = Instant::now();
        worker
            .schedule("sleeper", Some(SystemTime::now() + Duration::from_secs(2)))
            .await
            .unwrap();
        let mut claimed = None;
        while claimed.is_none() {
            let batch = worker.claim(10).await.unwrap();
            if batch.is_empty() {
                // Before its time: nothing. Bound, not an exact time.
                assert!(
                    scheduled_at.elapsed() < Duration::from_secs(30),
                    "never claimable"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            } else {
                claimed = Some((scheduled_at.elapsed(), batch));
            }
        }
        let (after, batch) = claimed.unwrap();
        assert!(
            after >= Duration::from_millis(1900),
            "claimed after {after:?}, before its time"
        );
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].execution_id, "sleeper");
        let counts = worker.counts().await.unwrap();
        assert_eq!(
            (counts[0].claimed, counts[0].due, counts[0].scheduled),
            (1, 0, 0)
        );
    });
}

#[test]
fn eight_workers_run_each_execution_once_at_a_time_and_every_one() {
    let _heavy = crate::hostile_frames::heavy();
    let rt = runtime();
    let db = "loom_it_claims_workers";
    let mut admin = Cluster::C.fresh_database(db);
    let conninfo = Cluster::C.database(db);
    admin
        .batch_execute(
            "SELECT loom_schedule('job-' || i, NULL, 'jobs') FROM generate_series(1, 200) i",
        )
        .unwrap();
    let ran = std::sync::Mutex::new(Vec::<String>::new());
    let running = std::sync::Mutex::new(HashSet::<String>::new());
    rt.block_on(async {
        let workers = (0..8).map(|w| {
            let claims = claims(&conninfo, "jobs", &format!("w{w}"), Duration::from_secs(30));
            let (ran, running) = (&ran, &running);
            async move {
                let deadline = tokio::time::sleep(Duration::from_secs(60));
                claims
                    .run(
                        4,
                        Duration::from_millis(50),
                        |claim| async move {
                            assert!(
                                running.lock().unwrap().insert(claim.execution_id.clone()),
                                "run twice at once"
                            );
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            running.lock().unwrap().remove(&claim.execution_id);
                            ran.lock().unwrap().push(claim.execution_id.clone());
                            Ok(Outcome::Done)
                        },
                        async {
                            // Stop once all ran (or at the deadline).
                            let mut deadline = std::pin::pin!(deadline);
                            loop {
                                if ran.lock().unwrap().len() >= 200 {
                                    return;
                                }
                                tokio::select! {
                                    _ = &mut deadline => return,
                                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                                }
                            }
                        },
                    )
                    .await
            }
        });
        for result in futures::future::join_all(workers).await {
            result.unwrap();
        }
    });
    let mut ran = ran.into_inner().unwrap();
    ran.sort();
    let mut expected: Vec<String> = (1..=200).map(|i| format!("job-{i}")).collect();
    expected.sort();
    assert_eq!(ran, expected, "each job ran exactly once");
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM loom.claims WHERE due_at IS NOT NULL OR holder IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

#[test]
fn a_reader_can_neither_claim_nor_fence_and_a_stranger_sees_nothing() {
    let rt = runtime();
    let db = "loom_it_claims_roles";
    let mut admin = Cluster::C.fresh_database(db);
    admin
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE loom_it_claims_reader LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE loom_it_claims_stranger LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             SELECT loom_grant_access('loom_it_claims_reader', 'reader');
             GRANT USAGE ON SCHEMA public TO loom_it_claims_stranger;
             SELECT loom_schedule('secret-run', NULL, 'q');",
        )
        .unwrap();
    let reader = claims(
        &format!(
            "{} user={}",
            Cluster::C.database(db),
            "loom_it_claims_reader"
        ),
        "q",
        "r",
        Duration::from_secs(30),
    );
    let stranger = claims(
        &format!(
            "{} user={}",
            Cluster::C.database(db),
            "loom_it_claims_stranger"
        ),
        "q",
        "s",
        Duration::from_secs(30),
    );
    rt.block_on(async {
        for (who, claims) in [("reader", &reader), ("stranger", &stranger)] {
            let refused = claims.claim(1).await.unwrap_err();
            assert_eq!(refused.sqlstate(), Some("42501"), "{who}: {refused}");
            let refused = claims.schedule("x", None).await.unwrap_err();
            assert_eq!(refused.sqlstate(), Some("42501"), "{who}: {refused}");
        }
        // The reader sees the counts; the stranger not even those.
        assert_eq!(reader.counts().await.unwrap()[0].due, 1);
        assert_eq!(
            stranger.counts().await.unwrap_err().sqlstate(),
            Some("42501")
        );
    });
    // A reader's fence check needs UPDATE, which it has not.
    let mut as_reader = Cluster::C.connect_as(db, "loom_it_claims_reader");
    let refused = as_reader
        .batch_execute("SELECT loom_check_fence('secret-run', 0)")
        .unwrap_err();
    assert_eq!(loom_harness::sqlstate(&refused), "42501");
}

#[test]
fn a_lease_is_renewed_while_its_handler_holds_a_fenced_write_open() {
    let _heavy = crate::hostile_frames::heavy();
    let rt = runtime();
    let db = "loom_it_claims_renew";
    let mut admin = Cluster::C.fresh_database(db);
    let pool = pg_pool(&Cluster::C.database(db), 2).unwrap();
    let claims = PgClaims::new(
        pool.clone(),
        ClaimOptions::new("long", "w").lease(Duration::from_secs(6)),
    );
    let finished = std::sync::atomic::AtomicBool::new(false);
    rt.block_on(async {
        claims.schedule("long-run", None).await.unwrap();
        let run = claims.run(
            1,
            Duration::from_millis(50),
            |claim| {
                let (pool, claims, finished) = (&pool, &claims, &finished);
                async move {
                    let mut conn = pool.as_ref().get().await?;
                    let tx = conn.transaction().await?;
                    claims.check_fence(&tx, &claim).await?;
                    PgEventStore::new(pool.clone())
                        .on(&tx)
                        .append(&[Event::new("long-run", 1, "slow", serde_json::json!({}))])
                        .await?;
                    // Longer than two thirds of the lease: renewals run (on
                    // the other connection, every 2 s) while this write is
                    // open, and do not wait for it; shorter than the lease,
                    // which bounds how long the write may idle.
                    tokio::time::sleep(Duration::from_millis(4500)).await;
                    let row = tx
                        .query_one(
                            "SELECT due_at FROM loom.claims WHERE execution_id = 'long-run'",
                            &[],
                        )
                        .await?;
                    let due: SystemTime = row.get(0);
                    assert!(
                        due > claim.lease_until,
                        "renewed while the fenced write was open"
                    );
                    tx.commit().await?;
                    finished.store(true, std::sync::atomic::Ordering::SeqCst);
                    Ok(Outcome::Done)
                }
            },
            async {
                while !finished.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        );
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("the worker finished: its renewals never waited on its own write")
            .unwrap();
    });
    let (events, held): (i64, bool) = {
        let row = admin
            .query_one(
                "SELECT (SELECT count(*) FROM loom.events), (SELECT holder IS NOT NULL FROM loom.claims)",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((events, held), (1, false));
}

#[test]
fn a_worker_paused_inside_a_fenced_write_loses_its_session_not_the_execution() {
    let _heavy = crate::hostile_frames::heavy();
    let rt = runtime();
    let db = "loom_it_claims_paused";
    let _ = Cluster::C.fresh_database(db);
    let conninfo = Cluster::C.database(db);
    let first = claims(&conninfo, "p", "first", Duration::from_secs(2));
    let second = claims(&conninfo, "p", "second", Duration::from_secs(30));
    rt.block_on(async {
        first.schedule("paused", None).await.unwrap();
        let claim = first.claim(1).await.unwrap().pop().unwrap();
        let pool = pg_pool(&conninfo, 1).unwrap();
        let mut conn = pool.as_ref().get().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        first.check_fence(&tx, &claim).await.unwrap();
        // Paused here, inside the fenced transaction, past the lease: its
        // session is ended once the lease is spent, and its lock with it.
        let started = Instant::now();
        let taken = loop {
            if let Some(taken) = second.claim(1).await.unwrap().pop() {
                break taken;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the paused worker kept the execution"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(taken.fence > claim.fence);
        assert!(tx.commit().await.is_err(), "the paused session was ended");
    });
}

/// A claim's plans are kept for the session and pinned to their index
/// walks (review of issue 38): a session whose first claims ran on a
/// handful of rows goes on walking the due index and the primary key once
/// the table has grown, not scanning it whole at every claim until it is
/// next analyzed. Read from the plans themselves (auto_explain), not a
/// timer.
#[test]
fn a_claims_kept_plans_walk_the_indexes_after_the_table_grows() {
    let db = "loom_it_claims_plans";
    let mut admin = Cluster::C.fresh_database(db);
    admin
        .batch_execute(
            "ALTER TABLE loom.claims SET (autovacuum_enabled = false);
             SELECT loom_schedule('small-' || i, NULL, 'q') FROM generate_series(1, 5) i;
             ANALYZE loom.claims;",
        )
        .unwrap();
    let (mut client, plans) = Cluster::C.connect_collecting_warnings(db);
    client
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_nested_statements = on;
             SET auto_explain.log_level = warning;",
        )
        .unwrap();
    // The session's first claims, on five rows: its plans are made then.
    for _ in 0..5 {
        client
            .batch_execute("SELECT * FROM loom_claim('q', 'w', interval '60 seconds', 1)")
            .unwrap();
    }
    admin
        .batch_execute(
            "INSERT INTO loom.claims (execution_id, queue, due_at)
             SELECT 'big-' || i, 'q', now() - interval '1 hour' FROM generate_series(1, 20000) i",
        )
        .unwrap();
    plans.lock().unwrap().clear();
    client
        .batch_execute("SELECT * FROM loom_claim('q', 'w', interval '60 seconds', 1)")
        .unwrap();
    let seen = plans.lock().unwrap().join("\n");
    assert!(
        seen.contains("Index Scan using claims_due")
            && seen.contains("Index Scan using claims_pkey"),
        "{seen}"
    );
    assert!(!seen.contains("Seq Scan"), "{seen}");
}

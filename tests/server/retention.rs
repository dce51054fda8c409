//! Retention by age in the server, from a client: the sweep procedure
//! committing batch by batch as a writer, refused to a reader and outside
//! READ COMMITTED, and scheduled with pg_cron on the cron cluster (where
//! pg_cron is packaged for the server under test; SKIPPED elsewhere).

use std::time::{Duration, Instant};

use loom_harness::{describe, listed_executions as ids, sqlstate, Cluster};
use postgres::Client;

/// `events` events for each of `ids`, written `age_days` days ago.
fn idle_log(client: &mut Client, ids: &[&str], events: i64, age_days: i64) {
    for id in ids {
        client
            .execute(
                "SELECT loom_append_event($1, s, 'step', '{}') FROM generate_series(1, $2::bigint) s",
                &[id, &events],
            )
            .unwrap();
        client
            .execute(
                "UPDATE loom.events SET created_at = now() - make_interval(days => $2::int) WHERE execution_id = $1",
                &[id, &(age_days as i32)],
            )
            .unwrap();
    }
}

#[test]
fn a_writer_sweeps_idle_executions_committing_batch_by_batch() {
    let db = "loom_it_retention";
    let cluster = Cluster::C;
    let mut owner = cluster.fresh_database(db);
    owner
        .batch_execute(
            "DROP ROLE IF EXISTS loom_ret_writer; DROP ROLE IF EXISTS loom_ret_reader;
             CREATE ROLE loom_ret_writer LOGIN; CREATE ROLE loom_ret_reader LOGIN;
             SELECT loom_grant_access('loom_ret_writer', 'writer');
             SELECT loom_grant_access('loom_ret_reader', 'reader');",
        )
        .unwrap();
    idle_log(&mut owner, &["idle-a", "idle-b"], 12, 40);
    idle_log(&mut owner, &["busy"], 3, 0);
    owner
        .batch_execute("SELECT loom_save_snapshot('idle-a', 'wf', 5, '{}')")
        .unwrap();
    let connect = |role: &str| cluster.connect_as(db, role);

    let mut reader = connect("loom_ret_reader");
    let refused = reader
        .batch_execute("CALL public.loom_sweep_idle_executions(interval '30 days', 10)")
        .unwrap_err();
    assert_eq!(sqlstate(&refused), "42501", "{}", describe(&refused));
    // Reading last activity is a reader's right.
    let idle: i64 = reader
        .query_one(
            "SELECT count(*) FROM loom_execution_activity() WHERE last_event_at < now() - interval '30 days'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(idle, 2);

    let mut writer = connect("loom_ret_writer");
    let repeatable = writer
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ;
             SELECT * FROM loom_delete_idle_executions('30 days')",
        )
        .unwrap_err();
    assert_eq!(sqlstate(&repeatable), "0A000", "{}", describe(&repeatable));
    writer.batch_execute("ROLLBACK").unwrap();

    // Inside a transaction block the procedure cannot commit its batches.
    let in_block = writer
        .batch_execute("BEGIN; CALL public.loom_sweep_idle_executions(interval '30 days', 10)")
        .unwrap_err();
    assert_eq!(sqlstate(&in_block), "2D000", "{}", describe(&in_block));
    writer.batch_execute("ROLLBACK").unwrap();
    assert_eq!(ids(&mut owner), ["busy", "idle-a", "idle-b"]);

    // 25 rows (24 events, a snapshot), at most 10 a batch: 3 batches.
    let (mut notices_writer, notices) = cluster.connect_collecting_warnings(db);
    // Its own statement: a multi-statement string is a transaction block.
    notices_writer
        .batch_execute("SET ROLE loom_ret_writer")
        .unwrap();
    notices_writer
        .batch_execute("CALL public.loom_sweep_idle_executions(interval '30 days', 10)")
        .unwrap();
    let said = notices.lock().unwrap().join("\n");
    assert!(
        said.contains(
            "loom: deleted 2 executions idle for more than 30 days (25 rows) in 3 batches"
        ),
        "{said}"
    );
    assert_eq!(ids(&mut owner), ["busy"]);
    let left: i64 = owner
        .query_one("SELECT count(*) FROM loom.events", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 3);
}

#[test]
fn pg_cron_runs_the_documented_sweep_on_its_schedule() {
    if !Cluster::cron_available("pg_cron_runs_the_documented_sweep_on_its_schedule") {
        return;
    }
    let db = "loom_it_cron";
    let mut app = Cluster::Cron.fresh_database(db);
    idle_log(&mut app, &["idle"], 4, 40);
    idle_log(&mut app, &["busy"], 2, 0);
    // pg_cron lives in cron.database_name (postgres); the job runs in the
    // application's database, as docs/operations.md schedules it.
    let mut cron = Cluster::Cron.connect("postgres");
    cron.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS pg_cron;
         SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = 'loom-retention-test';",
    )
    .unwrap();
    let job: i64 = cron
        .query_one(
            "SELECT cron.schedule_in_database('loom-retention-test', '* * * * *',
                 $$CALL public.loom_sweep_idle_executions(interval '30 days', 10000)$$, $1)",
            &[&db],
        )
        .unwrap()
        .get(0);
    // Every minute, on the minute: within 75 s it has run once.
    let deadline = Instant::now() + Duration::from_secs(75);
    let outcome = loop {
        let row = cron
            .query_opt(
                "SELECT status, return_message FROM cron.job_run_details
                 WHERE jobid = $1 AND status IN ('succeeded', 'failed') ORDER BY runid LIMIT 1",
                &[&job],
            )
            .unwrap();
        if let Some(row) = row {
            break (row.get::<_, String>(0), row.get::<_, String>(1));
        }
        assert!(
            Instant::now() < deadline,
            "pg_cron did not run the job in 75 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    cron.execute("SELECT cron.unschedule($1::bigint)", &[&job])
        .unwrap();
    assert_eq!(outcome.0, "succeeded", "{outcome:?}");
    assert_eq!(ids(&mut app), ["busy"]);
}

#[test]
fn paging_stays_exact_while_a_sweep_deletes_idle_executions() {
    let db = "loom_it_retention_paging";
    let cluster = Cluster::Icu;
    let mut owner = cluster.fresh_database(db);
    // 300 executions of 5 events; every third idle for 40 days.
    owner
        .batch_execute(
            "SELECT loom_append_events(array_agg(format('exec-%s', lpad(i::text, 3, '0'))),
                                       array_agg(s::bigint), array_agg('step'::text), array_agg('{}'::jsonb))
             FROM generate_series(1, 300) i, generate_series(1, 5) s;
             UPDATE loom.events SET created_at = now() - interval '40 days'
             WHERE substr(execution_id, 6)::int % 3 = 0;",
        )
        .unwrap();
    let kept: Vec<String> = (1..=300)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("exec-{i:03}"))
        .collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pager = {
        let done = std::sync::Arc::clone(&done);
        let kept = kept.clone();
        let mut client = cluster.connect(db);
        std::thread::spawn(move || {
            let mut passes = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) || passes == 0 {
                // One full pass, 7 ids a page.
                let (mut seen, mut after) = (Vec::<String>::new(), None::<String>);
                loop {
                    let page: Vec<String> = client
                        .query("SELECT * FROM loom_list_executions($1, 7)", &[&after])
                        .unwrap()
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    seen.extend(page.iter().cloned());
                    if page.len() < 7 {
                        break;
                    }
                    after = page.last().cloned();
                }
                assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order, once each");
                let missing: Vec<_> = kept
                    .iter()
                    .filter(|id| seen.binary_search(id).is_err())
                    .collect();
                assert!(missing.is_empty(), "pass {passes} lost {missing:?}");
                passes += 1;
            }
            passes
        })
    };
    // Small batches, each its own transaction, so the pager runs between.
    let mut after: Option<String> = None;
    let mut batches = 0;
    loop {
        let row = owner
            .query_one(
                "SELECT next_after, done FROM loom_delete_idle_executions('30 days', $1, 4)",
                &[&after],
            )
            .unwrap();
        batches += 1;
        if row.get::<_, bool>(1) {
            break;
        }
        after = row.get(0);
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let passes = pager.join().unwrap();
    assert!(batches > 50, "{batches} batches");
    assert!(passes >= 1);
    assert_eq!(ids(&mut owner), kept);
}

/// Issue 25: an append, a snapshot or a ref in flight while a batch looks
/// at an idle execution.
/// `wf-N` has events 1 to 3, a snapshot at 3 and a ref, all 40 days old; a
/// writer appends event 4 to some of them in transactions it holds open
/// while the sweep runs. Every execution ends whole: with its history, its
/// snapshot, its ref and the new event, or gone altogether, never with
/// part of its history gone (before, an append in flight kept `[4]` alone,
/// and the ref pointed at a sequence that no longer existed).
#[test]
fn an_append_in_flight_keeps_its_execution_whole() {
    let db = "loom_it_retention_race";
    let cluster = Cluster::C;
    let mut owner = cluster.fresh_database(db);
    let ids: Vec<String> = (0..12).map(|i| format!("wf-{i:02}")).collect();
    for id in &ids {
        idle_log(&mut owner, &[id.as_str()], 3, 40);
        owner
            .execute(
                "SELECT loom_save_snapshot($1, 'agent', 3, '{\"turn\":3}'), loom_put_ref($1 || '/main', $1, 3)",
                &[id],
            )
            .unwrap();
    }
    owner
        .batch_execute("UPDATE loom.snapshots SET created_at = now() - interval '40 days'")
        .unwrap();
    // Every third execution gets event 4, the next a snapshot, the next a
    // ref, each from a transaction held open for 300 ms, begun before the
    // sweep starts. A snapshot or ref is no activity (the execution stays
    // idle), but the sweep must see it and delete it with the rest, not
    // leave a snapshot or ref of an execution that is gone.
    let appended: Vec<String> = ids.iter().step_by(3).cloned().collect();
    let written: Vec<(String, &str)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let sql = match i % 3 {
                0 => "SELECT loom_append_event($1, 4, 'resumed', '{}')",
                1 => "SELECT loom_save_snapshot($1, 'agent', 2, '{\"turn\":2}')",
                _ => "SELECT loom_put_ref($1 || '/side', $1, 2)",
            };
            (id.clone(), sql)
        })
        .collect();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(written.len() + 1));
    let writers: Vec<_> = written
        .into_iter()
        .map(|(id, sql)| {
            let barrier = std::sync::Arc::clone(&barrier);
            let mut writer = cluster.connect(db);
            std::thread::spawn(move || {
                let mut tx = writer.transaction().unwrap();
                tx.execute(sql, &[&id]).unwrap();
                barrier.wait();
                std::thread::sleep(Duration::from_millis(300));
                tx.commit().unwrap();
            })
        })
        .collect();
    barrier.wait();
    // Small batches (two executions' rows each), each its own transaction.
    let mut after: Option<String> = None;
    loop {
        let row = owner
            .query_one(
                "SELECT next_after, done FROM loom_delete_idle_executions('30 days', $1, 10)",
                &[&after],
            )
            .unwrap();
        if row.get::<_, bool>(1) {
            break;
        }
        after = row.get(0);
    }
    for writer in writers {
        writer.join().unwrap();
    }
    for id in &ids {
        let events: Vec<i64> = owner
            .query(
                "SELECT sequence FROM loom_read_events($1, NULL, 100)",
                &[id],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let snapshot: Option<i64> = owner
            .query_opt("SELECT sequence FROM loom_load_snapshot($1)", &[id])
            .unwrap()
            .map(|r| r.get(0));
        let reference: Option<i64> = owner
            .query_opt(
                "SELECT sequence FROM loom.refs WHERE name = $1 || '/main'",
                &[id],
            )
            .unwrap()
            .map(|r| r.get(0));
        let (snapshots, refs): (i64, i64) = {
            let row = owner
                .query_one(
                    "SELECT (SELECT count(*) FROM loom.snapshots WHERE execution_id = $1),
                            (SELECT count(*) FROM loom.refs WHERE execution_id = $1)",
                    &[id],
                )
                .unwrap();
            (row.get(0), row.get(1))
        };
        if appended.contains(id) {
            assert_eq!(
                (events, snapshot, reference),
                (vec![1, 2, 3, 4], Some(3), Some(3)),
                "{id}: written to during the sweep, it resumes whole"
            );
        } else {
            assert_eq!(
                (events, snapshot, reference, snapshots, refs),
                (vec![], None, None, 0, 0),
                "{id}: idle, gone whole, what was written meanwhile too"
            );
        }
    }
}

/// Second review of issue 25: a prune read the latest snapshot unlocked,
/// so while a delete of that snapshot was in flight it pruned to it, and
/// once both committed the execution had neither the snapshot nor the
/// events before it (resume lost events 1 to 7). The prune now locks the
/// snapshot it prunes to: it waits for the delete and then prunes nothing.
#[test]
fn a_prune_waits_for_a_delete_of_its_snapshot_and_loses_nothing() {
    let db = "loom_it_retention_prune_race";
    let cluster = Cluster::C;
    let mut owner = cluster.fresh_database(db);
    owner
        .batch_execute(
            "SELECT loom_append_event('wf-p', s, 'step', '{}') FROM generate_series(1, 10) s;
             SELECT loom_save_snapshot('wf-p', 'agent', 8, '{\"turn\":8}');",
        )
        .unwrap();
    let (deleting, deleted) = std::sync::mpsc::channel();
    let mut deleter = cluster.connect(db);
    let delete = std::thread::spawn(move || {
        let mut tx = deleter.transaction().unwrap();
        tx.execute("SELECT loom_delete_snapshots('wf-p')", &[])
            .unwrap();
        deleting.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(400));
        tx.commit().unwrap();
    });
    deleted.recv().unwrap();
    let pruned: i64 = owner
        .query_one("SELECT loom_prune_events('wf-p')", &[])
        .unwrap()
        .get(0);
    delete.join().unwrap();
    let events: i64 = owner
        .query_one(
            "SELECT count(*) FROM loom.events WHERE execution_id = 'wf-p'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!((pruned, events), (0, 10), "no snapshot left to prune to");
}

/// Review of issue 26: an append took its execution's stripe only in the
/// trigger, after its INSERT, so a retention batch that started while the
/// INSERT was still running saw the execution idle and deleted its earlier
/// events under it: once both committed, `x` held only the new event. The
/// append now holds the stripe before it inserts, so the batch waits for
/// it and then sees the execution written to. (A BEFORE trigger that
/// sleeps stands for a long INSERT.)
#[test]
fn a_batch_that_starts_while_an_append_is_inserting_waits_for_it() {
    let db = "loom_it_retention_inserting";
    let cluster = Cluster::C;
    let mut owner = cluster.fresh_database(db);
    idle_log(&mut owner, &["x"], 2, 40);
    owner
        .batch_execute(
            "CREATE FUNCTION public.slow_insert() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END $$;
             CREATE TRIGGER slow_insert BEFORE INSERT ON loom.events
                 FOR EACH ROW WHEN (NEW.sequence = 3) EXECUTE FUNCTION public.slow_insert();",
        )
        .unwrap();
    let mut writer = cluster.connect(db);
    let appending = std::thread::spawn(move || {
        writer
            .execute("SELECT loom_append_event('x', 3, 'resumed', '{}')", &[])
            .unwrap();
    });
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let deleted: i64 = owner
        .query_one(
            "SELECT executions_deleted FROM loom_delete_idle_executions('30 days')",
            &[],
        )
        .unwrap()
        .get(0);
    let waited = started.elapsed();
    appending.join().unwrap();
    let events: Vec<i64> = owner
        .query("SELECT sequence FROM loom_read_events('x')", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        (deleted, events),
        (0, vec![1, 2, 3]),
        "the batch waited {waited:?} for the append"
    );
    assert_eq!(ids(&mut owner), ["x"]);
}

/// Second review of issue 26: appends take their execution's stripe
/// (shared) before they insert; a delete took it (exclusively) only in its
/// trigger, after its rows. An append of a key a delete in flight had just
/// deleted waited for that delete with the stripe held, and the delete's
/// trigger waited for the stripe: deadlock. loom's deletes now take the
/// stripe before their rows, so the append waits for the delete, then
/// lands.
#[test]
fn an_append_of_a_key_a_delete_in_flight_removed_waits_and_lands() {
    let db = "loom_it_retention_reappend";
    let cluster = Cluster::C;
    let mut owner = cluster.fresh_database(db);
    owner
        .batch_execute(
            "DROP ROLE IF EXISTS loom_reappend_writer; CREATE ROLE loom_reappend_writer LOGIN;
             SELECT loom_grant_access('loom_reappend_writer', 'writer');
             SELECT loom_append_events(ARRAY['y', 'y', 'y'], ARRAY[1, 2, 3]::bigint[],
                                       array_fill('step'::text, ARRAY[3]), array_fill('{}'::jsonb, ARRAY[3]));",
        )
        .unwrap();
    // A reader's row lock on event 3 holds the delete in the middle of its
    // rows, the window in which the append arrives.
    let mut holder = cluster.connect(db);
    let mut hold = holder.transaction().unwrap();
    hold.execute(
        "SELECT 1 FROM loom.events WHERE execution_id = 'y' AND sequence = 3 FOR UPDATE",
        &[],
    )
    .unwrap();
    let deleting = {
        let mut deleter = cluster.connect_as(db, "loom_reappend_writer");
        std::thread::spawn(move || {
            deleter
                .query_one("SELECT loom_delete_events('y')", &[])
                .map(|r| r.get::<_, i64>(0))
                .map_err(|e| describe(&e))
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let appending = {
        let mut appender = cluster.connect_as(db, "loom_reappend_writer");
        std::thread::spawn(move || {
            appender
                .execute("SELECT loom_append_event('y', 1, 'restarted', '{}')", &[])
                .map_err(|e| describe(&e))
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    hold.commit().unwrap();
    assert_eq!(deleting.join().unwrap(), Ok(3));
    assert_eq!(appending.join().unwrap(), Ok(1));
    let events: Vec<String> = owner
        .query(
            "SELECT sequence || ':' || kind FROM loom_read_events('y')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(events, ["1:restarted"]);
    assert_eq!(ids(&mut owner), ["y"]);
}

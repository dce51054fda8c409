//! loom on Citus (issue 10), against the Makefile's coordinator and two
//! workers: the client's conformance kits through the coordinator; ADR
//! 0108's ids and 3,000 adversarial ones paged in code point order at page
//! sizes 1, 7 and 1000; a worker stopped mid-pass; loom_distribute moving
//! an existing deployment, idempotent; an upgrade on a Citus cluster; and
//! appends racing deletes on the same executions.
//!
//! Each test is `#[ignore]`d: they need Citus, which users install from
//! the Citus project's packages. `make test` runs them (`--ignored`) where
//! a supported Citus is installed or `LOOM_PG_CITUS` names a running
//! cluster, and says SKIPPED otherwise; `make test.citus` runs them alone.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use futures::StreamExt;
use loom_harness::citus::{
    citus_is_external, distribute, fresh_citus_database, fresh_distributed_database, require_citus,
};
use loom_harness::pg_pool;
use loom_harness::{adversarial_id, describe, runtime, Cluster, LOOM_VERSION};
use pgloom::branch_registry::PgBranchRegistry;
use pgloom::conformance::{
    check_branch_registry, check_event_store, check_resume_and_retention, check_snapshot_store,
    Fidelity, CONFORMANCE_IDS,
};
use pgloom::event_store::{iterate_execution_ids, Event, EventStore, PgEventStore, StoreConfig};
use pgloom::snapshot_store::{Codec, Decode, PgSnapshotStore, PgSnapshotStoreOptions};
use pgloom::Error;
use pgloom::PgPoolOptions;
use postgres::Client;

/// One test at a time: one stops a worker the others use.
static SERIAL: Mutex<()> = Mutex::new(());

/// [`SERIAL`], with every Citus node up. These tests are `#[ignore]`d in a
/// plain run and run by `make test` only where Citus is; run without one
/// they fail, saying why, rather than pass having checked nothing.
fn serial() -> MutexGuard<'static, ()> {
    require_citus();
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    for node in [Cluster::Citus].into_iter().chain(Cluster::CITUS_WORKERS) {
        let up = if citus_is_external() {
            node.wait_until_accepting(Duration::from_secs(30))
                .map(|_| ())
        } else {
            node.ensure_running()
        };
        up.unwrap_or_else(|e| panic!("the {node} cluster is not up: {e}"));
    }
    guard
}

fn citus_store(db: &str) -> PgEventStore {
    PgEventStore::connect_citus(&Cluster::Citus.database(db), &PgPoolOptions::new()).unwrap()
}

fn snapshot_store(
    rt: &tokio::runtime::Runtime,
    pool: pgloom::PgPool,
    codec: Codec,
    decode: Decode,
) -> PgSnapshotStore {
    let mut options = PgSnapshotStoreOptions::new();
    options.codec(codec).decode(decode);
    rt.block_on(PgSnapshotStore::start(pool, &options)).unwrap()
}

fn every_id(store: &PgEventStore, page: usize) -> Result<Vec<String>, Error> {
    runtime().block_on(async {
        let mut ids = Vec::new();
        let mut stream = std::pin::pin!(iterate_execution_ids(store, page));
        while let Some(id) = stream.next().await {
            ids.push(id?);
        }
        Ok(ids)
    })
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn the_conformance_kits_pass_through_the_coordinator() {
    let _serial = serial();
    let rt = runtime();
    let _ = fresh_distributed_database("loom_citus_kit", 4);
    let store = citus_store("loom_citus_kit");
    rt.block_on(check_event_store(&store))
        .unwrap_or_else(|f| panic!("event store on Citus: {f}"));
    let registry = PgBranchRegistry::new(store.pool().clone());
    rt.block_on(check_branch_registry(&registry))
        .unwrap_or_else(|f| panic!("branch registry on Citus: {f}"));

    for (codec, decode, fidelity) in [
        (Codec::None, Decode::Client, Fidelity::Jsonb),
        (Codec::Zstd, Decode::Client, Fidelity::Exact),
        // The frame decoded by loom_snapshot_state_text on the workers.
        (Codec::Zstd, Decode::Server, Fidelity::Exact),
    ] {
        let db = format!("loom_citus_snap_{codec}_{decode:?}").to_lowercase();
        let _ = fresh_distributed_database(&db, 4);
        let pool = pg_pool(&Cluster::Citus.database(&db), 2).unwrap();
        let snapshots = snapshot_store(&rt, pool, codec, decode);
        rt.block_on(check_snapshot_store(&snapshots, codec, fidelity))
            .unwrap_or_else(|f| panic!("snapshot store on Citus, {codec} {decode:?}: {f}"));
    }
    for codec in [Codec::None, Codec::Zstd] {
        let db = format!("loom_citus_resume_{codec}");
        let _ = fresh_distributed_database(&db, 4);
        let pool = pg_pool(&Cluster::Citus.database(&db), 4).unwrap();
        let snapshots = snapshot_store(&rt, pool.clone(), codec, Decode::Client);
        rt.block_on(check_resume_and_retention(
            &PgEventStore::new_citus(pool),
            &snapshots,
        ))
        .unwrap_or_else(|f| panic!("resume and retention on Citus, {codec}: {f}"));
    }
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn adversarial_ids_page_in_code_point_order_at_every_page_size() {
    let _serial = serial();
    let db = "loom_citus_ids";
    let mut sql = fresh_distributed_database(db, 8);
    let mut ids: Vec<String> = CONFORMANCE_IDS.iter().map(|s| (*s).to_owned()).collect();
    ids.extend((0..3_000).map(adversarial_id));
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "the generator repeats an id");
    // Through the configuration a service would use.
    let store = StoreConfig::Citus(Cluster::Citus.database(db))
        .open()
        .unwrap();
    let rt = runtime();
    for chunk in ids.chunks(500) {
        let batch: Vec<Event> = chunk
            .iter()
            .flat_map(|id| {
                (1..=2).map(move |n| Event::new(id, n, "step", serde_json::json!({ "n": n })))
            })
            .collect();
        rt.block_on(store.append(&batch)).unwrap();
    }
    let mut expected = ids.clone();
    expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    let pg = citus_store(db);
    for page in [1, 7, 1000] {
        let seen = every_id(&pg, page).unwrap();
        let seen_set: HashSet<&String> = seen.iter().collect();
        let missing = expected.iter().filter(|id| !seen_set.contains(id)).count();
        let duplicated = seen.len() - seen_set.len();
        println!(
            "citus, page size {page}: {} ids, {missing} missing, {duplicated} duplicated",
            seen.len()
        );
        assert_eq!((missing, duplicated), (0, 0), "page size {page}");
        assert_eq!(seen, expected, "page size {page}: code point order");
    }
    // The page is pushed to every shard: each returns its own first ids,
    // the coordinator merges them (at this size a shard sorts a few hundred
    // rows; the bench shows the index-only scan at 1M).
    let plan: Vec<String> = sql
        .query(
            "EXPLAIN (VERBOSE, COSTS OFF) SELECT x.execution_id FROM loom.executions x
             WHERE x.execution_id > 'a' COLLATE \"C\" ORDER BY x.execution_id LIMIT 1000",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    println!("the pushed-down page:\n{plan}");
    assert!(plan.contains("Task Count: 8"), "{plan}");
    assert!(
        plan.contains("ORDER BY execution_id LIMIT '1000'::bigint"),
        "{plan}"
    );
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn a_worker_stopped_mid_pass_fails_the_pass_loudly() {
    // It stops a worker by its data directory: the Makefile skips it (and
    // says so) on a caller's cluster.
    assert!(
        !citus_is_external(),
        "this test stops a worker: it needs the Makefile's own Citus clusters, not LOOM_PG_CITUS's"
    );
    let _serial = serial();
    let db = "loom_citus_fault";
    let _ = fresh_distributed_database(db, 8);
    let store = citus_store(db);
    let rt = runtime();
    let ids: Vec<String> = (0..6_000).map(adversarial_id).collect();
    for chunk in ids.chunks(1000) {
        let batch: Vec<Event> = chunk
            .iter()
            .map(|id| Event::new(id, 1, "step", serde_json::json!({})))
            .collect();
        rt.block_on(store.append(&batch)).unwrap();
    }
    let victim = Cluster::CitusWorker(1);
    let (seen, error, guard) = rt.block_on(async {
        let mut stream = std::pin::pin!(iterate_execution_ids(&store, 500));
        let mut seen = 0usize;
        let mut guard = None;
        loop {
            match stream.next().await {
                Some(Ok(_)) => {
                    seen += 1;
                    if seen == 1_250 {
                        guard = Some(victim.stop_immediately().unwrap_or_else(|e| panic!("{e}")));
                    }
                }
                Some(Err(e)) => break (seen, Some(e), guard),
                None => break (seen, None, guard),
            }
        }
    });
    let guard = guard.expect("the worker was stopped mid-pass");
    let error = error.unwrap_or_else(|| {
        panic!("the pass ended as if complete after {seen} of 6000 ids with a worker down")
    });
    println!("worker stopped after 1,250 ids: the pass failed after {seen} with: {error}");
    assert!(seen < ids.len(), "{seen}");
    assert!(matches!(error, Error::Postgres(_)), "{error:?}");
    guard.restart().unwrap_or_else(|e| panic!("{e}"));
    // Citus reconnects on the next statement; a rerun is exact.
    let all = every_id(&store, 500).unwrap();
    let mut expected = ids.clone();
    expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    assert_eq!(all, expected);
}

/// One batch: loom dropped, installed again at `version` as that release
/// installed it ([`loom_harness::create_extension_at`]), then `then`.
fn reinstalled_at(version: &str, then: &str) -> String {
    format!(
        "DROP EXTENSION loom; {};\n{then}",
        loom_harness::create_extension_at(version)
    )
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn distribute_moves_an_existing_deployment_once_and_keeps_every_row() {
    let _serial = serial();
    // loom 0.4.0 on the coordinator, with rows, then the documented upgrade
    // (Citus runs it on the workers too), then distribution.
    let db = "loom_citus_upgrade";
    let mut sql = fresh_citus_database(db);
    sql.batch_execute(&reinstalled_at(
        "0.4.0",
        r#"SELECT loom_append_events(ARRAY['b', 'a', 'b'], ARRAY[1, 1, 2]::bigint[],
                                     ARRAY['s', 's', 's'], ARRAY['{}', '{}', '{}']::jsonb[]);
           SELECT loom_save_snapshot('a', 'wf', 1, '{"framed":true}', 'zstd');
           SELECT loom_save_snapshot('b', 'wf', 1, '{"plain":true}');
           SELECT loom_put_ref('main', 'b', 2);
           INSERT INTO loom.lineage VALUES ('b', 'a', 1);
           SET statement_timeout = 0;
           ALTER EXTENSION loom UPDATE;"#,
    ))
    .unwrap_or_else(|e| panic!("{}", describe(&e)));
    for node in Cluster::CITUS_WORKERS {
        let version: String = node
            .connect(db)
            .query_one(
                "SELECT extversion FROM pg_extension WHERE extname = 'loom'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(version, LOOM_VERSION, "{node}");
    }
    // Under a statement_timeout it does nothing, and says so.
    sql.batch_execute("SET statement_timeout = '10s'").unwrap();
    let skipped: Vec<String> = sql
        .query("SELECT outcome FROM loom_distribute(4)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(skipped, ["skipped: statement_timeout"; 5]);
    distribute(&mut sql, 4);
    let again: Vec<String> = sql
        .query("SELECT outcome FROM loom_distribute(4)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        again,
        [
            "already distributed",
            "already distributed",
            "already distributed",
            "already distributed",
            "already reference"
        ]
    );
    let one = |sql: &mut Client, query: &str| -> String {
        sql.query_one(query, &[])
            .unwrap_or_else(|e| panic!("{query}: {}", describe(&e)))
            .get(0)
    };
    assert_eq!(
        one(
            &mut sql,
            "SELECT string_agg(x, ',' ORDER BY x) FROM loom_list_executions() x"
        ),
        "a,b"
    );
    assert_eq!(
        one(
            &mut sql,
            "SELECT (state->>'framed') FROM loom_load_snapshot('a')"
        ),
        "true"
    );
    assert_eq!(
        one(
            &mut sql,
            "SELECT (state->>'plain') FROM loom_load_snapshot('b')"
        ),
        "true"
    );
    assert_eq!(
        one(
            &mut sql,
            "SELECT string_agg(x, ',') FROM loom_list_refs() x"
        ),
        "main"
    );
    assert_eq!(
        one(
            &mut sql,
            "SELECT parent_execution_id FROM loom.lineage WHERE execution_id = 'b'"
        ),
        "a"
    );
    assert_eq!(one(&mut sql, "SELECT loom_rebuild_executions()::text"), "0");
    // A frame is decoded where it is stored: the workers run the decode,
    // the coordinator only gathers.
    let plan: Vec<String> = sql
        .query(
            "EXPLAIN (VERBOSE, COSTS OFF) SELECT d.state->'framed' FROM loom.snapshots_decoded d",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let task = plan
        .iter()
        .find(|line| line.trim_start().starts_with("Query:"))
        .unwrap_or_else(|| panic!("no task query in {plan:?}"));
    assert!(task.contains("loom_snapshot_row_state"), "{plan:?}");
    // Nothing left behind on the coordinator's own copy of the tables.
    assert_eq!(
        one(
            &mut sql,
            "SELECT sum(pg_relation_size(('loom.' || t)::regclass))::text
             FROM unnest(ARRAY['events', 'executions', 'snapshots', 'lineage']) t"
        ),
        "0"
    );
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn appends_racing_deletes_on_the_same_executions_keep_the_index_exact() {
    let _serial = serial();
    // Without triggers, loom's functions keep loom.executions: an append
    // locks its execution's row, a delete locks it before it looks. 16
    // connections, appends and whole-log deletes on 40 shared executions.
    let db = "loom_citus_race";
    let _ = fresh_distributed_database(db, 4);
    let conninfo = Cluster::Citus.database(db);
    let failures = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..16i64)
        .map(|w| {
            let conninfo = conninfo.clone();
            let failures = Arc::clone(&failures);
            thread::spawn(move || {
                let mut client = Client::connect(&conninfo, postgres::NoTls).unwrap();
                for round in 0..60i64 {
                    let id = format!("race-{}", (w * 7 + round) % 40);
                    let result = if (w + round) % 5 == 0 {
                        client
                            .query_one("SELECT loom_delete_events($1)", &[&id])
                            .map(|_| ())
                    } else {
                        client
                            .execute(
                                "SELECT loom_append_event($1, $2, 'step', '{}')",
                                &[&id, &(w * 1_000 + round)],
                            )
                            .map(|_| ())
                    };
                    if let Err(e) = result {
                        failures.lock().unwrap().push(describe(&e));
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    assert!(
        failures.lock().unwrap().is_empty(),
        "{:?}",
        failures.lock().unwrap()
    );
    let mut sql = Cluster::Citus.connect(db);
    let listed: i64 = sql
        .query_one("SELECT count(*) FROM loom_list_executions(NULL, 1000)", &[])
        .unwrap()
        .get(0);
    let holding: i64 = sql
        .query_one("SELECT count(DISTINCT execution_id) FROM loom.events", &[])
        .unwrap()
        .get(0);
    println!("after the race: {listed} executions listed, {holding} hold events");
    assert_eq!(listed, holding);
    let repaired: i64 = sql
        .query_one("SELECT loom_rebuild_executions()", &[])
        .unwrap()
        .get(0);
    assert_eq!(repaired, 0, "loom.executions had drifted from loom.events");
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn a_citus_store_refuses_a_database_that_is_not_distributed() {
    let _serial = serial();
    let db = "loom_citus_local";
    let _ = fresh_citus_database(db);
    let store = citus_store(db);
    let rt = runtime();
    assert!(matches!(
        rt.block_on(store.list_executions_page(None, 10)),
        Err(Error::NotDistributed)
    ));
    // A one-node database is refused the same way.
    let _ = Cluster::Icu.fresh_database(db);
    let one_node =
        PgEventStore::connect_citus(&Cluster::Icu.database(db), &PgPoolOptions::new()).unwrap();
    assert!(matches!(
        rt.block_on(one_node.append(&[Event::new("x", 1, "step", serde_json::json!({}))])),
        Err(Error::NotDistributed)
    ));
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn distributing_a_deployment_without_frames_provisions_them() {
    let _serial = serial();
    // Upgraded from 0.2.0, which had no frame column, and never opted in:
    // Citus cannot set a distributed column's storage, so loom_distribute
    // adds the column first.
    let db = "loom_citus_late_frames";
    let mut sql = fresh_citus_database(db);
    sql.batch_execute(
        r#"DROP EXTENSION loom;
           CREATE EXTENSION loom VERSION '0.2.0';
           SET statement_timeout = 0;
           ALTER EXTENSION loom UPDATE;
           SELECT loom_save_snapshot('a', 'wf', 1, '{"plain":true}');"#,
    )
    .unwrap_or_else(|e| panic!("{}", describe(&e)));
    let has_column = |sql: &mut Client| -> bool {
        sql.query_one("SELECT has_column FROM loom_snapshot_frame_catalog()", &[])
            .unwrap()
            .get(0)
    };
    assert!(!has_column(&mut sql));
    distribute(&mut sql, 4);
    assert!(has_column(&mut sql));
    let ensured: bool = sql
        .query_one("SELECT loom_ensure_snapshot_zstd()", &[])
        .unwrap_or_else(|e| panic!("{}", describe(&e)))
        .get(0);
    assert!(ensured);
    let rt = runtime();
    let pool = pg_pool(&Cluster::Citus.database(db), 2).unwrap();
    let store = snapshot_store(&rt, pool, Codec::Zstd, Decode::Server);
    rt.block_on(check_snapshot_store(&store, Codec::Zstd, Fidelity::Exact))
        .unwrap_or_else(|f| panic!("frames after distributing: {f}"));
    let plain: String = sql
        .query_one("SELECT state->>'plain' FROM loom_load_snapshot('a')", &[])
        .unwrap()
        .get(0);
    assert_eq!(plain, "true");
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn an_open_write_makes_distribute_fail_soft_and_a_retry_lands_it() {
    let _serial = serial();
    let db = "loom_citus_soft";
    let _ = fresh_citus_database(db);
    // A writer mid-transaction on the coordinator's loom.events.
    let mut writer = Cluster::Citus.connect(db);
    writer
        .batch_execute("BEGIN; SELECT loom_append_event('held', 1, 'step', '{}')")
        .unwrap();
    let (mut sql, warnings) = Cluster::Citus.connect_collecting_warnings(db);
    sql.batch_execute("SET statement_timeout = 0").unwrap();
    let started = std::time::Instant::now();
    let outcomes: Vec<String> = sql
        .query("SELECT outcome FROM loom_distribute(4, 300)", &[])
        .unwrap_or_else(|e| panic!("{}", describe(&e)))
        .iter()
        .map(|r| r.get(0))
        .collect();
    let waited = started.elapsed();
    println!("loom_distribute beside an open write: {outcomes:?} after {waited:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| o.starts_with("skipped: ") && o.contains("55P03")),
        "{outcomes:?}"
    );
    assert!(waited < std::time::Duration::from_secs(5), "{waited:?}");
    assert!(
        warnings
            .lock()
            .unwrap()
            .iter()
            .any(|w| w.contains("could not distribute") && w.contains("55P03")),
        "{:?}",
        warnings.lock().unwrap()
    );
    let state: (bool, bool) = {
        let row = sql
            .query_one(
                "SELECT loom_is_distributed(), loom_executions_tracked_by_trigger()",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(state, (false, true), "nothing changed on the coordinator");
    writer.batch_execute("COMMIT").unwrap();
    distribute(&mut sql, 4);
    let listed: Vec<String> = sql
        .query("SELECT * FROM loom_list_executions()", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(listed, ["held"]);
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn status_verification_repair_and_the_sweep_run_through_the_coordinator() {
    let _serial = serial();
    // Issue 26: the operator paths, on a distributed database, from the
    // coordinator: status from catalogs, the index verified and repaired
    // in batches (a DISTINCT on the shards where one node walks the index),
    // and retention by age deleting whole executions.
    let db = "loom_citus_operations";
    let _ = fresh_distributed_database(db, 4);
    let mut sql = Cluster::Citus.connect(db);
    sql.batch_execute(
        "SELECT loom_append_event('op-' || i, s, 'step', '{}') FROM generate_series(1, 60) i, generate_series(1, 3) s;
         UPDATE loom.events SET created_at = now() - interval '40 days' WHERE execution_id LIKE 'op-1%';",
    )
    .unwrap();
    let items: i64 = sql
        .query_one("SELECT count(*) FROM loom_status()", &[])
        .unwrap()
        .get(0);
    assert!(items > 5);
    let walk = |sql: &mut Client, function: &str| -> (i64, i64, i64) {
        let (mut totals, mut after) = ((0, 0, 0), None::<String>);
        loop {
            let row = sql
                .query_one(&format!("SELECT * FROM {function}($1, 7)"), &[&after])
                .unwrap_or_else(|e| panic!("{function}: {}", describe(&e)));
            totals.0 += row.get::<_, i64>(0);
            totals.1 += row.get::<_, i64>(1);
            totals.2 += row.get::<_, i64>(2);
            if row.get::<_, bool>(4) {
                return totals;
            }
            after = row.get(3);
        }
    };
    assert_eq!(walk(&mut sql, "loom_verify_executions"), (60, 0, 0));
    sql.batch_execute(
        "DELETE FROM loom.executions WHERE execution_id IN ('op-2', 'op-30');
         INSERT INTO loom.executions VALUES ('op-ghost');",
    )
    .unwrap();
    assert_eq!(walk(&mut sql, "loom_verify_executions"), (61, 2, 1));
    assert_eq!(walk(&mut sql, "loom_repair_executions"), (61, 2, 1));
    assert_eq!(walk(&mut sql, "loom_verify_executions"), (60, 0, 0));
    // op-1 and op-10..op-19 are idle: 11 executions, 33 events.
    let mut after: Option<String> = None;
    let mut deleted = 0;
    loop {
        let row = sql
            .query_one(
                "SELECT executions_deleted, next_after, done FROM loom_delete_idle_executions('30 days', $1, 10)",
                &[&after],
            )
            .unwrap_or_else(|e| panic!("sweep: {}", describe(&e)));
        deleted += row.get::<_, i64>(0);
        if row.get::<_, bool>(2) {
            break;
        }
        after = row.get(1);
    }
    assert_eq!(deleted, 11);
    let left: i64 = sql
        .query_one("SELECT count(*) FROM loom.events", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 49 * 3);
    assert_eq!(walk(&mut sql, "loom_verify_executions"), (49, 0, 0));
}

/// A deployment distributed at 0.10.0 gets events' metadata from the
/// coordinator's migrate(): the update leaves the column to it (Citus runs
/// the update on every node), and its `loom_ensure_event_metadata`, a
/// statement of its own, reaches every shard; then metadata goes through
/// the coordinator and back.
#[test]
#[ignore = "needs Citus: make test.citus"]
fn a_distributed_deployment_gets_metadata_from_the_coordinators_migrate() {
    use pgloom::migrate::{migrate, MigrateOptions};
    let _serial = serial();
    let db = "loom_citus_metadata";
    let mut sql = fresh_citus_database(db);
    sql.batch_execute(&reinstalled_at(
        "0.10.0",
        r#"SELECT loom_append_events(ARRAY['a', 'b'], ARRAY[1, 1]::bigint[],
                                     ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[]);"#,
    ))
    .unwrap_or_else(|e| panic!("{}", describe(&e)));
    distribute(&mut sql, 4);
    let rt = runtime();
    let migration = rt
        .block_on(migrate(
            &Cluster::Citus.database(db),
            &MigrateOptions::new(),
        ))
        .unwrap();
    assert_eq!(migration.to_version, LOOM_VERSION);
    assert!(
        matches!(
            migration
                .event_metadata
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("added" | "present")
        ),
        "{migration:?}"
    );
    let store = citus_store(db);
    let traced = Event::new("a", 2, "s", serde_json::json!({}))
        .with_metadata(serde_json::json!({"trace_id": "t"}));
    let batch = [
        Event::new("b", 2, "s", serde_json::json!({}))
            .with_metadata(serde_json::json!({"trace_id": "u"})),
        Event::new("b", 3, "s", serde_json::json!({})),
    ];
    rt.block_on(store.append(std::slice::from_ref(&traced)))
        .unwrap();
    rt.block_on(store.append(&batch)).unwrap();
    assert_eq!(rt.block_on(store.read_events("a")).unwrap()[1], traced);
    assert_eq!(rt.block_on(store.read_events("b")).unwrap()[1..], batch);
}

/// Issue 39: a deployment distributed at 0.12.0, whose sweep failed
/// through the coordinator (`0A000`), updates to the current version with
/// `ALTER EXTENSION` on the coordinator, and then retention by age runs
/// there in every form a user has: the client's `execution_activity` and
/// `delete_idle_executions`, the SQL sweep procedure pg_cron calls, and
/// `loom_lock_idle_executions`, which keeps an execution whose last event
/// moved since the page was read.
#[test]
#[ignore = "needs Citus: make test.citus"]
fn retention_by_age_runs_through_the_coordinator_after_an_update_from_0_12_0() {
    let _serial = serial();
    let db = "loom_citus_retention";
    let mut sql = fresh_citus_database(db);
    sql.batch_execute(&reinstalled_at("0.12.0", ""))
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    distribute(&mut sql, 4);
    // 40 executions of 2 events; r-0.. r-19 idle for 40 days.
    sql.batch_execute(
        "SELECT loom_append_event('r-' || i, s::bigint, 'step'::text, '{}'::jsonb)
         FROM generate_series(0, 39) i, generate_series(1, 2) s;
         UPDATE loom.events SET created_at = now() - interval '40 days'
         WHERE execution_id ~ '^r-([0-9]|1[0-9])$';",
    )
    .unwrap();
    let before_update = sql
        .query(
            "SELECT * FROM loom_delete_idle_executions(interval '30 days', NULL::text, 10)",
            &[],
        )
        .expect_err("0.12.0's sweep through the coordinator is what this update fixes");
    assert_eq!(loom_harness::sqlstate(&before_update), "0A000");
    sql.batch_execute(&format!("ALTER EXTENSION loom UPDATE TO '{LOOM_VERSION}'"))
        .unwrap_or_else(|e| panic!("{}", describe(&e)));

    let rt = runtime();
    let store = citus_store(db);
    let activity = rt
        .block_on(store.execution_activity(Some("r-3"), 5))
        .unwrap_or_else(|e| panic!("execution_activity: {e}"));
    let ids: Vec<&str> = activity.iter().map(|a| a.execution_id.as_str()).collect();
    assert_eq!(ids, ["r-30", "r-31", "r-32", "r-33", "r-34"]);
    assert!(activity.iter().all(|a| a.last_sequence == 2));

    // The lock walk: r-0's last event moved after the page was read (an
    // append), r-1 is as read: only r-1 is taken.
    let mut tx = sql.transaction().unwrap();
    let last: (i64, std::time::SystemTime) = {
        let row = tx
            .query_one(
                "SELECT last_sequence, last_event_at FROM loom_execution_activity(NULL::text, 1)",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let held: Vec<(String, i64, bool)> = tx
        .query(
            "SELECT * FROM loom_lock_idle_executions(ARRAY['r-0', 'r-1']::text[], ARRAY[1, $1]::bigint[],
                                                      ARRAY[$2, $2]::timestamptz[], 100)",
            &[&last.0, &last.1],
        )
        .unwrap_or_else(|e| panic!("loom_lock_idle_executions: {}", describe(&e)))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(held, [("r-1".to_owned(), 2, true)]);
    // A NULL given is never "as it was", as on one node.
    let nulls = tx
        .query(
            "SELECT * FROM loom_lock_idle_executions(ARRAY['r-1', 'r-2']::text[], ARRAY[NULL, $1]::bigint[],
                                                      ARRAY[$2, NULL]::timestamptz[], 100)",
            &[&last.0, &last.1],
        )
        .unwrap_or_else(|e| panic!("loom_lock_idle_executions: {}", describe(&e)));
    assert!(nulls.is_empty(), "{} rows", nulls.len());
    tx.rollback().unwrap();

    // The client's batches, then the procedure for whatever is left.
    let (mut after, mut deleted) = (None::<String>, 0);
    loop {
        let batch = rt
            .block_on(store.delete_idle_executions(
                Duration::from_secs(30 * 86_400),
                after.as_deref(),
                7,
            ))
            .unwrap_or_else(|e| panic!("delete_idle_executions: {e}"));
        deleted += batch.executions_deleted;
        if batch.done || deleted >= 10 {
            break;
        }
        after = batch.next_after;
    }
    assert!(deleted >= 10, "{deleted}");
    sql.batch_execute("CALL loom_sweep_idle_executions(interval '30 days', 7)")
        .unwrap_or_else(|e| panic!("the sweep procedure: {}", describe(&e)));
    let left: Vec<String> = sql
        .query(
            "SELECT DISTINCT execution_id COLLATE \"C\" FROM loom.events ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let expected: Vec<String> = (20..40).map(|i| format!("r-{i}")).collect();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(left, expected_sorted);
    let listed: i64 = sql
        .query_one("SELECT count(*) FROM loom.executions", &[])
        .unwrap()
        .get(0);
    assert_eq!(listed, 20, "the executions index follows the sweep");
}

/// Issue 39: the client paths added since 0.8.0 that a distributed
/// deployment uses, through the coordinator: a watcher woken by notifying
/// appends (the NOTIFY is the coordinator session's, so a LISTEN there
/// hears it), an idempotent append's retry, and the per-execution deletes.
#[test]
#[ignore = "needs Citus: make test.citus"]
fn watch_idempotent_appends_and_deletes_run_through_the_coordinator() {
    use pgloom::event_store::{watch_events, PgNotifications, WatchOptions};
    let _serial = serial();
    let db = "loom_citus_client_paths";
    let _ = fresh_distributed_database(db, 4);
    let conninfo = Cluster::Citus.database(db);
    let rt = runtime();
    let store = citus_store(db).with_append_notifications(true);
    let event = |id: &str, n: i64| Event::new(id, n, "step", serde_json::json!({ "n": n }));
    rt.block_on(async {
        let notifications = PgNotifications::listen(&conninfo).await.unwrap();
        let mut options = WatchOptions::new();
        // No test waits a minute: only a notification wakes it in time.
        options
            .poll_interval(Duration::from_secs(60))
            .wake(notifications.wake());
        store.append(&[event("w-1", 1)]).await.unwrap();
        let mut watched = Box::pin(watch_events(&store, "w-1", None, &options));
        assert_eq!(watched.next().await.unwrap().unwrap().sequence, 1);
        for n in 2..=5 {
            store
                .append(&[event("w-1", n), event("w-2", n)])
                .await
                .unwrap();
            let next = tokio::time::timeout(Duration::from_secs(20), watched.next())
                .await
                .expect("woken by the coordinator's NOTIFY, not the minute's poll")
                .unwrap()
                .unwrap();
            assert_eq!(next.sequence, n);
        }

        // An idempotent retry of what is stored is a success; a different
        // event at a stored position is a duplicate.
        let turn = [event("i-1", 1), event("i-1", 2)];
        store.append_idempotent(&turn).await.unwrap();
        store.append_idempotent(&turn).await.unwrap();
        let other = [Event::new("i-1", 2, "other", serde_json::json!({}))];
        assert!(store
            .append_idempotent(&other)
            .await
            .unwrap_err()
            .is_duplicate());
        assert_eq!(store.read_events("i-1").await.unwrap(), turn);

        // Per-execution deletes, in batches smaller than the log.
        let log: Vec<Event> = (1..=9).map(|n| event("d-1", n)).collect();
        store.append(&log).await.unwrap();
        assert_eq!(store.delete_execution("d-1", 4).await.unwrap(), 9);
        assert!(store.read_events("d-1").await.unwrap().is_empty());
    });
    let ids = every_id(&store, 100).unwrap();
    assert!(!ids.contains(&"d-1".to_owned()), "{ids:?}");
    assert!(ids.contains(&"i-1".to_owned()), "{ids:?}");
}

/// Deltas on Citus: a delta and the keyframe it names share the execution
/// id, so the same shard; saved through the coordinator, each reads back
/// exactly through the view, loom_load_snapshot and the client's store,
/// decoded on the worker or in the client, and deleting in batches never
/// strands one.
#[test]
#[ignore = "needs Citus: make test.citus"]
fn deltas_are_saved_read_and_deleted_through_the_coordinator() {
    use pgloom::snapshot_store::{SnapshotQuery, SnapshotStore};
    let _serial = serial();
    let rt = runtime();
    let db = "loom_citus_deltas";
    let mut client = fresh_distributed_database(db, 4);
    let (states, _) = loom_harness::save_delta_run(&mut client, "d", 20);
    // The deltas among an execution's snapshots.
    let deltas_of = |client: &mut Client, id: &str| -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM loom.snapshots WHERE execution_id = $1
                   AND loom_snapshot_base_sequence(state_z) IS NOT NULL",
                &[&id],
            )
            .unwrap()
            .get(0)
    };
    let deltas = deltas_of(&mut client, "d");
    assert!(deltas >= 10, "{deltas} deltas of 20");
    for (i, state) in states.iter().enumerate() {
        let text: String = client
            .query_one(
                "SELECT state::text FROM loom.snapshots_decoded WHERE execution_id = 'd' AND sequence = $1",
                &[&(i as i64 + 1)],
            )
            .unwrap_or_else(|e| panic!("view at {}: {}", i + 1, describe(&e)))
            .get(0);
        let expected: String = client
            .query_one("SELECT $1::text::jsonb::text", &[state])
            .unwrap()
            .get(0);
        assert_eq!(text, expected, "through the view at {}", i + 1);
    }
    for decode in [Decode::Client, Decode::Server] {
        let pool = pg_pool(&Cluster::Citus.database(db), 2).unwrap();
        let store = snapshot_store(&rt, pool, Codec::Zstd, decode);
        let latest = rt
            .block_on(store.load("d", SnapshotQuery::Latest))
            .unwrap_or_else(|e| panic!("{decode:?}: {e}"))
            .unwrap();
        assert_eq!(latest.state.as_str(), states[19], "{decode:?}");
        let resumed = rt
            .block_on(store.resume("d"))
            .unwrap_or_else(|e| panic!("{decode:?} resume: {e}"));
        assert_eq!(
            resumed
                .snapshot
                .map(|s| s.state.as_str().to_owned())
                .as_deref(),
            Some(states[19].as_str())
        );
    }
    // The client's deltas: encoded in the client, each stored beside its
    // keyframe on the shard (loom_store_snapshot, loom_snapshot_keyframe).
    let pool = pg_pool(&Cluster::Citus.database(db), 2).unwrap();
    let writer = snapshot_store(&rt, pool, Codec::Delta, Decode::Client);
    for (i, state) in states.iter().enumerate() {
        let snapshot = pgloom::snapshot_store::NewSnapshot::new(
            "c",
            "wf",
            i as i64 + 1,
            pgloom::snapshot_store::JsonText::new(state.clone()).unwrap(),
        );
        rt.block_on(writer.save(&snapshot))
            .unwrap_or_else(|e| panic!("client delta at {}: {e}", i + 1));
    }
    for (i, state) in states.iter().enumerate() {
        let loaded = rt
            .block_on(writer.load("c", SnapshotQuery::At(i as i64 + 1)))
            .unwrap()
            .unwrap();
        assert_eq!(loaded.state.as_str(), state, "client delta at {}", i + 1);
    }
    let client_deltas = deltas_of(&mut client, "c");
    assert!(client_deltas >= 10, "{client_deltas} client deltas of 20");
    let mut left = 20i64;
    loop {
        let deleted: i64 = client
            .query_one("SELECT loom_delete_snapshots('d', 3)", &[])
            .unwrap_or_else(|e| panic!("delete: {}", describe(&e)))
            .get(0);
        if deleted == 0 {
            break;
        }
        left -= deleted;
        let readable: i64 = client
            .query_one(
                "SELECT count(*) FROM loom.snapshots_decoded WHERE execution_id = 'd' AND state IS NOT NULL",
                &[],
            )
            .unwrap_or_else(|e| panic!("after a batch: {}", describe(&e)))
            .get(0);
        assert_eq!(readable, left);
    }
    assert_eq!(left, 0);
}

#[test]
#[ignore = "needs Citus: make test.citus"]
fn the_feed_is_refused_on_citus_and_claims_fence_appends_through_the_coordinator() {
    let _serial = serial();
    // Distributed: the feed is refused, with its own SQLSTATE.
    let db = "loom_citus_runtime";
    let mut coordinator = fresh_distributed_database(db, 4);
    let refused = coordinator
        .batch_execute("SELECT loom_feed_enable()")
        .unwrap_err();
    assert_eq!(
        loom_harness::sqlstate(&refused),
        "0A000",
        "{}",
        describe(&refused)
    );
    // Claims live on the coordinator (loom.claims is not distributed) and
    // fence appends to the distributed log.
    let rt = runtime();
    let pool = pg_pool(&Cluster::Citus.database(db), 2).unwrap();
    let events = PgEventStore::new_citus(pool.clone());
    let claims = pgloom::claims::PgClaims::new(
        pool.clone(),
        pgloom::claims::ClaimOptions::new("q", "w").lease(Duration::from_secs(30)),
    );
    rt.block_on(async {
        claims.schedule("citus-run", None).await.unwrap();
        let claim = claims.claim(1).await.unwrap().pop().unwrap();
        let mut conn = pool.as_ref().get().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        claims.check_fence(&tx, &claim).await.unwrap();
        events
            .on(&tx)
            .append(&[Event::new("citus-run", 1, "step", serde_json::json!({}))])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        claims.complete(&claim, None).await.unwrap();
        // Claimed again: the old token is refused on Citus too, and its
        // append never lands.
        claims.schedule("citus-run", None).await.unwrap();
        let newer = claims.claim(1).await.unwrap().pop().unwrap();
        assert!(newer.fence > claim.fence);
        let tx = conn.transaction().await.unwrap();
        assert!(matches!(
            claims.check_fence(&tx, &claim).await,
            Err(Error::FencedOut { fence, .. }) if fence == claim.fence
        ));
        drop(tx);
        let log = events.read_events("citus-run").await.unwrap();
        assert_eq!(log.len(), 1);
    });
    // Before distribution, a feed that is on keeps loom_distribute off.
    let db = "loom_citus_feed_on";
    let mut local = fresh_citus_database(db);
    local.batch_execute("SELECT loom_feed_enable()").unwrap();
    let refused = local
        .batch_execute("SET statement_timeout = 0; SELECT * FROM loom_distribute(4)")
        .unwrap_err();
    assert_eq!(
        loom_harness::sqlstate(&refused),
        "0A000",
        "{}",
        describe(&refused)
    );
}

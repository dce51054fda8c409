//! loom's operations on the caller's connection and transaction (issue
//! 27): `PgEventStore::on`, `PgSnapshotStore::on` and
//! `PgBranchRegistry::on` pass the conformance kits on a plain
//! tokio-postgres connection, and inside a transaction they commit and
//! roll back with the caller's own writes, the executions index staying
//! exact either way.

use loom_harness::pg_pool;
use loom_harness::{runtime, Cluster};
use pgloom::branch_registry::{BranchRegistry, PgBranchRegistry};
use pgloom::conformance::{
    check_branch_registry, check_event_store, check_resume_and_retention, check_snapshot_store,
    Fidelity,
};
use pgloom::event_store::{Event, EventStore, PgEventStore};
use pgloom::interop::deadpool_postgres::tokio_postgres::{self, NoTls};
use pgloom::snapshot_store::{
    Codec, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};

/// A plain tokio-postgres connection to `db`, its driver spawned.
async fn connect(db: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&Cluster::Icu.database(db), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The three stores over a pool of `db`, a zstd snapshot store.
async fn stores(db: &str) -> (PgEventStore, PgSnapshotStore, PgBranchRegistry) {
    let pool = pg_pool(&Cluster::Icu.database(db), 2).unwrap();
    let mut options = PgSnapshotStoreOptions::new();
    options.codec(Codec::Zstd);
    (
        PgEventStore::new(pool.clone()),
        PgSnapshotStore::start(pool.clone(), &options)
            .await
            .unwrap(),
        PgBranchRegistry::new(pool),
    )
}

#[test]
fn the_kits_pass_on_a_callers_connection() {
    let rt = runtime();
    for kit in ["events", "snapshots", "refs", "resume"] {
        let db = format!("loom_it_caller_{kit}");
        let _ = Cluster::Icu.fresh_database(&db);
        rt.block_on(async {
            let (events, snapshots, refs) = stores(&db).await;
            let client = connect(&db).await;
            let outcome = match kit {
                "events" => check_event_store(&events.on(&client)).await,
                "snapshots" => {
                    check_snapshot_store(&snapshots.on(&client), Codec::Zstd, Fidelity::Exact).await
                }
                "refs" => check_branch_registry(&refs.on(&client)).await,
                _ => check_resume_and_retention(&events.on(&client), &snapshots.on(&client)).await,
            };
            outcome.unwrap_or_else(|f| panic!("{kit} on the caller's connection: {f}"));
        });
    }
}

/// Order `id` paid, in `tx`: the caller's row, two events, a snapshot and
/// a ref, all through the caller's transaction.
async fn write(
    tx: &tokio_postgres::Transaction<'_>,
    (events, snapshots, refs): (&PgEventStore, &PgSnapshotStore, &PgBranchRegistry),
    id: i64,
) {
    tx.execute("INSERT INTO orders VALUES ($1, 'paid')", &[&id])
        .await
        .unwrap();
    let run = format!("order-{id}");
    events
        .on(tx)
        .append(&[
            Event::new(run.clone(), 1, "paid", serde_json::json!({ "id": id })),
            Event::new(run.clone(), 2, "shipped", serde_json::json!({ "id": id })),
        ])
        .await
        .unwrap();
    let state = JsonText::new(r#"{"turns":2}"#.to_owned()).unwrap();
    snapshots
        .on(tx)
        .save(&NewSnapshot::new(run.clone(), "orders", 2, state))
        .await
        .unwrap();
    refs.on(tx)
        .put_ref(&format!("main-{id}"), &run, 2)
        .await
        .unwrap();
}

#[test]
fn operations_commit_and_roll_back_with_the_callers_transaction() {
    let rt = runtime();
    let db = "loom_it_caller_tx";
    let mut admin = Cluster::Icu.fresh_database(db);
    admin
        .batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, state text NOT NULL)")
        .unwrap();
    let orders = |admin: &mut postgres::Client| -> i64 {
        admin
            .query_one("SELECT count(*) FROM orders", &[])
            .unwrap()
            .get(0)
    };
    rt.block_on(async {
        let (events, snapshots, refs) = stores(db).await;
        // Rolled back: nothing of it anywhere, the index listing nothing.
        let mut client = connect(db).await;
        let tx = client.transaction().await.unwrap();
        write(&tx, (&events, &snapshots, &refs), 1).await;
        // The transaction's own reads see its writes.
        assert_eq!(
            events.on(&tx).read_events("order-1").await.unwrap().len(),
            2
        );
        tx.rollback().await.unwrap();
        assert!(events.read_events("order-1").await.unwrap().is_empty());
        assert!(snapshots.load_latest("order-1").await.unwrap().is_none());
        assert!(refs.get_ref("main-1").await.unwrap().is_none());
        assert!(events
            .list_executions_page(None, 10)
            .await
            .unwrap()
            .ids
            .is_empty());

        // Committed: all of it, with the caller's row.
        let tx = client.transaction().await.unwrap();
        write(&tx, (&events, &snapshots, &refs), 2).await;
        tx.commit().await.unwrap();
        let committed = events.read_events("order-2").await.unwrap();
        assert_eq!(committed.len(), 2);
        // Stamped by the server at the transaction's time, read back.
        assert!(
            committed.iter().all(|e| e.created_at.is_some()),
            "{committed:?}"
        );
        events
            .append(&[Event::new("order-2", 3, "shipped", serde_json::json!({}))])
            .await
            .unwrap();
        let resumed = snapshots.resume("order-2").await.unwrap();
        assert_eq!(resumed.events.len(), 1);
        assert!(resumed.events[0].created_at.is_some());
        assert_eq!(
            snapshots
                .load_latest("order-2")
                .await
                .unwrap()
                .unwrap()
                .state
                .as_str(),
            r#"{"turns":2}"#
        );
        assert_eq!(refs.get_ref("main-2").await.unwrap().unwrap().sequence, 2);
        assert_eq!(
            events.list_executions_page(None, 10).await.unwrap().ids,
            ["order-2"]
        );

        // On deadpool's transaction too; a duplicate aborts it, as any
        // failed statement does, and is a duplicate whatever it could name.
        let pool = events.pool().clone();
        let mut pooled = pool.as_ref().get().await.unwrap();
        let tx = pooled.transaction().await.unwrap();
        tx.execute("INSERT INTO orders VALUES (3, 'paid')", &[])
            .await
            .unwrap();
        let duplicate = events
            .on(&tx)
            .append(&[Event::new("order-2", 2, "again", serde_json::json!({}))])
            .await
            .unwrap_err();
        assert!(duplicate.is_duplicate(), "{duplicate:?}");
        assert!(!duplicate.is_transient());
        let aborted = tx.execute("SELECT 1", &[]).await.unwrap_err();
        assert_eq!(aborted.code().map(|c| c.code()), Some("25P02"));
        tx.rollback().await.unwrap();

        let check = events.verify_executions_index(1000, |_| {}).await.unwrap();
        assert!(check.in_step(), "{check:?}");
    });
    assert_eq!(orders(&mut admin), 1, "only the committed order");
}

/// A server error as loom carries it: one line with its SQLSTATE and
/// HINT, never its DETAIL (which can quote a row, a payload among its
/// values), and no source repeating it; a failed connection keeps its
/// cause as the source.
#[test]
fn a_server_error_says_itself_once_in_one_line_without_its_detail() {
    use std::error::Error as _;
    let rt = runtime();
    let db = "loom_it_caller_error";
    let _ = Cluster::Icu.fresh_database(db);
    rt.block_on(async {
        let client = connect(db).await;
        let raised = client
            .batch_execute(
                "DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = '22023',
                   DETAIL = 'Failing row contains (secret-payload)', HINT = 'run loom migrate'; END $$",
            )
            .await
            .unwrap_err();
        let e = pgloom::Error::from(raised);
        assert_eq!(e.to_string(), "ERROR 22023: boom (HINT: run loom migrate)");
        assert_eq!(e.sqlstate(), Some("22023"));
        assert!(e.source().is_none(), "{:?}", e.source());
        // Nor in Debug, which unwrap() and a log's ?e print.
        assert!(!format!("{e:?}").contains("secret-payload"), "{e:?}");
        let pgloom::Error::Postgres(pg) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(pg.detail(), Some("Failing row contains (secret-payload)"));
        assert_eq!(pg.hint(), Some("run loom migrate"));
        assert_eq!(pg.message(), Some("boom"));

        // Nothing listens on port 1: the cause is the refused connection.
        let refused = tokio_postgres::connect("host=127.0.0.1 port=1 user=x", NoTls)
            .await
            .err()
            .unwrap();
        let e = pgloom::Error::from(refused);
        let cause = e.source().expect("the I/O error behind it");
        assert!(!e.to_string().contains(&cause.to_string()), "{e} / {cause}");
    });
}

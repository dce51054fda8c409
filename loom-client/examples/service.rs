//! A service on PostgreSQL, start to finish: what a new user writes.
//!
//! ```sh
//! LOOM_DB="host=127.0.0.1 port=25432 user=postgres dbname=app" cargo run -p pgloom --example service
//! ```
//!
//! `LOOM_DB` is a libpq connection string or URL. The migration needs the
//! extension's owner (a superuser creates it; `ALTER EXTENSION ... UPDATE`
//! runs as its owner): a service whose own role is not would run
//! `migrate()` in a deploy step with the owner's conninfo, and give its
//! role access with `SELECT public.loom_grant_access('app'::regrole, 'writer'::text)`. Here one
//! role does both.
//!
//! On managed PostgreSQL (RDS, Supabase, ...), which cannot load `loom.so`,
//! set `LOOM_SQL_ONLY=1`: the migration installs loom's SQL-only flavour as
//! the database's owner (no superuser), and the rest runs unchanged, the
//! zstd frames encoded and decoded here in the client:
//!
//! ```sh
//! LOOM_SQL_ONLY=1 LOOM_DB="postgres://owner@db.example.com/app" cargo run -p pgloom --example service
//! ```
//!
//! Behind a transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy), point
//! `LOOM_DB` at the pooler: nothing here leaves state on a server
//! connection (loom prepares no named statement; the service's own INSERT
//! below goes with its types in one round trip, `query_typed`, for the
//! same reason).
//!
//! `make test` runs this example on a fresh database with each flavour,
//! the SQL-only one as a database owner that is not superuser on a server
//! with no loom library, and six copies of it at once through PgBouncer
//! in transaction mode.

use std::time::{SystemTime, UNIX_EPOCH};

use pgloom::branch_registry::{BranchRegistry, PgBranchRegistry};
use pgloom::event_store::{Event, EventStore, PgEventStore};
use pgloom::interop::tokio_postgres::types::Type;
use pgloom::migrate::{migrate, MigrateOptions};
use pgloom::resume::resume;
use pgloom::snapshot_store::{
    Codec, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};
use pgloom::{PgPool, PgPoolOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let conninfo = std::env::var("LOOM_DB").map_err(|_| "set LOOM_DB to a conninfo")?;

    // 1. At boot: create or update the extension (as its owner), or the
    //    SQL-only flavour (as the database's owner), with zstd snapshot
    //    frames provisioned.
    let mut options = MigrateOptions::new();
    options.snapshot_codec(Codec::Zstd);
    if std::env::var_os("LOOM_SQL_ONLY").is_some_and(|v| v == "1") {
        options.sql_only();
    }
    let migration = migrate(&conninfo, &options).await?;
    println!(
        "loom {} -> {}",
        migration.from_version.as_deref().unwrap_or("(none)"),
        migration.to_version
    );
    for warning in &migration.warnings {
        eprintln!("loom migration: {warning}");
    }

    // 2. One pool, shared by the three stores, each built by `new` (no
    //    I/O); fail here, not on a request, if the extension is one this
    //    client does not work with.
    let pool = PgPool::connect_with(&conninfo, PgPoolOptions::new().max_size(8))?;
    let events = PgEventStore::new(pool.clone());
    let server = events.check_server().await?;
    println!(
        "loom {} ({}) in schema {}",
        server.extension_version, server.flavour, server.schema
    );
    let mut snapshot_options = PgSnapshotStoreOptions::new();
    snapshot_options.codec(Codec::Zstd);
    // Frames were provisioned by migrate() above; the store does no DDL.
    let snapshots = PgSnapshotStore::new(pool.clone(), &snapshot_options)?;
    let refs = PgBranchRegistry::new(pool.clone());

    // A run id of this process, so the example runs again on one database.
    let run = format!(
        "order-{}",
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros()
    );

    // 3. Append: a turn of the workflow.
    events
        .append(&[
            Event::new(&run, 1, "started", serde_json::json!({ "order": 42 })),
            Event::new(&run, 2, "priced", serde_json::json!({ "total": "19.90" })),
        ])
        .await?;

    // 4. Append inside the service's own transaction, beside a row of its
    //    own table: both commit, or neither does.
    //    The service's own schema is its own migration: copies of it that
    //    start at once take a transaction-scoped lock first, since two
    //    concurrent `CREATE TABLE IF NOT EXISTS` can both miss the table
    //    and one then fails on the catalog (23505). A transaction-scoped
    //    lock is also safe behind a transaction-mode pooler.
    let mut conn = pool.as_ref().get().await?;
    let setup = conn.transaction().await?;
    setup
        .batch_execute(
            "SELECT pg_advisory_xact_lock(hashtext('loom example: orders table'));
             CREATE TABLE IF NOT EXISTS orders (run text PRIMARY KEY, state text NOT NULL)",
        )
        .await?;
    setup.commit().await?;
    let tx = conn.transaction().await?;
    tx.query_typed(
        "INSERT INTO orders (run, state) VALUES ($1, 'paid')",
        &[(&run, Type::TEXT)],
    )
    .await?;
    events
        .on(&tx)
        .append(&[Event::new(
            &run,
            3,
            "paid",
            serde_json::json!({ "by": "card" }),
        )])
        .await?;
    refs.on(&tx)
        .put_ref(&format!("{run}/main"), &run, 3)
        .await?;
    tx.commit().await?;
    drop(conn);

    // 5. Page execution ids (code point order, an id cursor).
    let mut after: Option<String> = None;
    let mut seen = 0;
    loop {
        let page = events.list_executions_page(after.as_deref(), 100).await?;
        seen += page.ids.len();
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    println!("{seen} executions paged");

    // 6. Save a snapshot (a zstd frame, encoded here: a state zstd makes
    //    smaller, as an order's lines are) and load it back.
    let lines: Vec<serde_json::Value> = (1..=20)
        .map(|i| serde_json::json!({ "sku": format!("sku-{i}"), "qty": 1, "price": "0.99" }))
        .collect();
    let state = JsonText::new(serde_json::to_string(&serde_json::json!({
        "order": 42, "paid": true, "run": run, "lines": lines
    }))?)?;
    snapshots
        .save(&NewSnapshot::new(&run, "orders", 3, state.clone()))
        .await?;
    let loaded = snapshots.load_latest(&run).await?.ok_or("no snapshot")?;
    assert_eq!(loaded.state, state, "a frame returns its text exactly");

    // 7. A later event with metadata (who and which trace; safe to retry),
    //    then resume: the snapshot and only what came after.
    let shipped = Event::new(&run, 4, "shipped", serde_json::json!({}))
        .with_metadata(serde_json::json!({ "trace_id": "4bf92f3577b34da6", "actor": "courier" }));
    events
        .append_idempotent(std::slice::from_ref(&shipped))
        .await?;
    let resumed = resume(&events, &snapshots, &run).await?;
    let tail: Vec<i64> = resumed.events.iter().map(|e| e.sequence).collect();
    assert_eq!(resumed.snapshot.map(|s| s.sequence), Some(3));
    assert_eq!(tail, [4]);
    assert_eq!(resumed.events[0].metadata, shipped.metadata);
    println!("{run}: resumed from its snapshot at 3, then {tail:?}");
    Ok(())
}

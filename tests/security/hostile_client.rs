//! The hostile database owner (issue 25) against the client and the `loom`
//! command: a role that owns its database, and so `public`, but is not
//! superuser, plants a trap wherever a superuser's session could resolve a
//! name it sends: a schema named after the superuser (first in the default
//! `search_path`, `"$user", public`) holding every loom function the client
//! calls, overloads of loom's functions beside them in `public`, operators
//! and functions in `public` that beat the built-ins a statement meant
//! (`bigint * interval`, `oid = regclass`, `integer || text`, `unnest`),
//! and, in one database, `search_path = public, pg_catalog` with exact
//! shadows of built-in operators, functions and types. Then the superuser
//! runs `migrate()` (creating, then updating), every store operation and
//! every `loom` command through the client library. Each must succeed, and
//! no trap may run. `tests/security/hostile_owner.rs` meets the same owner with
//! loom's scripts and SQL functions.

use std::time::Duration;

use loom_harness::cli::loom;
use loom_harness::hostile_owner::{trap, HostileDatabase};
use loom_harness::pg_pool;
use loom_harness::{runtime, Cluster, LOOM_VERSION, RELEASED_VERSIONS};
use pgloom::branch_registry::{BranchRegistry, PgBranchRegistry};
use pgloom::event_store::{Event, EventStore, PgEventStore};
use pgloom::migrate::{migrate, MigrateOptions};
use pgloom::snapshot_store::{
    Codec, Decode, FrameProvisioning, JsonText, NewSnapshot, PgSnapshotStore,
    PgSnapshotStoreOptions, SnapshotQuery, SnapshotStore,
};
use pgloom::{Error, PgPool};

const CLUSTER: Cluster = Cluster::C;
/// The superuser the harness connects as, and so the schema `"$user"` names.
const SUPERUSER: &str = "postgres";

/// Plants each `CREATE …` statement as the owner, skipping one whose
/// object is there already (the harness's own plants may have made it).
fn plant(db: &HostileDatabase, statements: &[String]) {
    let blocks: Vec<String> = statements
        .iter()
        .map(|statement| {
            format!(
                "DO $plant$ BEGIN EXECUTE $sql${statement}$sql$;
                 EXCEPTION WHEN duplicate_function OR duplicate_object THEN NULL; END $plant$"
            )
        })
        .collect();
    db.as_owner(&blocks.join(";\n"));
}

/// A trap function `schema.name(args)`.
fn trap_function(schema: &str, name: &str, args: &str, result: &str) -> String {
    let signature = format!("{schema}.{name}({args})");
    trap(&signature, &signature, result)
}

/// A trap operator `public.{name}` on (`left`, `right`).
fn trap_operator(name: &str, left: &str, right: &str, result: &str) -> [String; 2] {
    let function: String = format!("loom_trap_client_op_{name}_{left}_{right}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    [
        trap(
            &format!("operator {name} ({left}, {right})"),
            &format!("public.{function}(l {left}, r {right})"),
            result,
        ),
        format!(
            "CREATE OPERATOR public.{name} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = public.{function})"
        ),
    ]
}

/// What the client used to send unqualified, and what it names now, each a
/// trap in `public`: operators whose argument types beat the built-in a
/// statement meant (it needs a cast: `bigint * interval` is `float8 *
/// interval`), exact shadows (which win once `public` comes before
/// `pg_catalog`), and functions the client calls.
fn plant_builtin_traps(db: &HostileDatabase) {
    let mut statements = Vec::new();
    for (name, left, right, result) in [
        ("*", "bigint", "interval", "interval"),
        ("*", "numeric", "integer", "numeric"),
        ("=", "oid", "regclass", "boolean"),
        ("||", "integer", "text", "text"),
        ("=", "text", "text", "boolean"),
        ("=", "oid", "oid", "boolean"),
        ("=", "name", "name", "boolean"),
        ("=", "\"char\"", "\"char\"", "boolean"),
        ("=", "bigint", "bigint", "boolean"),
        ("<", "bigint", "bigint", "boolean"),
        (">", "bigint", "bigint", "boolean"),
        ("||", "text", "text", "text"),
        ("*", "double precision", "interval", "interval"),
        ("*", "numeric", "numeric", "numeric"),
    ] {
        statements.extend(trap_operator(name, left, right, result));
    }
    for (name, args, result) in [
        ("now", "", "timestamptz"),
        ("current_database", "", "name"),
        ("inet_server_addr", "", "inet"),
        ("inet_server_port", "", "integer"),
        ("host", "inet", "text"),
        ("set_config", "text, text, boolean", "text"),
        ("pg_advisory_xact_lock", "bigint", "void"),
        ("to_regprocedure", "text", "regprocedure"),
        ("quote_ident", "text", "text"),
        ("quote_literal", "text", "text"),
        // Beat the polymorphic unnest(anyarray) that an unqualified
        // two-argument unnest expands to.
        ("unnest", "text[]", "SETOF text"),
        ("unnest", "bigint[]", "SETOF bigint"),
    ] {
        statements.push(trap_function("public", name, args, result));
    }
    statements.push(trap_function(
        "public",
        "loom_trap_max",
        "s bigint, v bigint",
        "bigint",
    ));
    statements.push(
        "CREATE AGGREGATE public.max(bigint) (SFUNC = public.loom_trap_max, STYPE = bigint)"
            .to_owned(),
    );
    plant(db, &statements);
}

/// Before loom exists: a schema named after the superuser, first on the
/// default `search_path`, with the functions `migrate()` and `loom status`
/// call, each returning what the real one does.
fn plant_loom_traps_before_create(db: &HostileDatabase) {
    db.as_owner(&format!(
        "CREATE SCHEMA IF NOT EXISTS {SUPERUSER}; GRANT USAGE ON SCHEMA {SUPERUSER} TO PUBLIC"
    ));
    plant(
        db,
        &[
            trap_function(SUPERUSER, "loom_take_migration_lock", "", "void"),
            trap_function(
                SUPERUSER,
                "loom_migrate_collations",
                "integer",
                "TABLE(column_name text, outcome text)",
            ),
            trap_function(SUPERUSER, "loom_drop_events_id_index", "integer", "text"),
            trap_function(SUPERUSER, "loom_ensure_snapshot_zstd", "integer", "boolean"),
            trap_function(
                SUPERUSER,
                "loom_status",
                "",
                "TABLE(item text, value text, needs_action boolean, statement text)",
            ),
            trap_function(
                SUPERUSER,
                "loom_append_event",
                "text, bigint, text, jsonb",
                "void",
            ),
        ],
    );
}

/// Types of `public` named like the built-ins the client casts to, whose
/// check runs a trap on every value cast to them: they win once `public`
/// comes before `pg_catalog`. Planted last: the harness plants with
/// unqualified type names.
fn plant_type_traps(db: &HostileDatabase) {
    let mut statements = vec!["CREATE FUNCTION public.loom_trap_type(what pg_catalog.text)
         RETURNS pg_catalog.bool LANGUAGE plpgsql
         AS $trap$ BEGIN PERFORM public.loom_trap_fired(what); RETURN true; END $trap$"
        .to_owned()];
    for name in [
        "text", "jsonb", "bytea", "int8", "int4", "bool", "interval", "float8", "regclass",
    ] {
        statements.push(format!(
            "CREATE DOMAIN public.{name} AS pg_catalog.{name}
             CHECK (public.loom_trap_type('type public.{name}'))"
        ));
    }
    plant(db, &statements);
}

fn event(id: &str, sequence: i64) -> Event {
    Event::new(id, sequence, "step", serde_json::json!({ "n": sequence }))
}

fn state(text: &str) -> JsonText {
    JsonText::new(text.to_owned()).unwrap()
}

/// Runs `loom {args}` against the database and expects exit `code`,
/// returning what it printed.
fn loom_cli(db: &HostileDatabase, code: i32, command: &[&str], args: &[&str]) -> String {
    let conninfo = db.conninfo();
    let mut full = command.to_vec();
    full.extend(["--db", &conninfo]);
    let (exit, out, _) = loom(&full, args);
    assert_eq!(exit, code, "loom {command:?} {args:?}: {out}");
    out
}

/// Creates loom at the release before this one and updates it, as
/// `migrate()` does at a service's boot, with traps planted before each
/// step; `extra_traps` runs once loom exists (types go in last).
fn migrate_through_traps(db: &HostileDatabase, extra_traps: impl Fn()) {
    let rt = runtime();
    let conninfo = db.conninfo();
    let previous = RELEASED_VERSIONS[RELEASED_VERSIONS.len() - 1];

    // Nothing installed: a typed error, and no function of that name called.
    let store = PgEventStore::new(pg_pool(&conninfo, 1).unwrap());
    match rt.block_on(store.append(&[event("early", 1)])) {
        Err(Error::ExtensionMissing { function }) => assert_eq!(function, "loom_append_event"),
        other => panic!("a store before loom exists: {other:?}"),
    }
    let out = loom_cli(db, 1, &["status"], &[]);
    assert!(out.contains("not installed"), "{out}");
    db.assert_nothing_gained("a store and loom status before loom exists");

    let created = rt
        .block_on(migrate(
            &conninfo,
            MigrateOptions::new().to_version(previous),
        ))
        .unwrap_or_else(|e| panic!("migrate() creating loom {previous}: {e:?}"));
    assert_eq!(
        (created.from_version.as_deref(), created.to_version.as_str()),
        (None, previous)
    );
    db.assert_nothing_gained("migrate() creating loom");

    db.plant_loom_shadows(SUPERUSER);
    extra_traps();
    let updated = rt
        .block_on(migrate(&conninfo, &MigrateOptions::new()))
        .unwrap_or_else(|e| panic!("migrate() updating loom from {previous}: {e:?}"));
    assert_eq!(
        (updated.from_version.as_deref(), updated.to_version.as_str()),
        (Some(previous), LOOM_VERSION)
    );
    assert!(updated.warnings.is_empty(), "{:?}", updated.warnings);
    db.assert_nothing_gained("migrate() updating loom");
    db.plant_loom_shadows(SUPERUSER);
}

/// Every store operation, as the superuser, through the client library.
fn exercise_the_stores(db: &HostileDatabase) {
    let rt = runtime();
    let pool = pg_pool(&db.conninfo(), 2).unwrap();
    let events = PgEventStore::new(pool.clone());
    exercise_the_event_store(db, &rt, &pool, &events);
    exercise_the_snapshot_store(db, &rt, &pool, &events);
    exercise_the_branch_registry(db, &rt, &pool);
    exercise_the_stores_on_a_transaction(db, &rt, &pool, &events);
}

/// Every event-store call, exec-1, -2 and -4 left behind (exec-2 emptied).
fn exercise_the_event_store(
    db: &HostileDatabase,
    rt: &tokio::runtime::Runtime,
    pool: &PgPool,
    events: &PgEventStore,
) {
    rt.block_on(async {
        events
            .append(&[event("exec-1", 1), event("exec-1", 2), event("exec-2", 1)])
            .await
            .unwrap();
        events.append(&[event("exec-1", 3)]).await.unwrap();
        for sequence in 1..=3 {
            events.append(&[event("exec-4", sequence)]).await.unwrap();
        }
        match events
            .append(&[event("exec-2", 2), event("exec-1", 3)])
            .await
        {
            Err(Error::DuplicateEvent {
                execution_id,
                sequence,
            }) => assert_eq!((execution_id.as_str(), sequence), ("exec-1", 3)),
            other => panic!("a duplicate batch: {other:?}"),
        }
        assert_eq!(events.read_events("exec-1").await.unwrap().len(), 3);
        let tail = events
            .read_events_after("exec-1", Some(1), 10)
            .await
            .unwrap();
        assert_eq!(tail.iter().map(|e| e.sequence).collect::<Vec<_>>(), [2, 3]);
        let page = events.list_executions_page(None, 10).await.unwrap();
        assert_eq!(page.ids, ["exec-1", "exec-2", "exec-4"]);
        assert_eq!(events.delete_events("exec-2", None, 10).await.unwrap(), 1);
        assert_eq!(events.execution_activity(None, 10).await.unwrap().len(), 2);
        let idle = events
            .delete_idle_executions(Duration::from_secs(86_400), None, 100)
            .await
            .unwrap();
        assert_eq!(
            (idle.examined, idle.executions_deleted, idle.done),
            (2, 0, true)
        );
        let check = events.verify_executions_index(1, |_| {}).await.unwrap();
        assert!(check.in_step() && check.checked == 2, "{check:?}");
        let repair = events.repair_executions_index(1, |_| {}).await.unwrap();
        assert_eq!((repair.added, repair.removed), (0, 0), "{repair:?}");
        // Not on Citus: a Citus store refuses, after asking loom.
        let citus = PgEventStore::new_citus(pool.clone());
        assert!(matches!(
            citus.list_executions_page(None, 1).await,
            Err(Error::NotDistributed)
        ));
    });
    db.assert_nothing_gained("the event store");
}

/// Every snapshot-store call, client- and server-decoded: exec-1 and -4
/// left with a snapshot, exec-1's events pruned below it.
fn exercise_the_snapshot_store(
    db: &HostileDatabase,
    rt: &tokio::runtime::Runtime,
    pool: &PgPool,
    events: &PgEventStore,
) {
    rt.block_on(async {
        let mut options = PgSnapshotStoreOptions::new();
        options.codec(Codec::Zstd);
        let snapshots = PgSnapshotStore::start(pool.clone(), &options)
            .await
            .unwrap();
        assert_eq!(snapshots.frame_provisioning(), FrameProvisioning::Ready);
        for (id, sequence) in [("exec-1", 2), ("exec-4", 3), ("exec-5", 1)] {
            snapshots
                .save(&NewSnapshot::new(
                    id,
                    "agentLoop",
                    sequence,
                    state(r#"{"b":1,"a":[2]}"#),
                ))
                .await
                .unwrap();
        }
        let latest = snapshots
            .load("exec-1", SnapshotQuery::Latest)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(latest.state.as_str(), r#"{"b":1,"a":[2]}"#);
        assert!(snapshots
            .load("exec-1", SnapshotQuery::At(2))
            .await
            .unwrap()
            .is_some());
        assert!(snapshots
            .load("exec-1", SnapshotQuery::Before(2))
            .await
            .unwrap()
            .is_none());
        assert_eq!(snapshots.latest_sequence("exec-1").await.unwrap(), Some(2));
        let resumed = snapshots.resume("exec-1").await.unwrap();
        assert_eq!(resumed.snapshot.map(|s| s.sequence), Some(2));
        assert_eq!(
            resumed
                .events
                .iter()
                .map(|e| e.sequence)
                .collect::<Vec<_>>(),
            [3]
        );
        assert_eq!(snapshots.delete_snapshots("exec-5", 10).await.unwrap(), 1);
        let check = snapshots.verify_frames(10, |_| {}).await.unwrap();
        assert_eq!((check.frames, check.unreadable.len()), (2, 0));

        let mut server = PgSnapshotStoreOptions::new();
        server.decode(Decode::Server);
        let decoded_in_server = PgSnapshotStore::start(pool.clone(), &server).await.unwrap();
        let latest = decoded_in_server
            .load("exec-1", SnapshotQuery::Latest)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(latest.state.as_str(), r#"{"b":1,"a":[2]}"#);

        // The server prunes below the snapshot: event 1 goes, 2 stays.
        assert_eq!(events.prune_events("exec-1", 100).await.unwrap(), 1);
        assert_eq!(events.delete_execution("exec-5", 100).await.unwrap(), 0);
    });
    db.assert_nothing_gained("the snapshot store");
}

/// Every branch-registry call, leaving no ref.
fn exercise_the_branch_registry(db: &HostileDatabase, rt: &tokio::runtime::Runtime, pool: &PgPool) {
    rt.block_on(async {
        let refs = PgBranchRegistry::new(pool.clone());
        refs.put_ref("main", "exec-1", 2).await.unwrap();
        let main = refs.get_ref("main").await.unwrap().unwrap();
        assert_eq!((main.execution_id.as_str(), main.sequence), ("exec-1", 2));
        assert_eq!(refs.list_refs(None, 10).await.unwrap().ids, ["main"]);
        assert!(refs.promote_ref("main", "release").await.unwrap());
        assert!(refs.delete_ref("release").await.unwrap());
        assert!(refs.get_ref("main").await.unwrap().is_none());
    });
    db.assert_nothing_gained("the branch registry");
}

/// The same statements on the caller's own transaction (sent typed, not
/// prepared by the pool), rolled back (the CLI after sees what it saw).
fn exercise_the_stores_on_a_transaction(
    db: &HostileDatabase,
    rt: &tokio::runtime::Runtime,
    pool: &PgPool,
    events: &PgEventStore,
) {
    rt.block_on(async {
        let refs = PgBranchRegistry::new(pool.clone());
        let mut options = PgSnapshotStoreOptions::new();
        options.codec(Codec::Zstd);
        let snapshots = PgSnapshotStore::start(pool.clone(), &options)
            .await
            .unwrap();
        let mut conn = pool.as_ref().get().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        events
            .on(&tx)
            .append(&[event("exec-6", 1), event("exec-6", 2)])
            .await
            .unwrap();
        events.on(&tx).append(&[event("exec-6", 3)]).await.unwrap();
        assert_eq!(events.on(&tx).read_events("exec-6").await.unwrap().len(), 3);
        assert!(events
            .on(&tx)
            .list_executions_page(None, 10)
            .await
            .unwrap()
            .ids
            .contains(&"exec-6".to_owned()));
        snapshots
            .on(&tx)
            .save(&NewSnapshot::new(
                "exec-6",
                "agentLoop",
                2,
                state(r#"{"c":3}"#),
            ))
            .await
            .unwrap();
        assert_eq!(
            snapshots.on(&tx).latest_sequence("exec-6").await.unwrap(),
            Some(2)
        );
        assert!(snapshots
            .on(&tx)
            .load("exec-6", SnapshotQuery::Latest)
            .await
            .unwrap()
            .is_some());
        refs.on(&tx).put_ref("tx-main", "exec-6", 2).await.unwrap();
        assert!(refs
            .on(&tx)
            .promote_ref("tx-main", "tx-release")
            .await
            .unwrap());
        assert_eq!(
            refs.on(&tx).list_refs(None, 10).await.unwrap().ids,
            ["tx-release"]
        );
        assert_eq!(
            events
                .on(&tx)
                .delete_events("exec-6", Some(1), 10)
                .await
                .unwrap(),
            1
        );
        tx.rollback().await.unwrap();
        assert!(refs.get_ref("tx-release").await.unwrap().is_none());
        assert!(events.read_events("exec-6").await.unwrap().is_empty());
    });
    db.assert_nothing_gained("the stores on the caller's transaction");
}

/// Every `loom` command, as the superuser.
fn exercise_the_cli(db: &HostileDatabase) {
    let out = loom_cli(db, 0, &["migrate"], &[]);
    assert!(
        out.starts_with(&format!("loom {LOOM_VERSION} -> {LOOM_VERSION}")),
        "{out}"
    );
    let conninfo = db.conninfo();
    let (code, out, _) = loom(&["status", "--db", &conninfo], &[]);
    assert!(
        code <= 1 && out.contains("executions index") && !out.starts_with("loom:"),
        "loom status ({code}): {out}"
    );
    let out = loom_cli(db, 0, &["executions", "list"], &[]);
    assert_eq!(out, "exec-1\nexec-4\n");
    let out = loom_cli(db, 0, &["events", "show"], &["exec-1"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    let out = loom_cli(db, 0, &["snapshot", "show"], &["exec-1"]);
    assert!(out.contains("\"sequence\": 2"), "{out}");
    let out = loom_cli(db, 0, &["retention"], &["--older-than", "1d", "--dry-run"]);
    assert!(out.starts_with("would delete 0 executions"), "{out}");
    let out = loom_cli(db, 0, &["retention"], &["--older-than", "1d"]);
    assert!(out.starts_with("deleted 0 executions"), "{out}");
    let out = loom_cli(db, 1, &["retention"], &["--prune-to-snapshot", "--dry-run"]);
    assert!(out.starts_with("would prune 2 events"), "{out}");
    let out = loom_cli(db, 0, &["retention"], &["--prune-to-snapshot"]);
    assert!(out.starts_with("pruned 2 events"), "{out}");
    let out = loom_cli(db, 0, &["repair"], &["--verify-frames"]);
    assert!(out.contains("frames: 2 read, 0 unreadable"), "{out}");
    db.assert_nothing_gained("every loom command");
}

#[test]
fn the_client_and_the_cli_run_nothing_a_database_owner_planted() {
    const OWNER: &str = "loom_hostile_client_owner";
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_client", OWNER);
    db.plant_builtin_shadows();
    plant_builtin_traps(&db);
    plant_loom_traps_before_create(&db);
    migrate_through_traps(&db, || {});
    exercise_the_stores(&db);
    exercise_the_cli(&db);
}

#[test]
fn nothing_resolves_when_public_comes_before_pg_catalog() {
    const OWNER: &str = "loom_hostile_client_path_owner";
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_client_path", OWNER);
    // Every unqualified name in every session of this database now finds
    // the owner's exact shadows before the built-ins.
    db.as_owner(&format!(
        "ALTER DATABASE {} SET search_path = public, pg_catalog",
        db.name()
    ));
    db.plant_builtin_shadows();
    plant_builtin_traps(&db);
    plant_loom_traps_before_create(&db);
    migrate_through_traps(&db, || plant_type_traps(&db));
    exercise_the_stores(&db);
    exercise_the_cli(&db);
}

/// A database with loom 0.6.0 in a schema of the owner's whose name needs
/// quotes, where the owner planted the functions 0.6.0 lacks.
fn old_loom_beside_planted_functions(name: &str, owner: &str) -> HostileDatabase {
    // loom 0.6.0, in a schema of the owner's whose name needs quotes
    // (PostgreSQL refuses an extension schema holding `"$'\`): it has no
    // loom_status, loom_execution_activity or loom_delete_idle_executions,
    // so the owner can create them there with loom's exact signatures.
    const SCHEMA: &str = "Loom API-v1";
    let quoted = "\"Loom API-v1\"";
    let db = HostileDatabase::create(CLUSTER, name, owner);
    db.as_owner(&format!(
        "CREATE SCHEMA {quoted}; GRANT USAGE ON SCHEMA {quoted} TO PUBLIC"
    ));
    let rt = runtime();
    let mut options = MigrateOptions::new();
    options.to_version("0.6.0").schema(SCHEMA);
    let created = rt
        .block_on(migrate(&db.conninfo(), &options))
        .unwrap_or_else(|e| panic!("migrate() creating loom 0.6.0 in {SCHEMA}: {e:?}"));
    assert_eq!(created.to_version, "0.6.0");
    let in_schema: String = db
        .superuser()
        .query_one(
            "SELECT n.nspname::pg_catalog.text FROM pg_catalog.pg_extension e
             JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
             WHERE e.extname OPERATOR(pg_catalog.=) 'loom'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(in_schema, SCHEMA);
    plant(
        &db,
        &[
            trap_function(
                quoted,
                "loom_status",
                "",
                "TABLE(item text, value text, needs_action boolean, statement text)",
            ),
            trap_function(
                quoted,
                "loom_execution_activity",
                "text, integer",
                "TABLE(execution_id text, last_sequence bigint, last_event_at timestamptz)",
            ),
            trap_function(
                quoted,
                "loom_delete_idle_executions",
                "interval, text, integer",
                "TABLE(examined bigint, executions_deleted bigint, rows_deleted bigint, next_after text, done boolean)",
            ),
        ],
    );
    db
}

#[test]
fn a_function_the_installed_version_lacks_is_never_called_by_the_client() {
    let db = old_loom_beside_planted_functions(
        "loom_hostile_client_old",
        "loom_hostile_client_old_owner",
    );
    let events = PgEventStore::new(pg_pool(&db.conninfo(), 1).unwrap());
    runtime().block_on(async {
        events.append(&[event("exec-1", 1)]).await.unwrap();
        let missing = |result: Result<_, Error>, function: &str| match result {
            Err(Error::ExtensionMissing { function: f }) => assert_eq!(f, function),
            Err(other) => panic!("{function}: {other}"),
            Ok(_) => panic!("{function} was called"),
        };
        missing(
            events.execution_activity(None, 10).await.map(|_| ()),
            "loom_execution_activity",
        );
        missing(
            events
                .delete_idle_executions(Duration::ZERO, None, 10)
                .await
                .map(|_| ()),
            "loom_delete_idle_executions",
        );
        missing(
            events.repair_executions_index(10, |_| {}).await.map(|_| ()),
            "loom_repair_executions",
        );
        missing(
            events.verify_executions_index(10, |_| {}).await.map(|_| ()),
            "loom_verify_executions",
        );
    });
    db.assert_nothing_gained("calls a function 0.6.0 lacks would have made");
}

#[test]
fn a_function_the_installed_version_lacks_is_never_called_by_the_cli() {
    let db = old_loom_beside_planted_functions(
        "loom_hostile_client_old_cli",
        "loom_hostile_client_old_cli_owner",
    );
    let out = loom_cli(&db, 1, &["status"], &[]);
    assert!(
        out.contains("loom version") && out.contains("0.6.0") && out.contains("no loom_status()"),
        "{out}"
    );
    let out = loom_cli(&db, 1, &["retention"], &["--older-than", "1d"]);
    assert!(out.contains("loom_delete_idle_executions"), "{out}");
    let out = loom_cli(&db, 1, &["repair"], &[]);
    assert!(out.contains("loom_repair_executions"), "{out}");
    db.assert_nothing_gained("calls a function 0.6.0 lacks would have made");
}

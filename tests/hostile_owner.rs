//! The hostile database owner (issue 25), against loom's scripts and
//! functions: a role that owns its database, and so `public`, but is not
//! superuser, plants a trap for every operator and function loom's scripts
//! name (with the exact argument types of a call site that needs a cast)
//! and for every loom function (in a schema named after the superuser and
//! beside loom's own in `public`) before each step; then the superuser
//! creates loom, updates it along every path from every released version,
//! and calls its functions. Nothing may be gained, and every step must
//! complete. The client and the `loom` command meet the same owner in
//! `tests/hostile_client.rs`.

use std::thread;

use loom_harness::hostile_owner::HostileDatabase;
use loom_harness::{
    describe, sqlstate, Cluster, LOOM_VERSION, MIGRATION_LOCK_KEY, RELEASED_VERSIONS,
};
use postgres::Client;

const CLUSTER: Cluster = Cluster::C;
const OWNER: &str = "loom_hostile_owner";
/// The superuser the harness connects as, and so the schema `"$user"` names.
const SUPERUSER: &str = "postgres";

/// `CREATE EXTENSION loom [VERSION v] SCHEMA public`, as the superuser.
fn create_extension(db: &HostileDatabase, version: Option<&str>) {
    let version = version.map_or(String::new(), |v| format!(" VERSION '{v}'"));
    let statement = format!("CREATE EXTENSION loom{version} SCHEMA public");
    db.superuser()
        .batch_execute(&statement)
        .unwrap_or_else(|e| panic!("{statement} in {}: {}", db.name(), describe(&e)));
}

/// The documented update (docs/upgrading.md), as the superuser.
fn update_extension(db: &HostileDatabase) {
    let mut su = db.superuser();
    su.batch_execute(&format!(
        "BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0;
         SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY});
         ALTER EXTENSION loom UPDATE TO '{LOOM_VERSION}'; COMMIT"
    ))
    .unwrap_or_else(|e| {
        panic!(
            "ALTER EXTENSION loom UPDATE in {}: {}",
            db.name(),
            describe(&e)
        )
    });
}

/// Calls each of loom's functions as the superuser, in a session whose
/// search_path is the default one, `"$user", public`: both schemas are the
/// owner's. Every name and argument type is given exactly, so that only
/// loom's own bodies could reach a trap.
fn exercise_as_superuser(db: &HostileDatabase) {
    let mut su = CLUSTER.connect(db.name());
    su.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE \"Hostile-Svc {OWNER}\"; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    ))
    .expect("a role whose name needs quotes");
    let role = format!("'\"Hostile-Svc {OWNER}\"'::pg_catalog.regrole");
    let text = "::pg_catalog.text";
    let statements = [
        format!("SELECT public.loom_append_events(ARRAY['wf-1', 'wf-2']{text}[], ARRAY[1, 1]::pg_catalog.int8[], ARRAY['started', 'started']{text}[], ARRAY['{{}}', '{{}}']::pg_catalog.jsonb[])"),
        format!("SELECT public.loom_append_event('wf-1'{text}, 2::pg_catalog.int8, 'step'{text}, '{{}}'::pg_catalog.jsonb)"),
        "SELECT public.loom_ensure_snapshot_zstd(100)".to_owned(),
        format!("SELECT public.loom_save_snapshot('wf-1'{text}, 'agent'{text}, 2::pg_catalog.int8, '{{\"a\":[1]}}'{text}, 'zstd'{text})"),
        format!("SELECT * FROM public.loom_load_snapshot('wf-1'{text}, NULL::pg_catalog.int8)"),
        format!("SELECT public.loom_snapshot_get_text(public.loom_snapshot_frame('{{\"a\":[1]}}'{text}, 'zstd'{text}), VARIADIC ARRAY['a', '-1']{text}[])"),
        format!("SELECT public.loom_put_ref('main'{text}, 'wf-1'{text}, 2::pg_catalog.int8)"),
        format!("SELECT * FROM public.loom_list_refs(NULL{text}, 10)"),
        format!("SELECT * FROM public.loom_list_executions(NULL{text}, 10)"),
        format!("SELECT * FROM public.loom_read_events('wf-1'{text}, NULL::pg_catalog.int8, 10)"),
        format!("SELECT * FROM public.loom_execution_activity(NULL{text}, 10)"),
        "SELECT * FROM public.loom_status()".to_owned(),
        "SELECT * FROM public.loom_migrate_collations(100)".to_owned(),
        "SELECT public.loom_drop_events_id_index(100)".to_owned(),
        "SELECT public.loom_rebuild_executions()".to_owned(),
        format!("SELECT public.loom_grant_access({role}, 'writer'{text})"),
        format!("SELECT public.loom_revoke_access({role})"),
        format!("SELECT public.loom_prune_events('wf-1'{text}, 100)"),
        format!("SELECT * FROM public.loom_delete_idle_executions('1 day'::interval, NULL{text}, 100)"),
        "CALL public.loom_sweep_idle_executions('0 seconds'::interval, 1)".to_owned(),
        format!("SELECT public.loom_delete_ref('main'{text})"),
        format!("SELECT public.loom_delete_execution('wf-2'{text}, 100)"),
    ];
    for statement in statements {
        su.batch_execute(&statement).unwrap_or_else(|e| {
            panic!(
                "as the superuser in {}: {statement}: {}",
                db.name(),
                describe(&e)
            )
        });
    }
}

/// The owner renames `public`, where loom's functions are, to make a
/// `public` of its own that their bodies would call: refused, as is a
/// rename of either of loom's schemas by the superuser; other schemas
/// rename as ever. (Before, the owner's `public.loom_require_read_committed`
/// ran as the superuser inside `loom_lock_idle_execution`.)
fn refuse_renaming_loom_schemas(db: &HostileDatabase) {
    let mut owner = CLUSTER.connect_as(db.name(), OWNER);
    let refused = owner
        .batch_execute("ALTER SCHEMA public RENAME TO public_old; CREATE SCHEMA public")
        .unwrap_err();
    assert_eq!(sqlstate(&refused), "0A000", "{}", describe(&refused));
    owner
        .batch_execute(
            "CREATE SCHEMA app_v1; ALTER SCHEMA app_v1 RENAME TO app_v2; DROP SCHEMA app_v2",
        )
        .expect("the owner's other schemas rename");
    let mut su = db.superuser();
    for rename in [
        "ALTER SCHEMA public RENAME TO public_old",
        "ALTER SCHEMA loom RENAME TO loom_old",
    ] {
        let refused = su.batch_execute(rename).unwrap_err();
        assert_eq!(
            sqlstate(&refused),
            "0A000",
            "{rename}: {}",
            describe(&refused)
        );
    }
}

/// One database: planted, then loom created (at `from`, or the current
/// version) and updated, planted again before each step, then called.
fn gain_nothing_from(name: &str, from: Option<&str>) {
    let db = HostileDatabase::create(CLUSTER, name, OWNER);
    let (operators, functions) = db.plant_builtin_shadows();
    println!("{name}: {operators} operator and {functions} function traps for built-ins");
    assert!(
        operators > 100 && functions > 100,
        "the traps cover the scripts: {operators} operators, {functions} functions"
    );
    let mut loom_traps = db.plant_loom_shadows(SUPERUSER);
    create_extension(&db, from);
    db.assert_nothing_gained(&format!("CREATE EXTENSION loom VERSION {from:?}"));
    if from.is_some() {
        loom_traps += db.plant_loom_shadows(SUPERUSER);
        update_extension(&db);
        db.assert_nothing_gained(&format!("the update from {from:?}"));
    }
    // Every signature of the version loom is now at is shadowed (an update
    // that adds none, as 0.12.0's, plants nothing new here).
    loom_traps += db.plant_loom_shadows(SUPERUSER);
    assert!(loom_traps > 0, "{name}: no trap for loom's own functions");
    refuse_renaming_loom_schemas(&db);
    exercise_as_superuser(&db);
    db.assert_nothing_gained(&format!("loom's functions, after {from:?}"));
}

#[test]
fn creating_updating_and_calling_loom_gain_a_database_owner_nothing() {
    let mut starts: Vec<Option<&str>> = RELEASED_VERSIONS.iter().copied().map(Some).collect();
    starts.push(None);
    // Two at a time: each database holds a few thousand traps.
    for pair in starts.chunks(2) {
        thread::scope(|scope| {
            for from in pair {
                scope.spawn(move || {
                    let name = format!(
                        "loom_hostile_{}",
                        from.unwrap_or("current").replace('.', "_")
                    );
                    gain_nothing_from(&name, *from);
                });
            }
        });
    }
}

/// The traps can fire: a statement that leaves `oid = regclass` to the
/// search_path, as `loom--0.5.0--0.6.0.sql` did, hands its owner
/// superuser. (Its own owner: the others must stay as they are.)
#[test]
fn a_trap_in_reach_makes_its_owner_superuser() {
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_control", "loom_hostile_control");
    db.plant_builtin_shadows();
    let mut su: Client = CLUSTER.connect(db.name());
    su.batch_execute("SELECT c.oid = 'pg_class'::regclass FROM pg_class c LIMIT 1")
        .expect("the unqualified comparison runs");
    let fired = db.fired();
    assert!(
        fired
            .iter()
            .any(|f| f.contains("operator = (oid, regclass)")),
        "the trap ran: {fired:?}"
    );
    let superuser: bool = db
        .superuser()
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = 'loom_hostile_control'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(superuser, "the trap's owner became superuser");
}

/// Every script, released or current, searches pg_catalog alone before
/// anything else it does: the class is closed by construction, not by
/// qualifying each operator by hand.
#[test]
fn every_script_pins_its_search_path_first() {
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_scripts", OWNER);
    let scripts = db
        .superuser()
        .query(
            "SELECT f, pg_read_file(s.dir || '/' || f)
             FROM (SELECT setting || '/extension' AS dir FROM pg_config WHERE name = 'SHAREDIR') s,
                  pg_ls_dir(s.dir) f
             WHERE f LIKE 'loom--%.sql' ORDER BY f",
            &[],
        )
        .unwrap();
    assert!(scripts.len() >= 2 * RELEASED_VERSIONS.len());
    for row in scripts {
        let (file, text): (String, String) = (row.get(0), row.get(1));
        let first = text
            .lines()
            .map(str::trim)
            .find(|line| {
                !line.is_empty()
                    && !line.starts_with("--")
                    && !line.starts_with("/*")
                    && !line.starts_with('*')
                    && !line.starts_with("This file")
                    && !line.starts_with("The ordering")
                    && !line.starts_with("\\echo")
            })
            .unwrap_or_default();
        assert_eq!(
            first, "SET LOCAL search_path = pg_catalog, pg_temp;",
            "{file}: the first statement"
        );
    }
}

/// The sweep procedure commits between batches, so it cannot pin its
/// search_path, and it declared its batch `record`: a type name, looked up
/// through the caller's path, where the owner (`ALTER DATABASE ... SET
/// search_path = public, pg_catalog`) had put `public.record`, a composite
/// whose domain's check ran the owner's code as the superuser calling the
/// procedure (second review of issue 25). Its own owner: it sets the
/// database's search_path.
#[test]
fn the_sweep_procedure_resolves_no_type_the_owner_planted() {
    let owner = "loom_hostile_record_owner";
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_record", owner);
    create_extension(&db, None);
    db.superuser()
        .batch_execute(
            "SELECT public.loom_append_event('idle'::pg_catalog.text, 1::pg_catalog.int8,
                 'step'::pg_catalog.text, '{}'::pg_catalog.jsonb)",
        )
        .unwrap();
    db.as_owner(&format!(
        "CREATE FUNCTION public.loom_trap_check(bigint) RETURNS boolean LANGUAGE plpgsql AS $t$
         BEGIN PERFORM public.loom_trap_fired('domain check of public.record'); RETURN true; END $t$;
         CREATE DOMAIN public.loom_trap_int8 AS bigint CHECK (public.loom_trap_check(VALUE));
         CREATE TYPE public.record AS (examined public.loom_trap_int8, executions_deleted bigint,
             rows_deleted bigint, next_after text, done boolean);
         ALTER DATABASE {} SET search_path = public, pg_catalog;",
        db.name()
    ));
    // A new session takes the database's search_path.
    let mut su = CLUSTER.connect(db.name());
    let path: String = su.query_one("SHOW search_path", &[]).unwrap().get(0);
    assert_eq!(path, "public, pg_catalog");
    su.batch_execute("CALL public.loom_sweep_idle_executions('0 seconds'::interval, 10)")
        .unwrap_or_else(|e| panic!("the sweep: {}", describe(&e)));
    db.assert_nothing_gained("CALL loom_sweep_idle_executions under the owner's search_path");
}

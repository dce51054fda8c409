//! The hostile database owner (issue 25), against loom's scripts and
//! functions: a role that owns its database, and so `public`, but is not
//! superuser, plants a trap for every operator and function loom's scripts
//! name (with the exact argument types of a call site that needs a cast)
//! and for every loom function (in a schema named after the superuser and
//! beside loom's own in `public`) before each step; then the superuser
//! creates loom, updates it along every path from every released version,
//! and calls its functions. Nothing may be gained, and every step must
//! complete. The client and the `loom` command meet the same owner in
//! `tests/security/hostile_client.rs`.

use std::thread;

use loom_harness::hostile_owner::HostileDatabase;
use loom_harness::{describe, sqlstate, Cluster, LOOM_VERSION, RELEASED_VERSIONS};
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
    loom_harness::upgrade_extension(&mut su, LOOM_VERSION).unwrap_or_else(|e| {
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
    // A step out of each released version, 0.1.0's full script (the one
    // `sql/` keeps) and the current version's.
    assert!(
        scripts.len() >= RELEASED_VERSIONS.len() + 2,
        "{} scripts installed",
        scripts.len()
    );
    // No stale full script of an older version is left installed, which
    // PostgreSQL would run in place of the chain without saying so.
    let full_scripts: Vec<String> = scripts
        .iter()
        .map(|row| row.get::<_, String>(0))
        .filter(|file| file.matches("--").count() == 1)
        .collect();
    assert_eq!(
        full_scripts,
        [
            "loom--0.1.0.sql".to_owned(),
            format!("loom--{LOOM_VERSION}.sql")
        ]
    );
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

/// The SQL statements the README and docs/ give (each ```` ```sql ````
/// block, split on `;` outside quotes, comments dropped, and each inline
/// code span that is a `SELECT` or `CALL` of loom's), and each statement a
/// `$$`-quoted one of them schedules, as `(file, statement)`.
fn documented_statements() -> Vec<(String, String)> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![format!("{root}/README.md")];
    let mut docs: Vec<String> = std::fs::read_dir(format!("{root}/docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/").path().display().to_string())
        .filter(|path| path.ends_with(".md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut statements = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a doc");
        let mut block: Option<String> = None;
        for line in text.lines() {
            match (&mut block, line.trim_start()) {
                (None, fence) if fence.starts_with("```sql") => block = Some(String::new()),
                (Some(sql), fence) if fence.starts_with("```") => {
                    for statement in split_statements(sql) {
                        for scheduled in dollar_quoted(&statement) {
                            statements.push((file.clone(), scheduled));
                        }
                        statements.push((file.clone(), statement));
                    }
                    block = None;
                }
                (Some(sql), _) => {
                    sql.push_str(line);
                    sql.push('\n');
                }
                (None, prose) => {
                    // Inline spans: the odd pieces between backticks.
                    for span in prose.split('`').skip(1).step_by(2) {
                        let runnable = (span.starts_with("SELECT ") || span.starts_with("CALL "))
                            && span.contains("loom_")
                            && !span.contains("...")
                            && !span.contains(" DEFAULT ");
                        if runnable {
                            for statement in split_statements(span) {
                                statements.push((file.clone(), statement));
                            }
                        }
                    }
                }
            }
        }
    }
    statements
}

/// `sql` split on each `;` outside quotes, `--` comments dropped, empty
/// statements left out.
fn split_statements(sql: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut chars = sql.chars().peekable();
    // The closing quote or dollar tag being looked for.
    let mut inside: Option<String> = None;
    while let Some(c) = chars.next() {
        match &inside {
            Some(close) => {
                current.push(c);
                let quote = close.len() == 1;
                if quote && c.to_string() == *close && chars.peek() == Some(&c) {
                    // A doubled quote: one quote character, still inside.
                    current.push(chars.next().unwrap_or(c));
                } else if current.ends_with(close.as_str()) {
                    inside = None;
                }
            }
            None => match c {
                '-' if chars.peek() == Some(&'-') => {
                    for skipped in chars.by_ref() {
                        if skipped == '\n' {
                            current.push('\n');
                            break;
                        }
                    }
                }
                '\'' | '"' => {
                    current.push(c);
                    inside = Some(c.to_string());
                }
                '$' => {
                    let mut tag = String::from("$");
                    while let Some(&next) = chars.peek() {
                        chars.next();
                        tag.push(next);
                        if next == '$' || !(next.is_alphanumeric() || next == '_') {
                            break;
                        }
                    }
                    current.push_str(&tag);
                    if tag.len() >= 2 && tag.ends_with('$') {
                        inside = Some(tag);
                    }
                }
                ';' => {
                    if !current.trim().is_empty() {
                        statements.push(current.trim().to_owned());
                    }
                    current.clear();
                }
                _ => current.push(c),
            },
        }
    }
    if !current.trim().is_empty() {
        statements.push(current.trim().to_owned());
    }
    statements
}

/// The statements inside each `$$…$$` of `statement` that call loom: what a
/// scheduled job (pg_cron) runs.
fn dollar_quoted(statement: &str) -> Vec<String> {
    statement
        .split("$$")
        .skip(1)
        .step_by(2)
        .filter(|inner| inner.contains("loom_"))
        .flat_map(split_statements)
        .collect()
}

#[test]
fn statements_split_as_psql_would() {
    assert_eq!(
        split_statements("SELECT 'a;b''c'; -- x;\nCALL f($$x;y$$); SELECT \"a;\" FROM t"),
        ["SELECT 'a;b''c'", "CALL f($$x;y$$)", "SELECT \"a;\" FROM t"]
    );
    assert_eq!(
        dollar_quoted(
            "SELECT cron.schedule('j', '1 * * * *', $$CALL public.loom_x(interval '1 day')$$)"
        ),
        ["CALL public.loom_x(interval '1 day')"]
    );
}

/// Issue 34: every statement that the README and docs/ give, and every
/// statement they schedule, run as a superuser in a database whose owner
/// planted, beside loom's own routines in `public` and in the schema
/// `"$user"` finds first, a trap for every signature and call shape of
/// each (the full ones, the ones an untyped literal or an implicit cast
/// would pick, the shorter ones a left-out default would, the spread ones
/// a `VARIADIC` would): none may run a trap, or stop at an ambiguity the
/// owner made. So none depends on overload resolution.
#[test]
fn every_documented_statement_calls_loom_whatever_the_owner_planted() {
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_docs", OWNER);
    create_extension(&db, None);
    let traps = db.plant_loom_shadows(SUPERUSER) + db.plant_call_shape_shadows(SUPERUSER);
    let statements = documented_statements();
    let calling: Vec<&(String, String)> = statements
        .iter()
        .filter(|(_, statement)| statement.contains("loom_"))
        .collect();
    println!(
        "{traps} traps; {} documented statements, {} naming loom's routines",
        statements.len(),
        calling.len()
    );
    assert!(calling.len() >= 25, "the docs' statements were not found");
    // What the statements name: the roles they grant, data to read.
    let mut su = CLUSTER.connect(db.name());
    su.batch_execute(
        "DO $$ BEGIN CREATE ROLE orders_service; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
         DO $$ BEGIN CREATE ROLE orders_svc; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
         DO $$ BEGIN CREATE ROLE dashboards; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
    )
    .unwrap();
    let mut failures = Vec::new();
    let mut fired_before = 0;
    for (file, statement) in calling {
        let outcome = su.batch_execute(statement);
        let fired = db.fired();
        let file = file.rsplit('/').next().unwrap_or(file);
        if fired.len() > fired_before {
            failures.push(format!(
                "{file}: {statement}\n  ran {:?}",
                &fired[fired_before..]
            ));
            fired_before = fired.len();
        }
        match outcome {
            Ok(()) => println!("ok    {file}: {statement}"),
            Err(e) => {
                let code = sqlstate(&e);
                let message = describe(&e);
                println!("{code} {file}: {statement}\n      {message}");
                // An ambiguity the owner made, or a loom routine that does
                // not take what the docs pass.
                if code == "42725" || (code == "42883" && message.contains("loom_")) {
                    failures.push(format!("{file}: {statement}\n  {message}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "documented statements that depend on overload resolution:\n{}",
        failures.join("\n")
    );
    db.assert_nothing_gained("the documented statements");
}

/// Review of issue 34: the database's owner owns `public`, and
/// `DROP SCHEMA public CASCADE` would drop loom with it; the owner could
/// then create `public` again with procedures named as loom's, which a
/// superuser's documented statements and scheduled jobs would call,
/// however exactly typed. While loom is installed no role but a superuser
/// may drop its schemas, directly or through `DROP OWNED BY` their owner;
/// the owner's own schemas it drops as before.
#[test]
fn the_database_owner_cannot_drop_loom_with_its_schema() {
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_drop", OWNER);
    create_extension(&db, None);
    let mut owner = CLUSTER.connect_as(db.name(), OWNER);
    for statement in [
        "DROP SCHEMA public CASCADE",
        "DROP SCHEMA loom CASCADE",
        "DROP SCHEMA IF EXISTS nothing_here, public CASCADE",
    ] {
        let refused = owner.batch_execute(statement).unwrap_err();
        assert_eq!(
            sqlstate(&refused),
            "42501",
            "{statement}: {}",
            describe(&refused)
        );
    }
    owner
        .batch_execute(&format!("ALTER SCHEMA public OWNER TO {OWNER}"))
        .unwrap();
    let refused = owner
        .batch_execute(&format!("DROP OWNED BY {OWNER} CASCADE"))
        .unwrap_err();
    assert_eq!(sqlstate(&refused), "42501", "{}", describe(&refused));
    owner
        .batch_execute(
            "CREATE SCHEMA its_own; CREATE TABLE its_own.t (); DROP SCHEMA its_own CASCADE",
        )
        .unwrap_or_else(|e| panic!("the owner's own schema: {}", describe(&e)));
    let installed: i64 = db
        .superuser()
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'loom'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(installed, 1, "loom is still installed");
    // A superuser still may.
    db.superuser()
        .batch_execute("DROP EXTENSION loom")
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
}

/// Review of issue 34: a database's owner may ANALYZE every table of its
/// database in a transaction, holding each one's SHARE UPDATE EXCLUSIVE
/// lock until it ends. loom's migration lock is a row lock, which
/// conflicts with none of those: the owner holding them stalls no
/// migration, and cannot take the lock itself.
#[test]
fn the_database_owner_cannot_stall_a_migration() {
    let db = HostileDatabase::create(CLUSTER, "loom_hostile_stall", OWNER);
    create_extension(&db, None);
    let mut owner = CLUSTER.connect_as(db.name(), OWNER);
    owner.batch_execute("BEGIN; ANALYZE").unwrap();
    let refused = CLUSTER
        .connect_as(db.name(), OWNER)
        .batch_execute("BEGIN; SELECT FROM loom.migration_lock FOR UPDATE")
        .unwrap_err();
    assert_eq!(sqlstate(&refused), "42501", "{}", describe(&refused));
    let started = std::time::Instant::now();
    let mut options = pgloom::migrate::MigrateOptions::new();
    options.migration_lock_wait(std::time::Duration::from_secs(5));
    loom_harness::runtime()
        .block_on(pgloom::migrate::migrate(
            &CLUSTER.database(db.name()),
            &options,
        ))
        .unwrap_or_else(|e| panic!("migrate beside the owner's ANALYZE: {e}"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    owner.batch_execute("COMMIT").unwrap();
}

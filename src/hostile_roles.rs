//! The hostile-role suite (issue 16), wherever loom is: a role with no
//! grants, a reader and a writer each try every function loom installs,
//! in an open transaction under a hostile `search_path` and, where it
//! returns `trigger`, attached to a table of their own whose
//! `execution_id` is a type they own with an assignment cast that would
//! make them superuser; meanwhile an honest writer's append must finish
//! within its lock timeout. It prints what was tried, by whom, what
//! happened and what was gained, which must be nothing.
//!
//! [`Place::extension`] runs it on the extension (tests/security/security.rs),
//! [`Place::sql_only`] on the SQL-only flavour (tests/install/sql_only.rs).

use std::time::Instant;

use postgres::Client;

use crate::sql_only::{SqlOnlyServer, OWNER};
use crate::{sqlstate, Cluster};

/// Connects to the suite's database as a role (`None`: loom's owner).
type ConnectAs = Box<dyn Fn(Option<&str>) -> Client>;

/// Where the suite runs: a fresh database with loom in it.
pub struct Place {
    /// Connects to the database as a role (`None`: the role loom's
    /// objects belong to, which seeds the data and grants access).
    connect: ConnectAs,
    /// Connects to the database as the superuser, who makes the roles.
    superuser: Box<dyn Fn() -> Client>,
    /// Which of the database's functions are loom's.
    loom_functions: &'static str,
    /// How the victim's snapshot is framed: `zstd` where the server can
    /// (the extension), `none` where only the client can (SQL-only).
    codec: &'static str,
}

impl Place {
    /// The extension, created by the superuser in a fresh database `db`
    /// of `cluster`.
    #[must_use]
    pub fn extension(cluster: Cluster, db: &'static str) -> Place {
        let _ = cluster.fresh_database(db);
        Place {
            connect: Box::new(move |role| match role {
                Some(role) => cluster.connect_as(db, role),
                None => cluster.connect(db),
            }),
            superuser: Box::new(move || cluster.connect(db)),
            loom_functions:
                "JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                 AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
             JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'loom'",
            codec: "zstd",
        }
    }

    /// The SQL-only flavour, installed by the database's owner (not a
    /// superuser) in a fresh database `db` of `server`.
    #[must_use]
    pub fn sql_only(server: &SqlOnlyServer, db: &'static str) -> Place {
        server.fresh_sql_only_database(db);
        let (as_role, as_superuser) = (server.clone(), server.clone());
        Place {
            connect: Box::new(move |role| as_role.connect_as(db, role.unwrap_or(OWNER))),
            superuser: Box::new(move || as_superuser.connect_as(db, "postgres")),
            loom_functions:
                "WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'loom\\_%'
               AND p.proowner = (SELECT datdba FROM pg_database WHERE datname = current_database())",
            codec: "none",
        }
    }
}

/// A value of each argument type loom's functions take, aimed at the
/// victim's execution: a page cursor (`after`) is NULL, the start of the
/// id space, so that a function which pages reaches the victim.
fn argument(type_name: &str, name: &str) -> &'static str {
    if name == "after" && type_name == "text" {
        return "NULL::text";
    }
    match type_name {
        "text" => "'victim'",
        "text[]" => "ARRAY['victim']",
        "bigint" => "1",
        "integer" => "1",
        "jsonb" => "'{}'::jsonb",
        "jsonb[]" => "ARRAY['{}'::jsonb]",
        "bigint[]" => "ARRAY[1]::bigint[]",
        "bytea" => "public.loom_snapshot_frame('[0]'::text, 'none')",
        "regrole" => "current_user::regrole",
        "boolean" => "true",
        "interval" => "'0 seconds'::interval",
        "timestamp with time zone" => "now()",
        "timestamp with time zone[]" => "ARRAY[now()]",
        other => panic!("no hostile argument for type {other}: add one"),
    }
}

/// What loom holds that an attacker must not change (ids in the index and
/// the log, snapshot and ref rows), and whether the attacker became
/// superuser. The honest writer's own rows (sequences from 1000, or
/// `~honest-` ids) are left out.
fn state_of(admin: &mut Client, role: &str) -> String {
    let row = admin
        .query_one(
            "SELECT (SELECT string_agg(execution_id, ',' ORDER BY execution_id) FROM loom.executions
                     WHERE execution_id NOT LIKE '~honest-%'),
                    (SELECT string_agg(execution_id || ':' || sequence, ',' ORDER BY execution_id, sequence)
                     FROM loom.events WHERE execution_id NOT LIKE '~honest-%' AND sequence < 1000),
                    (SELECT count(*) FROM loom.snapshots)::text || ' snapshots, ' ||
                    (SELECT count(*) FROM loom.refs)::text || ' refs',
                    (SELECT rolsuper FROM pg_roles WHERE rolname = $1)",
            &[&role],
        )
        .unwrap();
    let superuser: bool = row.get(3);
    format!(
        "index [{}] log [{}] {}{}",
        row.get::<_, Option<String>>(0).unwrap_or_default(),
        row.get::<_, Option<String>>(1).unwrap_or_default(),
        row.get::<_, String>(2),
        if superuser { " SUPERUSER" } else { "" }
    )
}

/// Whether any of `role`'s planted code has run as another role (its
/// sequence was advanced); it is reset, so that each attempt is judged
/// alone.
fn ran_as_another(superuser: &mut Client, role: &str) -> bool {
    let sequence = format!("{role}_own.ran_as_another");
    let ran: bool = superuser
        .query_one(&format!("SELECT is_called FROM {sequence}"), &[])
        .unwrap()
        .get(0);
    if ran {
        superuser
            .execute("SELECT setval($1::text::regclass, 1, false)", &[&sequence])
            .unwrap();
    }
    ran
}

/// Sets up the database, the three attackers and the honest writer.
fn setup(place: &Place) -> Client {
    let mut admin = (place.connect)(None);
    let mut superuser = (place.superuser)();
    admin
        .batch_execute(&format!(
            r#"SELECT loom_append_events(ARRAY['victim', 'victim', 'other'], ARRAY[1, 2, 1]::bigint[],
                                         ARRAY['s', 's', 's'], ARRAY['{{}}', '{{}}', '{{}}']::jsonb[]);
               SELECT loom_save_snapshot('victim', 'wf', 1, '{{"a":1}}', '{}');
               SELECT loom_put_ref('main', 'victim', 2);"#,
            place.codec
        ))
        .unwrap();
    for (role, access) in [
        ("loom_sec_nobody", None),
        ("loom_sec_reader", Some("reader")),
        ("loom_sec_writer", Some("writer")),
        ("loom_sec_honest", Some("writer")),
    ] {
        superuser
            .batch_execute(&format!(
                "DO $$ BEGIN
                     IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                         EXECUTE 'ALTER ROLE {role} NOSUPERUSER';
                     ELSE
                         EXECUTE 'CREATE ROLE {role} LOGIN';
                     END IF;
                 END $$;
                 DROP SCHEMA IF EXISTS {role}_own CASCADE;
                 CREATE SCHEMA {role}_own AUTHORIZATION {role};"
            ))
            .unwrap();
        if let Some(access) = access {
            admin
                .execute(
                    "SELECT loom_grant_access($1::text::regrole, $2)",
                    &[&role, &access],
                )
                .unwrap();
        }
        if role == "loom_sec_honest" {
            continue;
        }
        // The attacker's own type, whose assignment cast to text would
        // make whoever runs it (a definer: the superuser, or on SQL-only
        // the database's owner) make them one. Whatever of the attacker's
        // code runs as another role first counts itself in a sequence,
        // which no rollback undoes: running as the owner is a gain too,
        // where the definer is not a superuser.
        let mut attacker = (place.connect)(Some(role));
        attacker
            .batch_execute(&format!(
                "SET search_path = {role}_own;
                 GRANT USAGE ON SCHEMA {role}_own TO PUBLIC;
                 CREATE SEQUENCE ran_as_another;
                 GRANT USAGE ON SEQUENCE ran_as_another TO PUBLIC;
                 CREATE FUNCTION as_whom() RETURNS void LANGUAGE plpgsql AS $f$
                 BEGIN
                     IF current_user <> '{role}' THEN
                         PERFORM nextval('{role}_own.ran_as_another');
                     END IF;
                 END $f$;
                 CREATE TYPE evil AS (v text);
                 CREATE FUNCTION evil_text(evil) RETURNS text LANGUAGE plpgsql AS $f$
                 BEGIN
                     PERFORM {role}_own.as_whom();
                     EXECUTE 'ALTER ROLE {role} SUPERUSER';
                     RETURN $1.v;
                 END $f$;
                 CREATE CAST (evil AS text) WITH FUNCTION evil_text(evil) AS ASSIGNMENT;
                 -- Decoys a function with an unpinned search_path would pick up.
                 CREATE TABLE events (execution_id text, sequence bigint);
                 CREATE FUNCTION loom_check_page_size(integer) RETURNS void LANGUAGE sql
                     AS $f$ SELECT {role}_own.as_whom() $f$;"
            ))
            .unwrap();
    }
    admin
}

/// One function the extension installs, as the attacker sees it.
#[derive(Debug)]
struct LoomFunction {
    /// `name(types)`, as `regprocedure` prints it.
    signature: String,
    name: String,
    /// The input arguments' types and names (`""` where unnamed).
    arg_types: Vec<String>,
    arg_names: Vec<String>,
    /// A trigger function, or a procedure (called with CALL).
    trigger: bool,
    procedure: bool,
}

/// The statements an attacker runs for one of loom's functions.
fn attempts(role: &str, function: &LoomFunction) -> String {
    let name = &function.name;
    if function.trigger {
        // Attached where the role can: its own table, of its own type.
        return format!(
            "CREATE TEMP TABLE mine (execution_id {role}_own.evil);
             CREATE TRIGGER t_ins AFTER INSERT ON mine REFERENCING NEW TABLE AS loom_inserted
                 FOR EACH STATEMENT EXECUTE FUNCTION public.{name}();
             CREATE TRIGGER t_trunc AFTER TRUNCATE ON mine FOR EACH STATEMENT EXECUTE FUNCTION public.{name}();
             INSERT INTO mine VALUES (ROW('phantom'));
             TRUNCATE mine;"
        );
    }
    let args: Vec<&str> = function
        .arg_types
        .iter()
        .zip(&function.arg_names)
        .map(|(type_name, name)| argument(type_name, name))
        .collect();
    // A procedure runs its first batch as the attacker, then cannot
    // COMMIT inside the attacker's open transaction (2D000).
    let verb = if function.procedure { "CALL" } else { "SELECT" };
    format!("{verb} public.{name}({})", args.join(", "))
}

/// Runs the suite at `place`.
///
/// # Panics
///
/// When an attacker gained anything, or a trigger function could be
/// attached.
pub fn no_role_gains_anything_through_any_function_loom_installs(place: &Place) {
    let mut admin = setup(place);
    let mut superuser = (place.superuser)();
    // Each function's input arguments: types, and names (from all of its
    // arguments, OUT ones included, where it has them).
    let functions: Vec<LoomFunction> = admin
        .query(
            &format!(
                "SELECT p.oid::regprocedure::text, p.proname::text,
                    ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) t),
                    ARRAY(SELECT coalesce(p.proargnames[a.i], '')
                          FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]))
                               WITH ORDINALITY a(t, i)
                          WHERE coalesce(p.proargmodes[a.i], 'i') IN ('i', 'b', 'v')
                          ORDER BY a.i),
                    p.prorettype = 'trigger'::regtype, p.prokind = 'p'
             FROM pg_proc p
             {}
             ORDER BY 1",
                place.loom_functions
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| LoomFunction {
            signature: r.get(0),
            name: r.get(1),
            arg_types: r.get(2),
            arg_names: r.get(3),
            trigger: r.get(4),
            procedure: r.get(5),
        })
        .collect();
    assert!(functions.len() > 40, "{functions:?}");
    let mut honest = (place.connect)(Some("loom_sec_honest"));
    honest.batch_execute("SET lock_timeout = '2s'").unwrap();
    let mut rows = Vec::new();
    let mut honest_sequence = 0i64;
    for role in ["loom_sec_nobody", "loom_sec_reader", "loom_sec_writer"] {
        let mut attacker = (place.connect)(Some(role));
        for function in &functions {
            let before = state_of(&mut admin, role);
            attacker
                .batch_execute(&format!(
                    "BEGIN; SET LOCAL search_path = {role}_own, public; SET LOCAL statement_timeout = '5s'"
                ))
                .unwrap();
            let outcome = match attacker.batch_execute(&attempts(role, function)) {
                Ok(()) => "ok".to_owned(),
                Err(e) => sqlstate(&e),
            };
            // The attacker's transaction is still open (or failed, holding
            // what it took): an honest append must not wait on it. To the
            // victim itself, but for the writer, which may legitimately
            // hold an execution it deletes from (that is a writer's right):
            // to an id that sorts after every other, so that a batch of one
            // row from the first id on (a NULL cursor) never reaches it.
            honest_sequence += 1;
            let target = if role == "loom_sec_writer" {
                "~honest-victim"
            } else {
                "victim"
            };
            let started = Instant::now();
            let append = honest.execute(
                "SELECT loom_append_event($1, $2, 's', '{}')",
                &[&target, &(999 + honest_sequence)],
            );
            let waited = started.elapsed();
            let committed_outcome = attacker.batch_execute("COMMIT");
            let after = state_of(&mut admin, role);
            let mut gained = Vec::new();
            if let Err(e) = append {
                gained.push(format!("stalled a writer ({})", sqlstate(&e)));
            }
            if after.contains("SUPERUSER") {
                gained.push("superuser".to_owned());
            }
            if ran_as_another(&mut superuser, role) {
                gained.push("its code ran as another role".to_owned());
            }
            // A writer may change what it was granted to; nobody and the
            // reader may change nothing.
            if role != "loom_sec_writer" && after != before {
                gained.push(format!("changed loom: {before} -> {after}"));
            }
            let index_agrees: bool = admin
                .query_one(
                    "SELECT (SELECT array_agg(execution_id ORDER BY execution_id) FROM loom.executions)
                            IS NOT DISTINCT FROM
                            (SELECT array_agg(DISTINCT execution_id ORDER BY execution_id) FROM loom.events)",
                    &[],
                )
                .unwrap()
                .get(0);
            if !index_agrees {
                gained.push("the executions index drifted from the log".to_owned());
            }
            let _ = committed_outcome;
            rows.push((
                role,
                function.signature.clone(),
                outcome,
                waited,
                if gained.is_empty() {
                    "nothing".to_owned()
                } else {
                    gained.join("; ")
                },
            ));
            if !gained.is_empty() {
                // Undo what was gained, so the rest of the table is honest.
                superuser
                    .batch_execute(&format!("ALTER ROLE {role} NOSUPERUSER"))
                    .unwrap();
                admin
                    .batch_execute("SELECT loom_rebuild_executions()")
                    .unwrap();
            }
        }
    }
    println!(
        "\n{:<16} {:<58} {:<8} {:>9}  gained",
        "role", "tried", "outcome", "writer"
    );
    for (role, tried, outcome, waited, gained) in &rows {
        println!(
            "{:<16} {:<58} {:<8} {:>7}ms  {gained}",
            role.trim_start_matches("loom_sec_"),
            tried,
            outcome,
            waited.as_millis()
        );
    }
    let gains: Vec<_> = rows.iter().filter(|r| r.4 != "nothing").collect();
    assert!(gains.is_empty(), "attackers gained something: {gains:#?}");
    // Every trigger function was refused at CREATE TRIGGER (42501) by all.
    for (role, tried, outcome, _, _) in &rows {
        if functions.iter().any(|f| f.trigger && &f.signature == tried) {
            assert_eq!(outcome, "42501", "{role}: {tried}");
        }
    }
}

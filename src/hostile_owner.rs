//! A database owned by a role that is not superuser, and what that owner
//! can plant in it for a superuser to resolve (issue 25, REVIEW.md class 1).
//!
//! On PostgreSQL 15 and later a database's owner owns its `public` schema,
//! where loom's functions live by default, and it may create a schema named
//! after any role. What it plants there runs with the rights of whoever
//! resolves it: an operator or function with the exact argument types of a
//! call site beats a built-in that needs an implicit cast, and a schema
//! named after the superuser comes first in the default `search_path`. The
//! traps planted here try to make their owner superuser and log who ran
//! them; [`HostileDatabase::assert_nothing_gained`] checks that nobody did.
//!
//! The test's own statements go through [`HostileDatabase::superuser`],
//! which searches `pg_catalog` alone, so that only loom's scripts, functions
//! and client can reach a trap.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use postgres::Client;

use crate::{describe, Cluster};

/// A database owned by `owner`, a LOGIN role without SUPERUSER.
pub struct HostileDatabase {
    cluster: Cluster,
    name: String,
    owner: String,
}

impl HostileDatabase {
    /// Creates (again) database `name`, owned by `owner`, a role made here
    /// if it does not exist and put back to NOSUPERUSER if an earlier run
    /// left it otherwise. Tests that share an owner share its fate: give a
    /// test that expects a trap to fire an owner of its own.
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached or a statement fails.
    #[must_use]
    pub fn create(cluster: Cluster, name: &str, owner: &str) -> HostileDatabase {
        // Roles are the cluster's: tests in parallel would update one row of
        // pg_authid at once ("tuple concurrently updated").
        static ROLES: Mutex<()> = Mutex::new(());
        let _roles = ROLES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut admin = pinned(cluster.connect("postgres"));
        // Tests run in parallel: two may create the role at once.
        admin
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {owner} LOGIN; \
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            ))
            .unwrap_or_else(|e| panic!("CREATE ROLE {owner}: {}", describe(&e)));
        for statement in [
            format!("ALTER ROLE {owner} NOSUPERUSER"),
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name} OWNER {owner}"),
        ] {
            admin
                .batch_execute(&statement)
                .unwrap_or_else(|e| panic!("{statement}: {}", describe(&e)));
        }
        let database = HostileDatabase {
            cluster,
            name: name.to_owned(),
            owner: owner.to_owned(),
        };
        database.as_owner(&format!(
            "CREATE TABLE public.loom_trap_log (who name, what text);
             GRANT INSERT, SELECT ON public.loom_trap_log TO PUBLIC;
             CREATE FUNCTION public.loom_trap_fired(what text) RETURNS void
             LANGUAGE plpgsql AS $trap$
             BEGIN
                 INSERT INTO public.loom_trap_log (who, what) VALUES (current_user, what);
                 BEGIN
                     EXECUTE 'ALTER ROLE {owner} SUPERUSER';
                 EXCEPTION WHEN OTHERS THEN NULL;
                 END;
             END
             $trap$;"
        ));
        database
    }

    /// The database's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The connection string of the database, as the superuser.
    #[must_use]
    pub fn conninfo(&self) -> String {
        self.cluster.database(&self.name)
    }

    /// A superuser connection that searches `pg_catalog` alone: what the
    /// test itself runs, out of every trap's reach.
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached.
    #[must_use]
    pub fn superuser(&self) -> Client {
        pinned(self.cluster.connect(&self.name))
    }

    /// Runs `sql` as the owner.
    ///
    /// # Panics
    ///
    /// When a statement fails.
    pub fn as_owner(&self, sql: &str) {
        self.cluster
            .connect_as(&self.name, &self.owner)
            .batch_execute(sql)
            .unwrap_or_else(|e| panic!("as {}: {}", self.owner, describe(&e)));
    }

    /// Plants, as the owner, a trap in `public` for every built-in operator
    /// and function that loom's installed scripts name (every `loom--*.sql`
    /// in the server's extension directory): one with the built-in's exact
    /// argument types, and one for each argument type that converts to the
    /// built-in's implicitly (`oid = regclass` beside `oid = oid`), which
    /// beats the built-in wherever a call site needs that cast. Returns how
    /// many operators and functions it planted.
    ///
    /// # Panics
    ///
    /// When the catalog cannot be read or a plant fails.
    pub fn plant_builtin_shadows(&self) -> (usize, usize) {
        let mut su = self.superuser();
        let script: String = su
            .query_one(
                "SELECT string_agg(pg_read_file(s.dir || '/' || f), E'\\n')
                 FROM (SELECT setting || '/extension' AS dir FROM pg_config WHERE name = 'SHAREDIR') s,
                      pg_ls_dir(s.dir) f
                 WHERE f LIKE 'loom--%.sql'",
                &[],
            )
            .expect("the extension directory is readable")
            .get(0);
        let words: BTreeSet<String> = word_calls(&script);
        let casts = implicit_casts(&mut su);
        let mut statements = Vec::new();

        let operators = su
            .query(
                "SELECT o.oprname::text, o.oprleft::regtype::text, o.oprright::regtype::text,
                        o.oprresult::regtype::text
                 FROM pg_operator o
                 JOIN pg_type l ON l.oid = o.oprleft
                 JOIN pg_type r ON r.oid = o.oprright
                 JOIN pg_type t ON t.oid = o.oprresult
                 WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprkind = 'b'
                   AND l.typtype <> 'p' AND r.typtype <> 'p' AND t.typtype <> 'p'",
                &[],
            )
            .expect("pg_operator");
        let mut planted_operators = BTreeSet::new();
        for row in &operators {
            let (name, left, right, result): (String, String, String, String) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if !script.contains(&format!(" {name} ")) {
                continue;
            }
            for args in variants(&[left, right], &casts) {
                if planted_operators.insert((name.clone(), args.clone())) {
                    let function = format!("public.loom_trap_op_{}", planted_operators.len());
                    let (l, r) = (&args[0], &args[1]);
                    statements.push(trap(
                        &format!("operator {name} ({l}, {r})"),
                        &format!("{function}(l {l}, r {r})"),
                        &result,
                    ));
                    statements.push(format!(
                        "CREATE OPERATOR public.{name} (LEFTARG = {l}, RIGHTARG = {r}, FUNCTION = {function});"
                    ));
                }
            }
        }

        let functions = su
            .query(
                "SELECT p.proname::text, p.proargtypes::oid[]::regtype[]::text[], p.prorettype::regtype::text,
                        p.proretset
                 FROM pg_proc p JOIN pg_type t ON t.oid = p.prorettype
                 WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f'
                   AND p.provariadic = 0 AND p.pronargs BETWEEN 1 AND 4
                   AND (t.typtype <> 'p' OR p.prorettype = 'void'::regtype)
                   AND p.prorettype <> 'record'::regtype
                   AND NOT EXISTS (SELECT 1 FROM unnest(p.proargtypes) a(t)
                                   JOIN pg_type at ON at.oid = a.t WHERE at.typtype = 'p')",
                &[],
            )
            .expect("pg_proc");
        let mut planted_functions = BTreeSet::new();
        for row in &functions {
            let (name, args, result, set): (String, Vec<String>, String, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if !words.contains(&name) {
                continue;
            }
            for args in variants(&args, &casts) {
                if planted_functions.insert((name.clone(), args.clone())) {
                    statements.push(trap_function("public", &name, &args, &result, set));
                }
            }
        }
        self.as_owner(&statements.join("\n"));
        (planted_operators.len(), planted_functions.len())
    }

    /// Plants, as the owner, a trap for every function of loom's as it is
    /// installed now: one with its exact signature in a schema named after
    /// `superuser` (first in the default search_path, `"$user", public`),
    /// and, in `public` beside loom's own, one for each argument type that
    /// converts to loom's implicitly. Run it again after an upgrade adds
    /// functions. Returns how many it planted.
    ///
    /// # Panics
    ///
    /// When the catalog cannot be read or a plant fails.
    pub fn plant_loom_shadows(&self, superuser: &str) -> usize {
        let mut su = self.superuser();
        let casts = implicit_casts(&mut su);
        let loom = su
            .query(
                "SELECT p.proname::text, p.proargtypes::oid[]::regtype[]::text[], p.prorettype::regtype::text,
                        p.proretset, p.prokind = 'p'
                 FROM pg_proc p
                 JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                 JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'loom'
                 WHERE p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)",
                &[],
            )
            .expect("loom's functions");
        let mut planted: BTreeSet<(String, String, Vec<String>)> = su
            .query(
                "SELECT p.pronamespace::regnamespace::text, p.proname::text,
                        p.proargtypes::oid[]::regtype[]::text[]
                 FROM pg_proc p
                 WHERE p.pronamespace IN ('public'::regnamespace, to_regnamespace($1)::oid)",
                &[&superuser],
            )
            .expect("what is there")
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        let mut statements = vec![format!(
            "CREATE SCHEMA IF NOT EXISTS {superuser}; GRANT USAGE ON SCHEMA {superuser} TO PUBLIC;"
        )];
        let mut count = 0;
        for row in &loom {
            let (name, args, result, set, procedure): (String, Vec<String>, String, bool, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            let result = if procedure {
                PROCEDURE.to_owned()
            } else {
                result
            };
            // A record result is planted as text (what a caller would see
            // first); trigger functions cannot be called, and are left out.
            let result = if result == "record" {
                "text".to_owned()
            } else {
                result
            };
            // Also text in each place: what an untyped literal (NULL, 'x')
            // passed there resolves to first.
            let mut all = variants(&args, &casts);
            all.extend((0..args.len()).filter(|&i| args[i] != "text").map(|i| {
                let mut variant = args.clone();
                variant[i] = "text".to_owned();
                variant
            }));
            for (i, variant) in all.into_iter().enumerate() {
                let schema = if i == 0 { superuser } else { "public" };
                if !planted.insert((schema.to_owned(), name.clone(), variant.clone())) {
                    continue;
                }
                statements.push(trap_function(schema, &name, &variant, &result, set));
                count += 1;
            }
        }
        self.as_owner(&statements.join("\n"));
        count
    }

    /// Plants, as the owner, a trap for each shape in which a caller may
    /// call one of loom's routines with other arguments than its own: with
    /// fewer (the defaulted ones left out: the shorter signature, in the
    /// schema named after `superuser`, which `"$user"` searches first, and
    /// in `public`, beside loom's, with `text` in each place), and a
    /// variadic one with its array spread (one to four `text`s, or the
    /// element type, in `public`). So a statement that leaves an argument
    /// to a default, to an untyped literal or to a spread `VARIADIC` meets
    /// a trap, or an ambiguity. Run [`HostileDatabase::plant_loom_shadows`]
    /// too for the full signatures. Returns how many it planted.
    ///
    /// # Panics
    ///
    /// When the catalog cannot be read or a plant fails.
    pub fn plant_call_shape_shadows(&self, superuser: &str) -> usize {
        let mut su = self.superuser();
        let loom = su
            .query(
                "SELECT p.proname::text, p.proargtypes::oid[]::regtype[]::text[], p.prorettype::regtype::text,
                        p.proretset, p.prokind = 'p', p.pronargdefaults::int4,
                        CASE WHEN p.provariadic <> 0 THEN p.provariadic::regtype::text END
                 FROM pg_proc p
                 JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                 JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'loom'
                 WHERE p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)",
                &[],
            )
            .expect("loom's functions");
        let mut planted: BTreeSet<(String, String, Vec<String>)> = su
            .query(
                "SELECT p.pronamespace::regnamespace::text, p.proname::text,
                        p.proargtypes::oid[]::regtype[]::text[]
                 FROM pg_proc p
                 WHERE p.pronamespace IN ('public'::regnamespace, to_regnamespace($1)::oid)",
                &[&superuser],
            )
            .expect("what is there")
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        let mut statements = vec![format!(
            "CREATE SCHEMA IF NOT EXISTS {superuser}; GRANT USAGE ON SCHEMA {superuser} TO PUBLIC;"
        )];
        for row in &loom {
            let (name, args, result, set, procedure, defaults, variadic): (
                String,
                Vec<String>,
                String,
                bool,
                bool,
                i32,
                Option<String>,
            ) = (
                row.get(0),
                row.get(1),
                row.get(2),
                row.get(3),
                row.get(4),
                row.get(5),
                row.get(6),
            );
            let result = match (procedure, result.as_str()) {
                (true, _) => PROCEDURE.to_owned(),
                (false, "record") => "text".to_owned(),
                _ => result,
            };
            let mut shapes: Vec<(&str, Vec<String>)> = Vec::new();
            let required = args.len() - usize::try_from(defaults).unwrap_or(0);
            for arity in required..args.len() {
                let shorter = args[..arity].to_vec();
                shapes.push((superuser, shorter.clone()));
                shapes.push(("public", shorter.clone()));
                for i in 0..arity {
                    let mut variant = shorter.clone();
                    variant[i] = "text".to_owned();
                    shapes.push(("public", variant));
                }
            }
            if let Some(element) = variadic {
                let fixed = &args[..args.len() - 1];
                for spread in 1..=4 {
                    for each in ["text".to_owned(), element.clone()] {
                        let mut variant = fixed.to_vec();
                        variant.extend(std::iter::repeat_n(each, spread));
                        shapes.push(("public", variant));
                    }
                }
            }
            for (schema, variant) in shapes {
                if planted.insert((schema.to_owned(), name.clone(), variant.clone())) {
                    statements.push(trap_function(schema, &name, &variant, &result, set));
                }
            }
        }
        let count = statements.len() - 1;
        self.as_owner(&statements.join("\n"));
        count
    }

    /// Fails unless the owner is still not superuser and no trap ran.
    ///
    /// # Panics
    ///
    /// When something was gained, naming what ran.
    pub fn assert_nothing_gained(&self, after: &str) {
        let fired = self.fired();
        let superuser: bool = self
            .superuser()
            .query_one(
                "SELECT rolsuper FROM pg_roles WHERE rolname = $1",
                &[&self.owner],
            )
            .expect("the owner")
            .get(0);
        assert!(
            fired.is_empty() && !superuser,
            "after {after}: the owner {} is superuser: {superuser}; traps that ran: {fired:?}",
            self.owner
        );
    }

    /// What the traps logged: who ran which.
    ///
    /// # Panics
    ///
    /// When the log cannot be read.
    #[must_use]
    pub fn fired(&self) -> Vec<String> {
        self.superuser()
            .query(
                "SELECT who || ' ran ' || what FROM public.loom_trap_log",
                &[],
            )
            .expect("the trap log")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }
}

/// `client`, searching `pg_catalog` alone from now on.
fn pinned(mut client: Client) -> Client {
    client
        .batch_execute("SET search_path = pg_catalog, pg_temp")
        .expect("SET search_path");
    client
}

/// Every word followed by `(` in `script`: the functions it may call.
fn word_calls(script: &str) -> BTreeSet<String> {
    let bytes = script.as_bytes();
    let mut words = BTreeSet::new();
    let mut start = None;
    for (i, &b) in bytes.iter().enumerate() {
        let word_byte = b.is_ascii_alphanumeric() || b == b'_';
        match (start, word_byte) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                let rest = script[i..].trim_start();
                if rest.starts_with('(') {
                    words.insert(script[s..i].to_ascii_lowercase());
                }
                start = None;
            }
            _ => {}
        }
    }
    words
}

/// Each type's implicit-cast sources (not pseudo-types), by type name.
fn implicit_casts(su: &mut Client) -> BTreeMap<String, Vec<String>> {
    let mut casts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in su
        .query(
            "SELECT c.casttarget::regtype::text, c.castsource::regtype::text
             FROM pg_cast c JOIN pg_type s ON s.oid = c.castsource
             WHERE c.castcontext = 'i' AND s.typtype <> 'p'",
            &[],
        )
        .expect("pg_cast")
    {
        casts.entry(row.get(0)).or_default().push(row.get(1));
    }
    casts
}

/// `args` itself first, then `args` with one argument replaced by each
/// type that converts to it implicitly.
fn variants(args: &[String], casts: &BTreeMap<String, Vec<String>>) -> Vec<Vec<String>> {
    let mut out = vec![args.to_vec()];
    for (i, arg) in args.iter().enumerate() {
        for source in casts.get(arg).into_iter().flatten() {
            let mut variant = args.to_vec();
            variant[i].clone_from(source);
            out.push(variant);
        }
    }
    out
}

/// What [`trap_function`] takes as the result of a procedure.
const PROCEDURE: &str = "procedure";

/// A trap function `schema."name"(args)` returning NULL (or no rows) of
/// `result`, or a trap procedure for [`PROCEDURE`] (`CALL` resolves only
/// procedures).
fn trap_function(schema: &str, name: &str, args: &[String], result: &str, set: bool) -> String {
    let params = args
        .iter()
        .enumerate()
        .map(|(i, t)| format!("a{i} {t}"))
        .collect::<Vec<_>>()
        .join(", ");
    let what = format!("{schema}.{name}({})", args.join(", "));
    if result == PROCEDURE {
        return format!(
            "CREATE PROCEDURE {schema}.\"{name}\"({params}) LANGUAGE plpgsql AS $trap$
             BEGIN PERFORM public.loom_trap_fired('{}'); END $trap$;",
            what.replace('\'', "''")
        );
    }
    let result = if set {
        format!("SETOF {result}")
    } else {
        result.to_owned()
    };
    trap(&what, &format!("{schema}.\"{name}\"({params})"), &result)
}

/// `CREATE FUNCTION signature`: a trap that logs that `what` ran, and as
/// whom, tries to make its owner superuser (`public.loom_trap_fired`), then
/// returns nothing or NULL, as `result` (`void`, `SETOF …`, `TABLE(…)` or a
/// type) allows.
#[must_use]
pub fn trap(what: &str, signature: &str, result: &str) -> String {
    let what = what.replace('\'', "''");
    let ret = if result == "void" || result.starts_with("SETOF") || result.starts_with("TABLE") {
        "RETURN;"
    } else {
        "RETURN NULL;"
    };
    format!(
        "CREATE FUNCTION {signature} RETURNS {result} LANGUAGE plpgsql AS $trap$
         BEGIN PERFORM public.loom_trap_fired('{what}'); {ret} END $trap$;"
    )
}

//! loom's SQL API from its one source, `loom-core/sql/`, in the two flavours
//! built from it (docs/flavours.md):
//!
//! - **native**: the extension (`CREATE EXTENSION loom`). pgrx compiles
//!   the same files into its script, each portable part followed by its
//!   native replacement (`sql/native/`): C for the write path, the frame
//!   decoders and the order, and the superuser's event trigger.
//! - **SQL-only**: the portable parts alone, SQL and PL/pgSQL, for a
//!   server that cannot load `loom.so` (managed PostgreSQL). A database's
//!   owner installs it with `psql -f` ([`sql_only_install_script`], written
//!   by `make sql-only`) or `loom migrate --sql-only`.
//!
//! Every function's contract (name, arguments, defaults, result,
//! attributes) is written once, in its portable definition; a native
//! replacement is a `CREATE OR REPLACE` that PostgreSQL refuses if it
//! changed the result or the parameter names, and the flavour test
//! (`tests/install/sql_only.rs`) compares the two catalogs whole.
//!
//! ```
//! let script = pgloom_core::sql::sql_only_install_script("public");
//! assert!(script.contains("CREATE TABLE loom.events"));
//! assert!(!script.contains("MODULE_PATHNAME")); // nothing native
//! assert!(!script.contains("@extschema@"));
//! ```

/// The SQL API's version: the extension's `default_version`, and the
/// SQL-only flavour's version as `loom.sql_only` records it. The crates
/// have versions of their own (docs/client.md#versions); the extension's
/// build refuses to compile unless its package version is this one.
pub const VERSION: &str = "0.16.0";

/// Where a part names the schema of loom's functions: the extension's
/// schema, which `CREATE EXTENSION` (and pg_tle) substitute, and which the
/// SQL-only scripts write in.
pub const SCHEMA_PLACEHOLDER: &str = "@extschema@";

/// Which flavours run a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// SQL and PL/pgSQL: both flavours run it (`sql/<name>.sql`).
    Portable,
    /// Only the extension runs it (`sql/native/<name>.sql`): C that
    /// replaces the portable bodies before it (`CREATE OR REPLACE ...
    /// LANGUAGE c`), or what only a superuser may create (an event trigger).
    Native,
}

/// One file of loom's SQL, named as pgrx names the part in the extension's
/// script.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    /// The part's name: its file's, `native_` first for a native part
    /// (pgrx's `name =`, which must be an identifier).
    pub name: &'static str,
    /// The flavours that run it.
    pub kind: Kind,
    /// Its file, relative to `loom-core/sql/`.
    pub file: &'static str,
    /// Its SQL, with [`SCHEMA_PLACEHOLDER`] for the functions' schema.
    pub sql: &'static str,
}

macro_rules! part {
    (portable $name:literal) => {
        Part {
            name: $name,
            kind: Kind::Portable,
            file: concat!($name, ".sql"),
            sql: include_str!(concat!("../sql/", $name, ".sql")),
        }
    };
    (native $name:literal) => {
        Part {
            name: concat!("native_", $name),
            kind: Kind::Native,
            file: concat!("native/", $name, ".sql"),
            sql: include_str!(concat!("../sql/native/", $name, ".sql")),
        }
    };
}

/// loom's SQL in the order it installs: the one list of it. The SQL-only
/// flavour runs the portable parts ([`portable_parts`]); the extension runs
/// all of them, each native part right after the portable one it replaces
/// bodies of. The extension's pgrx chain (`loom_pg/src/parts.rs`) is
/// generated from this list, and a test fails when it is not.
///
/// ```
/// use pgloom_core::sql::{Kind, PARTS};
/// assert_eq!(PARTS[0].name, "bootstrap");
/// let frames = PARTS.iter().position(|p| p.name == "frames").unwrap();
/// assert_eq!(PARTS[frames + 1].name, "native_frames");
/// assert_eq!(PARTS[frames + 1].kind, Kind::Native);
/// ```
pub const PARTS: &[Part] = &[
    part!(portable "bootstrap"),
    part!(portable "order"),
    part!(native "order"),
    part!(portable "tables"),
    part!(native "schema_names"),
    part!(portable "log_api"),
    part!(native "write_path"),
    part!(portable "collation_migration"),
    part!(portable "frames"),
    part!(native "frames"),
    part!(portable "snapshot_api"),
    part!(portable "distribute"),
    part!(portable "provision"),
    part!(portable "claims"),
    part!(portable "feed"),
    part!(portable "retention"),
    part!(portable "executions_check"),
    part!(portable "status"),
    part!(portable "privileges"),
];

/// The parts of a `kind`, in [`PARTS`]' order.
pub fn parts_of(kind: Kind) -> impl Iterator<Item = &'static Part> {
    PARTS.iter().filter(move |part| part.kind == kind)
}

/// The portable parts, in order: the SQL-only flavour whole.
pub fn portable_parts() -> impl Iterator<Item = &'static Part> {
    parts_of(Kind::Portable)
}

mod step;
pub use step::{freeze, render_step, StepError, StepFlavour};

/// The SQL-only flavour's script body for [`VERSION`]: the portable parts,
/// in order, with [`SCHEMA_PLACEHOLDER`] left in. It has no transaction
/// control and no psql meta-command, so it is also what
/// `pgtle.install_extension` would register unchanged (pg_tle substitutes
/// the placeholder as `CREATE EXTENSION` does).
#[must_use]
pub fn sql_only_body() -> String {
    let mut body = String::new();
    for part in portable_parts() {
        body.push_str("\n-- ");
        body.push_str(part.name);
        body.push('\n');
        body.push_str(part.sql);
    }
    body
}

/// The whole script that installs the SQL-only flavour, version
/// [`VERSION`], with loom's functions in `schema`: one transaction around
/// [`sql_only_install_statements`]. It runs as the database's owner, with
/// `psql -v ON_ERROR_STOP=1 -f loom.sql`; an error rolls all of it back.
///
/// `make sql-only` writes it, for schema `public`, to
/// `target/sql-only/loom.sql`.
#[must_use]
pub fn sql_only_install_script(schema: &str) -> String {
    format!(
        "-- loom {VERSION}, the SQL-only flavour (docs/flavours.md): loom's tables and SQL API\n\
         -- in SQL and PL/pgSQL, for a server that cannot load loom.so. Generated from\n\
         -- loom-core/sql by `make sql-only`; install it as the database's owner:\n\
         --   psql -v ON_ERROR_STOP=1 -d <database> -f loom.sql\n\
         BEGIN;\n{}COMMIT;\n",
        sql_only_install_statements(schema)
    )
}

/// The statements that install the SQL-only flavour, version [`VERSION`],
/// with loom's functions in `schema`, for the caller's transaction (what
/// `loom migrate --sql-only` runs, holding the migration lock): they
/// refuse a database that has loom in either flavour, run
/// [`sql_only_body`], and record the version in `loom.sql_only`.
#[must_use]
pub fn sql_only_install_statements(schema: &str) -> String {
    let literal = |text: &str| format!("'{}'", text.replace('\'', "''"));
    let record = include_str!("../sql/sql_only/record_version.sql")
        .replace("'@version@'", &literal(VERSION))
        .replace("'@schema_name@'", &literal(schema));
    // The schema as an identifier in a literal: a regnamespace's input.
    let begin = include_str!("../sql/sql_only/install_begin.sql")
        .replace("'@schema_oid@'", &literal(&quote_ident(schema)));
    format!(
        "{begin}{body}\n-- sql_only\n{record}",
        body = sql_only_body().replace(SCHEMA_PLACEHOLDER, &quote_ident(schema)),
    )
}

/// The first version released in the SQL-only flavour.
pub const FIRST_SQL_ONLY_VERSION: &str = "0.12.0";

/// The SQL-only flavour's versions, oldest first: [`FIRST_SQL_ONLY_VERSION`]
/// and the end of each of [`STEPS`].
///
/// ```
/// let versions: Vec<_> = pgloom_core::sql::sql_only_versions().collect();
/// assert_eq!(versions[0], "0.12.0");
/// assert_eq!(versions.last(), Some(&pgloom_core::sql::VERSION));
/// ```
pub fn sql_only_versions() -> impl Iterator<Item = &'static str> {
    std::iter::once(FIRST_SQL_ONLY_VERSION).chain(STEPS.iter().map(|(_, to, _)| *to))
}

/// Every upgrade step from [`FIRST_SQL_ONLY_VERSION`] on (`sql/steps/A--B.sql`,
/// rendered for the extension as `loom--A--B.sql`), written once for both
/// flavours and rendered for each ([`render_step`]: what only one flavour
/// runs is in a marked block), so the SQL-only flavour's update chain is
/// derived from the same file, not kept as a twin. `(from, to, sql)`, oldest first. The older steps, from
/// before the SQL-only flavour, are in the repository's `sql/`.
pub const STEPS: &[(&str, &str, &str)] = &[
    (
        "0.12.0",
        "0.13.0",
        include_str!("../sql/steps/0.12.0--0.13.0.sql"),
    ),
    (
        "0.13.0",
        "0.14.0",
        include_str!("../sql/steps/0.13.0--0.14.0.sql"),
    ),
    (
        "0.14.0",
        "0.15.0",
        include_str!("../sql/steps/0.14.0--0.15.0.sql"),
    ),
    (
        "0.15.0",
        "0.16.0",
        include_str!("../sql/steps/0.15.0--0.16.0.sql"),
    ),
];

/// The statements that update a SQL-only database, whose functions are in
/// `schema`, from version `from` to [`VERSION`], step by step (each one of
/// [`STEPS`], less its psql line, then its version recorded in
/// `loom.sql_only`); empty when `from` is [`VERSION`]. `None` for a
/// version that was never a SQL-only release (or a newer one: nothing here
/// goes back). The schema is written as [`sql_only_install_statements`]
/// writes it, so an update leaves the bodies a fresh install has.
///
/// ```
/// let update = pgloom_core::sql::sql_only_update_statements("0.12.0", "public").unwrap();
/// assert!(update.contains("\"public\".loom_delete_idle_executions"));
/// assert!(update.ends_with(&format!("SET version = '{}', updated_at = pg_catalog.now();\n", pgloom_core::sql::VERSION)));
/// ```
#[must_use]
pub fn sql_only_update_statements(from: &str, schema: &str) -> Option<String> {
    let start = sql_only_versions().position(|v| v == from)?;
    let schema = quote_ident(schema);
    let mut statements = String::new();
    for (_, to, sql) in &STEPS[start..] {
        // Every step renders (a unit test renders each).
        let rendered = render_step(sql, StepFlavour::SqlOnly).ok()?;
        for line in rendered.lines().filter(|line| !line.starts_with('\\')) {
            statements.push_str(&line.replace(SCHEMA_PLACEHOLDER, &schema));
            statements.push('\n');
        }
        statements.push_str(&format!(
            "UPDATE loom.sql_only SET version = '{to}', updated_at = pg_catalog.now();\n"
        ));
    }
    Some(statements)
}

/// The names of the functions and procedures the portable parts create
/// in the functions' schema ([`SCHEMA_PLACEHOLDER`]): what a SQL-only
/// install has there, and what a move to the extension moves out of it
/// (into `loom_before_extension`, beside the old tables).
#[must_use]
pub fn routine_names() -> Vec<String> {
    let mut names: Vec<String> = portable_parts()
        .flat_map(|part| {
            ["FUNCTION ", "PROCEDURE "].into_iter().flat_map(|kind| {
                part.sql
                    .split(&format!("CREATE {kind}{SCHEMA_PLACEHOLDER}."))
                    .skip(1)
                    .filter_map(|rest| rest.split_once('(').map(|(name, _)| name.to_owned()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `name` as an SQL identifier, always double-quoted: right for every
/// name, keywords included.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_only_script_has_nothing_native() {
        let script = sql_only_install_script("public");
        for native in [
            "MODULE_PATHNAME",
            "LANGUAGE c",
            "EVENT TRIGGER",
            "@extschema@",
        ] {
            assert!(!script.contains(native), "{native} in the SQL-only script");
        }
        assert!(script.contains(&format!("VALUES ('{VERSION}', 'public')")));
        let versions: Vec<&str> = sql_only_versions().collect();
        assert_eq!(versions.last(), Some(&VERSION));
        for (i, (from, to, sql)) in STEPS.iter().enumerate() {
            // Each step starts where the one before ended.
            assert_eq!((*from, *to), (versions[i], versions[i + 1]));
            let portable = render_step(sql, StepFlavour::SqlOnly)
                .unwrap_or_else(|e| panic!("step {from} -> {to}: {e}"));
            for native in ["MODULE_PATHNAME", "LANGUAGE c", "EVENT TRIGGER"] {
                assert!(
                    !portable.contains(native),
                    "{native} in step {from} -> {to}, outside a native block"
                );
            }
            render_step(sql, StepFlavour::Extension)
                .unwrap_or_else(|e| panic!("step {from} -> {to}: {e}"));
            // Only the step into VERSION may rerun the current parts.
            assert!(
                *to == VERSION || !sql.contains("\n-- @rerun "),
                "step {from} -> {to} reruns parts that have moved on: freeze it"
            );
        }
        let update = sql_only_update_statements(FIRST_SQL_ONLY_VERSION, "public").unwrap();
        assert!(update.contains("loom_lock_executions_for_delete"));
        assert!(!update.contains("loom_refuse_drops"));
        assert_eq!(
            sql_only_update_statements(VERSION, "public").as_deref(),
            Some("")
        );
        assert_eq!(sql_only_update_statements("0.11.0", "public"), None);
        let first = FIRST_SQL_ONLY_VERSION;
        for (given, written) in [
            ("public", "\"public\""),
            ("Odd\"s", "\"Odd\"\"s\""),
            ("x\".loom_evil(); --", "\"x\"\".loom_evil(); --\""),
        ] {
            let update = sql_only_update_statements(first, given).unwrap();
            assert!(
                update.contains(&format!("{written}.loom_delete_idle_executions(")),
                "{given}"
            );
        }
        assert!(script.starts_with("-- loom "));
        assert!(script.trim_end().ends_with("COMMIT;"));
    }

    /// A file in `sql/` or `sql/native/` that PARTS does not list would
    /// never be installed by either flavour.
    #[test]
    fn every_sql_file_is_a_part() {
        for (dir, prefix) in [("sql", ""), ("sql/native", "native/")] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
            for entry in std::fs::read_dir(&path).expect("loom-core's sql/") {
                let name = entry.expect("a directory entry").file_name();
                let name = name.to_string_lossy();
                if name.ends_with(".sql") {
                    let file = format!("{prefix}{name}");
                    assert!(
                        PARTS.iter().any(|part| part.file == file),
                        "{file} is in no part: add it to PARTS"
                    );
                }
            }
        }
    }

    #[test]
    fn a_native_part_replaces_functions_or_adds_the_event_trigger() {
        for part in parts_of(Kind::Native) {
            let creates = part.sql.contains("CREATE FUNCTION") || part.sql.contains("CREATE TABLE");
            assert!(
                !creates || part.sql.contains("CREATE EVENT TRIGGER"),
                "{} creates objects the SQL-only flavour lacks",
                part.name
            );
        }
    }

    /// What `pgtle.install_extension` would refuse or could not run: no
    /// transaction control, no psql meta-command, nothing only a
    /// superuser may create, no `MODULE_PATHNAME`; `@extschema@` left for
    /// it to substitute.
    #[test]
    fn the_body_is_what_pg_tle_would_register_unchanged() {
        let body = sql_only_body();
        // Top-level statements start their line (bodies are indented: a
        // procedure's COMMIT is its own).
        for line in body.lines() {
            let statement = line.to_ascii_uppercase();
            for refused in ["BEGIN;", "COMMIT;", "ROLLBACK;", "START TRANSACTION", "\\"] {
                assert!(!statement.starts_with(refused), "{line}");
            }
        }
        for refused in [
            "EVENT TRIGGER",
            "MODULE_PATHNAME",
            "LANGUAGE c\n",
            "$_pgtle_",
        ] {
            assert!(!body.contains(refused), "{refused}");
        }
        assert!(body.contains(SCHEMA_PLACEHOLDER));
    }

    #[test]
    fn the_routines_are_loom_s_and_all_there() {
        let names = routine_names();
        assert!(names.len() > 60, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("loom_")), "{names:?}");
        for expected in [
            "loom_append_event",
            "loom_sweep_idle_executions",
            "loom_status",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected}");
        }
    }

    #[test]
    fn odd_schema_names_are_quoted() {
        assert_eq!(quote_ident("public"), "\"public\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        let script = sql_only_install_script("o'hara");
        assert!(script.contains("'o''hara')"));
    }
}

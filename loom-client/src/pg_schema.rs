//! Naming loom's objects so that no statement the client sends resolves a
//! name through the session's `search_path` (issue 25).
//!
//! The default `search_path` is `"$user", public`, and a database's owner
//! controls both: on PostgreSQL 15+ it owns `public` (where loom's
//! functions live by default), and it may create a schema named after a
//! superuser, which comes first. There it can put a function or operator
//! whose exact argument types beat what the statement meant (`oid =
//! regclass` and `bigint * interval` need an implicit cast to reach the
//! built-in; an unqualified `loom_status()` finds the `"$user"` schema's
//! first), or `ALTER DATABASE … SET search_path = public, pg_catalog`,
//! after which even exact shadows of built-in operators and types win. Any
//! of these, resolved in a superuser's session (`migrate()`, a store, the
//! `loom` CLI), runs that owner's code as superuser. So every statement is
//! a template that names everything it uses:
//!
//! - loom's functions as `@extschema@.loom_…(…)` (the extension scripts'
//!   own placeholder): [`LoomSchema::sql`] puts in the schema the catalog
//!   says the extension is in, read by a query that is itself fully
//!   qualified. Each argument is cast to the parameter's declared type, so
//!   loom's function matches exactly and no overload created beside it in
//!   that schema can win;
//! - a loom function is only named once the catalog says the installed
//!   extension has it (`pg_depend`): on a version that predates it, a
//!   function of that name and signature in loom's schema is someone
//!   else's, so the call fails with [`Error::ExtensionMissing`] instead.
//!   Where loom is the SQL-only flavour (docs/flavours.md), its functions
//!   are the database owner's, found through `loom.sql_only`; a session
//!   whose role may do more than that owner calls none of them
//!   ([`Error::SqlOnlyOwnedByAnother`]);
//! - loom's tables as `loom.…`, the schema the extension owns;
//! - built-in functions, catalogs and types as `pg_catalog.…`, operators
//!   as `OPERATOR(pg_catalog.=)`. Keyword syntax (`CASE`, `EXISTS`,
//!   `extract(… FROM …)`, which the grammar turns into
//!   `pg_catalog.extract`) resolves nothing.
//!
//! Utility statements (`BEGIN`, `SET LOCAL`, `SHOW`, `CREATE EXTENSION`,
//! `ALTER EXTENSION`) name no function, operator or type, and stay as they
//! are. Each module's tests hold its templates to these rules with
//! `assert_resolves_nothing`, which checks every call of a loom function
//! against the signatures in `loom_pg`'s SQL.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::flavour::Flavour;
use crate::pg_row::column;
use crate::{Error, Result};

/// Where a template names the extension's schema.
const PLACEHOLDER: &str = pgloom_core::sql::SCHEMA_PLACEHOLDER;

/// How long a store keeps believing the extension is older than a version
/// it asks about before it reads the catalog again.
const REREAD_OLDER_AFTER: Duration = Duration::from_secs(10);

/// The extension's schema, quoted, and the names of its functions: the
/// rows of `pg_depend` that make a function a member of `loom` (only the
/// extension's owner, a superuser, can add one).
const READ: &str = "SELECT pg_catalog.quote_ident(n.nspname), e.extversion,
        ARRAY(SELECT p.proname::pg_catalog.text FROM pg_catalog.pg_depend d
              JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
              WHERE d.refobjid OPERATOR(pg_catalog.=) e.oid
                AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.deptype OPERATOR(pg_catalog.=) 'e'),
        n.nspname::pg_catalog.text
     FROM pg_catalog.pg_extension e
     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'loom'";

/// Who owns loom's SQL-only flavour, when no extension is installed: the
/// owner of `loom.sql_only` (the version table of a `psql -f` or
/// `migrate()` install), trusted only when it also owns schema loom and
/// owns the database (only the database's owner may install it: another
/// role able to create a schema named loom could fake the table, never
/// that). Its functions are those this owner has in the schema the table
/// names, as an extension's are those the superuser made its members.
/// Also: whether this session must not call them, because it may do
/// what the owner may not and is not the owner: a role that is, or is a
/// member of, a superuser, a role with CREATEROLE, BYPASSRLS or
/// REPLICATION, or a predefined `pg_*` role (reading or writing all data,
/// server files or programs, signalling backends), which on a managed
/// service is what its administrators are; or a session whose current
/// role is not its session role (`SET ROLE`, or a `role` setting the owner
/// put on the database): code of the owner's could `SET ROLE NONE` back.
/// Refused by default, then, and allowed to the owner and to roles with
/// none of that, such as the ones `loom_grant_access` serves.
const SQL_ONLY_OWNER: &str = "SELECT pg_catalog.pg_get_userbyid(t.relowner)::pg_catalog.text, t.relowner,
        SESSION_USER OPERATOR(pg_catalog.<>) CURRENT_USER
        OR (t.relowner OPERATOR(pg_catalog.<>) me.oid
            AND EXISTS (SELECT FROM pg_catalog.pg_roles r
                        WHERE pg_catalog.pg_has_role(me.oid, r.oid, 'MEMBER')
                          AND (r.rolsuper OR r.rolcreaterole OR r.rolbypassrls OR r.rolreplication
                               OR r.rolname OPERATOR(pg_catalog.~~) 'pg\\_%')))
     FROM pg_catalog.pg_class t
     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.relnamespace
     JOIN pg_catalog.pg_roles me ON me.rolname OPERATOR(pg_catalog.=) CURRENT_USER
     WHERE n.nspname OPERATOR(pg_catalog.=) 'loom' AND t.relname OPERATOR(pg_catalog.=) 'sql_only'
       AND t.relkind OPERATOR(pg_catalog.=) 'r' AND n.nspowner OPERATOR(pg_catalog.=) t.relowner
       AND t.relowner OPERATOR(pg_catalog.=) (SELECT d.datdba FROM pg_catalog.pg_database d
                                              WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())";

/// The SQL-only flavour's schema, version and functions, from the row
/// `loom.sql_only` holds; `$1` its owner.
const READ_SQL_ONLY: &str = "SELECT pg_catalog.quote_ident(v.function_schema), v.version,
        ARRAY(SELECT p.proname::pg_catalog.text FROM pg_catalog.pg_proc p
              JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
              WHERE n.nspname OPERATOR(pg_catalog.=) v.function_schema
                AND p.proowner OPERATOR(pg_catalog.=) $1::pg_catalog.oid),
        v.function_schema::pg_catalog.text
     FROM loom.sql_only v";

/// The installed `loom` extension as the catalog describes it.
#[derive(Debug)]
pub(crate) struct LoomSchema {
    /// The schema as an identifier (`quote_ident`), ready for SQL text.
    quoted: String,
    /// The schema's name, as the catalog has it.
    name: String,
    /// The installed version.
    version: String,
    /// Which flavour: the extension, or the SQL-only flavour.
    flavour: Flavour,
    /// The extension's functions, by name (loom overloads none).
    functions: HashSet<String>,
    /// When the catalog said so.
    read_at: Instant,
}

impl LoomSchema {
    /// Reads where the extension is and what it has; `None` when it is not
    /// installed.
    ///
    /// # Errors
    ///
    /// [`Error::IncompatibleExtension`] for a version this client does not
    /// work with ([`crate::compat`]); what the server raises.
    ///
    /// The extension when there is one, else loom's SQL-only flavour
    /// ([`SQL_ONLY_OWNER`] says which install is trusted).
    pub(crate) async fn read(client: &Client) -> Result<Option<LoomSchema>> {
        let (row, flavour) = match client.query_typed_opt(READ, &[]).await? {
            Some(row) => (row, Flavour::Extension),
            None => {
                let Some(found) = client.query_typed_opt(SQL_ONLY_OWNER, &[]).await? else {
                    return Ok(None);
                };
                if column::<bool>(&found, 2)? {
                    return Err(Error::SqlOnlyOwnedByAnother {
                        owner: column(&found, 0)?,
                    });
                }
                let owner: u32 = column(&found, 1)?;
                let Some(row) = client
                    .query_typed_opt(READ_SQL_ONLY, &[(&owner, Type::OID)])
                    .await?
                else {
                    return Ok(None);
                };
                (row, Flavour::SqlOnly)
            }
        };
        let version: String = column(&row, 1)?;
        crate::versions::check(&version)?;
        Ok(Some(LoomSchema {
            quoted: column(&row, 0)?,
            name: column(&row, 3)?,
            version,
            flavour,
            functions: column::<Vec<String>>(&row, 2)?.into_iter().collect(),
            read_at: Instant::now(),
        }))
    }

    /// Which flavour of loom the database has.
    pub(crate) fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// The installed version.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// The schema, as an identifier.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// The schema's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether the installed version has the function `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.functions.contains(name)
    }

    /// `template` with the schema in place of each `@extschema@`.
    ///
    /// # Errors
    ///
    /// [`Error::ExtensionMissing`] when the installed version lacks a
    /// function the template calls.
    pub(crate) fn sql(&self, template: &str) -> Result<String> {
        match called(template).find(|name| !self.has(name)) {
            Some(missing) => Err(missing_function(missing)),
            None => Ok(template.replace(PLACEHOLDER, &self.quoted)),
        }
    }
}

/// The loom functions `template` calls, by name.
fn called(template: &str) -> impl Iterator<Item = &str> {
    template.split(PLACEHOLDER).skip(1).map(|rest| {
        let name = rest.strip_prefix('.').unwrap_or(rest);
        let end = name
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(name.len());
        &name[..end]
    })
}

fn missing_function(name: &str) -> Error {
    Error::ExtensionMissing {
        function: name.to_owned(),
    }
}

/// A store's [`LoomSchema`], read from the catalog at its first statement
/// that calls a loom function (store constructors take no connection), and
/// again when a template calls a function it did not have: a peer's
/// `migrate()` may have updated the extension since.
#[derive(Debug, Clone, Default)]
pub(crate) struct SchemaCell(Arc<Mutex<Option<Arc<LoomSchema>>>>);

impl SchemaCell {
    /// A cell that has read nothing yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn cached(&self) -> Option<Arc<LoomSchema>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the catalog now (refusing an extension version this client
    /// does not work with), for the next statements.
    ///
    /// # Errors
    ///
    /// [`Error::IncompatibleExtension`]; what the server raises.
    pub(crate) async fn read(&self, client: &Client) -> Result<()> {
        self.reread(client).await.map(drop)
    }

    /// The catalog's answer now, kept for the next statements.
    async fn reread(&self, client: &Client) -> Result<Option<Arc<LoomSchema>>> {
        let schema = LoomSchema::read(client).await?.map(Arc::new);
        if let Some(schema) = &schema {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(schema));
        }
        Ok(schema)
    }

    /// `template` ready to send on `client`'s connection ([`LoomSchema::sql`]);
    /// a template that calls no loom function reads nothing.
    ///
    /// # Errors
    ///
    /// [`Error::ExtensionMissing`] when the extension is not installed or
    /// lacks a function the template calls; what the server raises.
    pub(crate) async fn sql(&self, client: &Client, template: &str) -> Result<String> {
        let Some(first) = called(template).next() else {
            return Ok(template.to_owned());
        };
        if let Some(Ok(sql)) = self.cached().map(|schema| schema.sql(template)) {
            return Ok(sql);
        }
        match self.reread(client).await? {
            Some(schema) => schema.sql(template),
            None => Err(missing_function(first)),
        }
    }

    /// Whether the installed extension is `version` or later, as cached: what
    /// picks between a statement's forms for what a version added. A cache
    /// older than the catalog picks the form that works on both, never a
    /// wrong one; one that says "older" is read again once it is
    /// [`REREAD_OLDER_AFTER`] old, so a store picks the newer form soon
    /// after a peer's update.
    ///
    /// # Errors
    ///
    /// What the server raises.
    pub(crate) async fn at_least(&self, client: &Client, version: &str) -> Result<bool> {
        let newer = |schema: &LoomSchema| crate::versions::at_least(schema.version(), version);
        let schema = match self.cached() {
            Some(schema) if newer(&schema) || schema.read_at.elapsed() < REREAD_OLDER_AFTER => {
                Some(schema)
            }
            _ => self.reread(client).await?,
        };
        Ok(schema.is_some_and(|schema| newer(&schema)))
    }

    /// Refuses `feature` unless the installed extension is `version` or
    /// later, reading the catalog again before refusing (a peer's
    /// `migrate()` may have updated it since).
    ///
    /// # Errors
    ///
    /// [`Error::ExtensionTooOld`], [`Error::ExtensionMissing`] when it is not
    /// installed; what the server raises.
    pub(crate) async fn require(
        &self,
        client: &Client,
        feature: &'static str,
        version: &'static str,
        function: &str,
    ) -> Result<()> {
        if self
            .cached()
            .is_some_and(|schema| crate::versions::at_least(schema.version(), version))
        {
            return Ok(());
        }
        match self.reread(client).await? {
            Some(schema) if crate::versions::at_least(schema.version(), version) => Ok(()),
            Some(schema) => Err(Error::ExtensionTooOld {
                feature,
                needs: version,
                installed: schema.version().to_owned(),
            }),
            None => Err(missing_function(function)),
        }
    }

    /// Whether the installed extension has the function `name` (false when
    /// it is not installed), read again from the catalog while it has not.
    ///
    /// # Errors
    ///
    /// What the server raises.
    pub(crate) async fn has(&self, client: &Client, name: &str) -> Result<bool> {
        if self.cached().is_some_and(|schema| schema.has(name)) {
            return Ok(true);
        }
        Ok(self
            .reread(client)
            .await?
            .is_some_and(|schema| schema.has(name)))
    }
}

/// Asserts that `template` resolves nothing through the `search_path`: every
/// cast to a `pg_catalog` type, every function and relation qualified, every
/// operator `OPERATOR(pg_catalog.…)`, and every call of a loom function with
/// each argument cast to its declared type (read from `loom_pg`'s SQL).
#[cfg(test)]
pub(crate) fn assert_resolves_nothing(template: &str) {
    lint::check(template).unwrap_or_else(|problem| panic!("{problem}:\n{template}"));
}

#[cfg(test)]
mod lint {
    use std::collections::HashMap;

    use super::PLACEHOLDER;

    /// Where loom declares the functions the client calls: every
    /// portable part (a native replacement restates the same signature).
    fn declared() -> impl Iterator<Item = &'static str> {
        pgloom_core::sql::portable_parts().map(|part| part.sql)
    }

    /// Keyword syntax that looks like a call and resolves nothing.
    const KEYWORDS: [&str; 8] = [
        "OPERATOR", "EXISTS", "ARRAY", "ANY", "VALUES", "IN", "extract", "coalesce",
    ];

    /// Each loom function's overloads: their input parameter types, as the
    /// casts name them, and how many of them have no default (a call may
    /// leave the rest out).
    fn signatures() -> HashMap<String, Vec<(Vec<String>, usize)>> {
        let mut found = HashMap::new();
        for source in declared() {
            for declaration in source.split("FUNCTION @extschema@.").skip(1) {
                let (name, rest) = declaration.split_once('(').expect("a parameter list");
                let params = &rest[..rest.find(')').expect("a closing parenthesis")];
                let inputs: Vec<&str> = params
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty() && !p.starts_with("OUT "))
                    .collect();
                let required = inputs.iter().filter(|p| !p.contains(" DEFAULT ")).count();
                let types = inputs
                    .iter()
                    .map(|p| {
                        let p = p.split(" DEFAULT ").next().unwrap_or(p);
                        let p = p.strip_prefix("VARIADIC ").unwrap_or(p);
                        qualified(p.split_whitespace().last().expect("a type"))
                    })
                    .collect();
                // The CREATE comes first; a COMMENT ON names the types
                // alone, without their defaults, so an overload's types
                // seen once are kept as first seen.
                let overloads: &mut Vec<(Vec<String>, usize)> =
                    found.entry(name.to_owned()).or_default();
                if !overloads.iter().any(|(known, _)| *known == types) {
                    overloads.push((types, required));
                }
            }
        }
        found
    }

    /// A declared type as a cast names it.
    fn qualified(declared: &str) -> String {
        let (base, array) = match declared.strip_suffix("[]") {
            Some(base) => (base, "[]"),
            None => (declared, ""),
        };
        let base = match base {
            "bigint" => "int8",
            "integer" => "int4",
            "boolean" => "bool",
            other => other,
        };
        format!("pg_catalog.{base}{array}")
    }

    /// `sql` with each string literal and quoted identifier emptied.
    fn without_literals(sql: &str) -> String {
        let mut out = String::with_capacity(sql.len());
        let mut quote = None;
        for c in sql.chars() {
            match quote {
                Some(q) if c == q => {
                    quote = None;
                    out.push(c);
                }
                Some(_) => {}
                None => {
                    if c == '\'' || c == '"' {
                        quote = Some(c);
                    }
                    out.push(c);
                }
            }
        }
        out
    }

    fn is_word(c: char) -> bool {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '$')
    }

    pub(super) fn check(template: &str) -> Result<(), String> {
        let sql = without_literals(template);
        for (at, _) in sql.match_indices("::") {
            if !sql[at + 2..].starts_with("pg_catalog.") {
                return Err(format!("a cast to an unqualified type at byte {at}"));
            }
        }
        let signatures = signatures();
        for (at, _) in sql.match_indices('(') {
            let start = sql[..at].rfind(|c| !is_word(c)).map_or(0, |i| i + 1);
            let name = &sql[start..at];
            if name.is_empty() || KEYWORDS.contains(&name) || name.starts_with("pg_catalog.") {
                continue;
            }
            let Some(function) = name.strip_prefix("@extschema@.") else {
                return Err(format!("an unqualified call of {name}"));
            };
            let overloads = signatures
                .get(function)
                .ok_or_else(|| format!("{function} is not declared in loom_pg"))?;
            let arguments = arguments(&sql[at + 1..]);
            // The one overload the call's arity picks, every argument cast
            // to its declared type.
            let (declared, _) = overloads
                .iter()
                .find(|(declared, required)| {
                    (*required..=declared.len()).contains(&arguments.len())
                })
                .ok_or_else(|| {
                    format!(
                        "{function} has no overload of {} arguments",
                        arguments.len()
                    )
                })?;
            for (argument, declared) in arguments.iter().zip(declared) {
                if !argument.ends_with(&format!("::{declared}")) {
                    return Err(format!("{function}: {argument} is not cast to {declared}"));
                }
            }
        }
        let mut rest = without_assignments(&sql.split_whitespace().collect::<Vec<_>>().join(" "))
            .replace("SELECT *", "SELECT");
        while let Some(at) = rest.find("OPERATOR(pg_catalog.") {
            let end = at + rest[at..].find(')').ok_or("an unclosed OPERATOR(")?;
            rest.replace_range(at..=end, " ");
        }
        let rest = rest.replace("::", " ").replace(PLACEHOLDER, "x");
        if let Some(operator) = rest.find(|c| "=<>*+-/|!~%^&#?@`".contains(c)) {
            return Err(format!("a bare operator at {:?}", &rest[operator..]));
        }
        let words: Vec<&str> = rest
            .split(|c: char| c.is_whitespace() || c == ',' || c == ')')
            .filter(|w| !w.is_empty())
            .collect();
        // A WITH query's name binds before any relation: no search_path
        // reaches it.
        let with_queries: Vec<&str> = words
            .windows(3)
            .filter(|w| matches!(w[0], "WITH" | "(") || w[0].ends_with(')'))
            .filter(|w| w[2] == "AS" || w[2] == "AS(")
            .map(|w| w[1])
            .collect();
        for pair in words.windows(3) {
            let (before, keyword, relation) = (pair[0], pair[1], pair[2]);
            if matches!(keyword, "FROM" | "JOIN" | "INTO")
                && !before.ends_with("epoch")
                && !relation.starts_with('(')
                && relation != "ROWS"
                && !with_queries.contains(&relation)
                && !["loom.", "pg_catalog.", "x."]
                    .iter()
                    .any(|schema| relation.starts_with(schema))
            {
                return Err(format!("an unqualified relation {relation}"));
            }
        }
        Ok(())
    }

    /// `sql` (whitespace collapsed) with the `=` of each assignment in an
    /// upsert's `DO UPDATE SET` taken out: a column, not an operator.
    fn without_assignments(sql: &str) -> String {
        let Some((head, set)) = sql.split_once("DO UPDATE SET ") else {
            return sql.to_owned();
        };
        let (set, tail) = set.split_once(" RETURNING ").unwrap_or((set, ""));
        let set: Vec<String> = set
            .split(", ")
            .map(|assignment| assignment.replacen(" = ", " ", 1))
            .collect();
        format!("{head}DO UPDATE SET {} RETURNING {tail}", set.join(", "))
    }

    /// The top-level arguments of a call, from just after its `(`.
    fn arguments(after: &str) -> Vec<&str> {
        let (mut depth, mut start, mut found) = (0usize, 0, Vec::new());
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    if !after[start..i].trim().is_empty() {
                        found.push(after[start..i].trim());
                    }
                    return found;
                }
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    found.push(after[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(functions: &[&str]) -> LoomSchema {
        LoomSchema {
            quoted: "\"My Schema\"".to_owned(),
            name: "My Schema".to_owned(),
            version: pgloom_core::sql::VERSION.to_owned(),
            flavour: Flavour::Extension,
            functions: functions.iter().map(|f| (*f).to_owned()).collect(),
            read_at: Instant::now(),
        }
    }

    #[test]
    fn names_the_schema_once_quoted_and_only_functions_the_extension_has() {
        let sql = schema(&["loom_status"])
            .sql("SELECT item FROM @extschema@.loom_status()")
            .unwrap();
        assert_eq!(sql, "SELECT item FROM \"My Schema\".loom_status()");
        let missing = schema(&["loom_status"])
            .sql("SELECT @extschema@.loom_rebuild_executions()")
            .unwrap_err();
        assert!(
            matches!(&missing, Error::ExtensionMissing { function } if function == "loom_rebuild_executions"),
            "{missing:?}"
        );
        assert_eq!(
            called("SELECT @extschema@.a_1($1::pg_catalog.text), @extschema@.b()")
                .collect::<Vec<_>>(),
            ["a_1", "b"]
        );
    }

    #[test]
    fn the_catalog_query_resolves_nothing() {
        assert_resolves_nothing(READ);
    }

    #[test]
    fn the_lint_refuses_what_a_search_path_resolves() {
        for (bad, why) in [
            ("SELECT loom_status()", "unqualified call"),
            ("SELECT $1::text", "cast to an unqualified type"),
            ("SELECT 1 WHERE a = b", "bare operator"),
            (
                "SELECT $1::pg_catalog.int8 * interval '1 s'",
                "bare operator",
            ),
            ("SELECT max(x) FROM loom.t", "unqualified call"),
            ("SELECT 1 FROM pg_class", "unqualified relation"),
            (
                "WITH t AS (SELECT 1 FROM loom.refs) SELECT 1 FROM t JOIN pg_class ON true",
                "unqualified relation pg_class",
            ),
            (
                "SELECT @extschema@.loom_read_events($1::pg_catalog.text, $2, $3::pg_catalog.int4)",
                "not cast",
            ),
            (
                "SELECT @extschema@.loom_prune_events($1::pg_catalog.text, $2::pg_catalog.int8)",
                "not cast",
            ),
            (
                "SELECT @extschema@.loom_status($1::pg_catalog.text)",
                "no overload of 1 arguments",
            ),
            // Of two overloads, the one of the call's arity, cast for it.
            (
                "SELECT @extschema@.loom_snapshot_state_text($1::pg_catalog.bytea, $2::pg_catalog.text)",
                "not cast to pg_catalog.bytea",
            ),
        ] {
            let problem = lint::check(bad).expect_err(bad);
            assert!(problem.contains(why), "{bad}: {problem}");
        }
        assert_resolves_nothing(
            "SELECT @extschema@.loom_prune_events($1::pg_catalog.text, $2::pg_catalog.int4), 'a = b'",
        );
        assert_resolves_nothing(
            "SELECT @extschema@.loom_snapshot_state_text($1::pg_catalog.bytea, $2::pg_catalog.bytea)",
        );
    }
}

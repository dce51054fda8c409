//! The servers of loom's SQL-only flavour (docs/flavours.md): PostgreSQL 15
//! and 18 builds with no `loom.so` and no `loom.control`, as on a managed
//! service, where a database's owner that is not a superuser installs loom
//! with `psql -f`. The Makefile starts them (`make clusters.sql-only`) and
//! exports `LOOM_PG_SQL_ONLY` (their connection strings, `;`-separated) and
//! `LOOM_SQL_ONLY_SCRIPT` (`target/sql-only/loom.sql`, from `make sql-only`).

use std::process::Command;

use postgres::{Client, NoTls};

use crate::{describe, pg_bin};

/// One server without loom's library.
#[derive(Debug, Clone)]
pub struct SqlOnlyServer {
    conninfo: String,
}

/// The SQL-only servers the Makefile started.
///
/// # Panics
///
/// When `LOOM_PG_SQL_ONLY` is not set: run through `make test` (or
/// `make test.sql-only`).
#[must_use]
pub fn servers() -> Vec<SqlOnlyServer> {
    let value = std::env::var("LOOM_PG_SQL_ONLY")
        .expect("LOOM_PG_SQL_ONLY is not set: run through `make test.sql-only`");
    value
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|conninfo| SqlOnlyServer {
            conninfo: conninfo.to_owned(),
        })
        .collect()
}

/// The SQL-only install script `make sql-only` wrote.
///
/// # Panics
///
/// When `LOOM_SQL_ONLY_SCRIPT` is not set or names no file.
#[must_use]
pub fn script_path() -> String {
    let path = std::env::var("LOOM_SQL_ONLY_SCRIPT")
        .expect("LOOM_SQL_ONLY_SCRIPT is not set: run through `make test.sql-only`");
    assert!(
        std::path::Path::new(&path).is_file(),
        "{path}: no such file (make sql-only)"
    );
    path
}

/// The role that owns each test database, as a managed service's
/// "master user" does: it may create roles and databases, and is not a
/// superuser.
pub const OWNER: &str = "loom_sqlonly_owner";

impl SqlOnlyServer {
    /// A server that has `loom.so` too (one of the Makefile's clusters),
    /// for what runs on both: the SQL-only flavour installed where the
    /// extension could be, and the move from one to the other.
    #[must_use]
    pub fn with_library(conninfo: &str) -> SqlOnlyServer {
        SqlOnlyServer {
            conninfo: conninfo.to_owned(),
        }
    }

    /// The server's connection string (as the superuser `postgres`).
    #[must_use]
    pub fn conninfo(&self) -> &str {
        &self.conninfo
    }

    /// The connection string of database `dbname` as `role`.
    #[must_use]
    pub fn database_as(&self, dbname: &str, role: &str) -> String {
        format!("{} dbname={dbname} user={role}", self.conninfo)
    }

    /// Connects to `dbname` as `role`.
    ///
    /// # Panics
    ///
    /// When the server refuses.
    #[must_use]
    pub fn connect_as(&self, dbname: &str, role: &str) -> Client {
        let conninfo = self.database_as(dbname, role);
        Client::connect(&conninfo, NoTls).unwrap_or_else(|e| panic!("{conninfo}: {e}"))
    }

    /// The server's major version.
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    #[must_use]
    pub fn major(&self) -> i32 {
        let mut client = self.connect_as("postgres", "postgres");
        let num: String = client
            .query_one("SHOW server_version_num", &[])
            .expect("SHOW server_version_num")
            .get(0);
        num.parse::<i32>().expect("a number") / 10000
    }

    /// A new, empty database `name` (dropped first if a run left it),
    /// created by [`OWNER`] (made here if missing: `LOGIN CREATEROLE
    /// CREATEDB`, not superuser), without loom.
    ///
    /// # Panics
    ///
    /// When the server refuses.
    pub fn fresh_database(&self, name: &str) {
        let mut admin = self.connect_as("postgres", "postgres");
        // Tests run at once: a second CREATE ROLE of the same name fails
        // (duplicate, or a concurrent catalog update), and the role is
        // there either way.
        if let Err(e) = admin.batch_execute(&format!(
            "CREATE ROLE {OWNER} LOGIN CREATEROLE CREATEDB NOSUPERUSER"
        )) {
            let exists: bool = admin
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)",
                    &[&OWNER],
                )
                .expect("pg_roles")
                .get(0);
            assert!(exists, "CREATE ROLE {OWNER}: {}", describe(&e));
        }
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap_or_else(|e| panic!("{name}: {}", describe(&e)));
        self.connect_as("postgres", OWNER)
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} as {OWNER}: {}", describe(&e)));
    }

    /// Runs `psql -X -v ON_ERROR_STOP=1 -f <script>` on `dbname` as
    /// `role`: the install the README shows. Its exit status and output.
    #[must_use]
    pub fn psql_file(&self, dbname: &str, role: &str, script: &str) -> (bool, String) {
        let out = Command::new(format!("{}/psql", pg_bin()))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", script])
            .arg(self.database_as(dbname, role))
            .output()
            .expect("psql runs");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// [`SqlOnlyServer::fresh_database`], then loom installed in it by
    /// [`OWNER`] with `psql -f` ([`script_path`]).
    ///
    /// # Panics
    ///
    /// When the install fails.
    pub fn fresh_sql_only_database(&self, name: &str) {
        self.fresh_database(name);
        let (ok, output) = self.psql_file(name, OWNER, &script_path());
        assert!(ok, "psql -f loom.sql as {OWNER} on {name}: {output}");
    }
}

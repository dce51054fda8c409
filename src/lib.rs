//! The harness behind loom's integration tests, benchmarks and demo: how to
//! reach the PostgreSQL clusters the Makefile starts, and a fresh database
//! with the extension in it.
//!
//! Not published. The clusters are found through environment variables the
//! Makefile exports (`LOOM_PG_C`, `LOOM_PG_ICU`: libpq-style connection
//! strings), so `make test`, `make demo` and `make bench` are the way in.

use std::fmt;

use postgres::{Client, NoTls};

/// One of the Makefile's clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cluster {
    /// UTF8 with libc `C.UTF-8`: the database order is code point order.
    C,
    /// UTF8 with ICU `en-US` as the default collation: the non-C order
    /// (`a_b` before `A1`) in which ADR 0108's paging bugs show.
    Icu,
}

impl Cluster {
    /// Both clusters, for tests that must hold under either collation.
    pub const ALL: [Cluster; 2] = [Cluster::C, Cluster::Icu];

    fn env_var(self) -> &'static str {
        match self {
            Cluster::C => "LOOM_PG_C",
            Cluster::Icu => "LOOM_PG_ICU",
        }
    }

    /// The cluster's connection string.
    ///
    /// # Panics
    ///
    /// When the Makefile did not export it: these tests need real clusters,
    /// started by `make test` (or `make clusters`).
    #[must_use]
    pub fn conninfo(self) -> String {
        std::env::var(self.env_var()).unwrap_or_else(|_| {
            panic!(
                "{} is not set: run through `make test` (or `make clusters` and export it)",
                self.env_var()
            )
        })
    }

    /// Connects to database `dbname`.
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached.
    #[must_use]
    pub fn connect(self, dbname: &str) -> Client {
        let conninfo = format!("{} dbname={dbname}", self.conninfo());
        Client::connect(&conninfo, NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the {self} cluster ({conninfo}): {e}"))
    }

    /// A new, empty database `name` (dropped first if a previous run left
    /// it), with `CREATE EXTENSION loom` run in it, and a client to it.
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached or the extension is not installed.
    #[must_use]
    pub fn fresh_database(self, name: &str) -> Client {
        let mut client = self.fresh_database_without_loom(name, "");
        client
            .batch_execute("CREATE EXTENSION loom")
            .unwrap_or_else(|e| {
                panic!(
                    "CREATE EXTENSION loom (installed? `make install`): {}",
                    describe(&e)
                )
            });
        client
    }

    /// A new, empty database `name` created `WITH {options}`, without loom.
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached or the database not created.
    #[must_use]
    pub fn fresh_database_without_loom(self, name: &str, options: &str) -> Client {
        let mut admin = self.connect("postgres");
        // Two statements: a multi-statement string is one transaction block,
        // where neither may run.
        for statement in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name} {options}"),
        ] {
            admin
                .batch_execute(&statement)
                .unwrap_or_else(|e| panic!("{statement}: {}", describe(&e)));
        }
        self.connect(name)
    }
}

/// An error with the server's SQLSTATE and message, which `Display` of
/// `postgres::Error` leaves out ("db error").
#[must_use]
pub fn describe(err: &postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => err.to_string(),
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cluster::C => "C",
            Cluster::Icu => "ICU en-US",
        })
    }
}

//! The harness behind loom's integration tests, benchmarks and demo: how to
//! reach the PostgreSQL clusters the Makefile starts, and a fresh database
//! with the extension in it.
//!
//! Not published. The clusters are found through environment variables the
//! Makefile exports (`LOOM_PG_C`, `LOOM_PG_ICU`: libpq-style connection
//! strings), so `make test`, `make demo` and `make bench` are the way in.

pub mod bench_support;
pub mod citus;
pub mod cli;
pub mod cluster_control;
pub mod hostile_owner;
pub mod hostile_roles;
pub mod scratch_server;
pub mod sql_only;

use std::fmt;
use std::process::Command;
use std::sync::{Arc, Mutex};

use postgres::{Client, Config, NoTls};

/// The advisory key loom's migrations took until 0.14.0: 0x6C6F6F6D,
/// "loom" in ASCII (`pg_advisory_xact_lock(1819242349)`). Any role can hold
/// it; the tests hold it to show that it stalls nothing any more.
pub const MIGRATION_LOCK_KEY: i64 = 0x6C6F_6F6D;

/// The port of the scratch server `name` of a single test, from the
/// Makefile's port table (`make ports`), which exports it as
/// `LOOM_PORT_<name>`.
///
/// # Panics
///
/// When the variable is unset or not a port: run the test through `make`.
#[must_use]
pub fn scratch_port(name: &str) -> u16 {
    let var = format!("LOOM_PORT_{name}");
    std::env::var(&var)
        .ok()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("{var} is not a port: run the test through make (`make ports`)"))
}

/// The extension version this tree builds (`loom_pg/Cargo.toml`): what a
/// fresh install and every upgrade end at.
pub const LOOM_VERSION: &str = "0.16.0";

/// Every released version before [`LOOM_VERSION`], oldest first: each has
/// an upgrade path from it to the current, and installs (`CREATE EXTENSION
/// loom VERSION ...`) from 0.1.0's full script, the one `sql/` keeps, and
/// the steps after it ([`create_extension_at`]).
pub const RELEASED_VERSIONS: [&str; 15] = [
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0", "0.10.0",
    "0.11.0", "0.12.0", "0.13.0", "0.14.0", "0.15.0",
];

/// Where the programs of the server under test are (`pg_ctl`, `pg_dump`):
/// `LOOM_PG_BIN`, which the Makefile sets to its `pg_config --bindir`, or
/// Debian's PostgreSQL 15.
#[must_use]
pub fn pg_bin() -> String {
    std::env::var("LOOM_PG_BIN")
        .ok()
        .filter(|dir| !dir.is_empty())
        .unwrap_or_else(|| "/usr/lib/postgresql/15/bin".to_owned())
}

/// One of the Makefile's clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cluster {
    /// UTF8 with libc `C.UTF-8`: the database order is code point order.
    C,
    /// UTF8 with `en-US` as the default collation (ICU, or libc
    /// `en_US.UTF-8` on a server built without ICU): the non-C order
    /// (`a_b` before `A1`) in which ADR 0108's paging bugs show.
    Icu,
    /// One of three more ICU en-US servers (0, 1, 2): the shards.
    Shard(usize),
    /// The Citus coordinator (ICU en-US), in front of two workers.
    Citus,
    /// One of the two Citus workers (0, 1).
    CitusWorker(usize),
    /// C.UTF-8 with pg_cron preloaded (`cron.database_name` `postgres`):
    /// scheduled retention. Only where pg_cron is packaged for the server
    /// under test (Debian's 15): see [`Cluster::cron_available`].
    Cron,
}

impl Cluster {
    /// Both clusters, for tests that must hold under either collation.
    pub const ALL: [Cluster; 2] = [Cluster::C, Cluster::Icu];

    /// The three shard servers.
    pub const SHARDS: [Cluster; 3] = [Cluster::Shard(0), Cluster::Shard(1), Cluster::Shard(2)];

    /// The two Citus workers.
    pub const CITUS_WORKERS: [Cluster; 2] = [Cluster::CitusWorker(0), Cluster::CitusWorker(1)];

    fn env_var(self) -> &'static str {
        match self {
            Cluster::C => "LOOM_PG_C",
            Cluster::Icu => "LOOM_PG_ICU",
            Cluster::Shard(_) => "LOOM_PG_SHARDS",
            Cluster::Citus => "LOOM_PG_CITUS",
            Cluster::CitusWorker(_) => "LOOM_PG_CITUS_WORKERS",
            Cluster::Cron => "LOOM_PG_CRON",
        }
    }

    /// Whether the Makefile started the pg_cron cluster for the server
    /// under test; when not, prints, loudly, that `test` is skipped.
    #[must_use]
    pub fn cron_available(test: &str) -> bool {
        let available = std::env::var("LOOM_PG_CRON").is_ok_and(|v| !v.is_empty());
        if !available {
            eprintln!(
                "\n*** SKIPPED {test}: no pg_cron cluster for this server (the Makefile starts one where pg_cron is packaged: Debian's PostgreSQL 15).\n"
            );
        }
        available
    }

    /// The cluster's connection string.
    ///
    /// # Panics
    ///
    /// When the Makefile did not export it: these tests need real clusters,
    /// started by `make test` (or `make clusters`).
    #[must_use]
    pub fn conninfo(self) -> String {
        let value = std::env::var(self.env_var()).unwrap_or_else(|_| {
            panic!(
                "{} is not set: run through `make test` (or `make clusters` and export it)",
                self.env_var()
            )
        });
        match self {
            // One connection string per server, ';'-separated.
            Cluster::Shard(i) | Cluster::CitusWorker(i) => value
                .split(';')
                .nth(i)
                .unwrap_or_else(|| panic!("{} has no server {i}", self.env_var()))
                .to_owned(),
            _ => value,
        }
    }

    /// The connection string of database `dbname` on this cluster.
    #[must_use]
    pub fn database(self, dbname: &str) -> String {
        format!("{} dbname={dbname}", self.conninfo())
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

    /// Connects to database `dbname` as `role` (a role the test made, with
    /// or without grants).
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached or refuses the role.
    #[must_use]
    pub fn connect_as(self, dbname: &str, role: &str) -> Client {
        let conninfo = format!("{} dbname={dbname} user={role}", self.conninfo());
        Client::connect(&conninfo, NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the {self} cluster ({conninfo}): {e}"))
    }

    /// A client to database `dbname` that collects the server's WARNINGs
    /// and NOTICEs (as "SQLSTATE: message HINT: hint" lines).
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached.
    #[must_use]
    pub fn connect_collecting_warnings(self, dbname: &str) -> (Client, Arc<Mutex<Vec<String>>>) {
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&warnings);
        let mut config: Config = format!("{} dbname={dbname}", self.conninfo())
            .parse()
            .expect("a valid connection string");
        config.notice_callback(move |notice| {
            sink.lock().unwrap().push(format!(
                "{}: {} HINT: {}",
                notice.code().code(),
                notice.message(),
                notice.hint().unwrap_or("")
            ));
        });
        let client = config
            .connect(NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the {self} cluster: {e}"));
        (client, warnings)
    }

    /// A new, empty database `name` with loom at `version` (an older one),
    /// as that release installed it: see [`create_extension_at`].
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached or the version is not installed.
    #[must_use]
    pub fn fresh_database_at(self, name: &str, version: &str) -> Client {
        let mut client = self.fresh_database_without_loom(name, "");
        let create = create_extension_at(version);
        client
            .batch_execute(&create)
            .unwrap_or_else(|e| panic!("{create}: {}", describe(&e)));
        client
    }

    /// `pg_dump --schema-only --binary-upgrade` of database `dbname`: the
    /// only pg_dump mode that writes out an extension's member objects
    /// (tables, functions, views), less the lines that carry OIDs.
    ///
    /// # Panics
    ///
    /// When pg_dump fails.
    #[must_use]
    pub fn schema_dump(self, dbname: &str) -> String {
        let out = Command::new(format!("{}/pg_dump", pg_bin()))
            .args(["--schema-only", "--binary-upgrade", "--dbname"])
            .arg(format!("{} dbname={dbname}", self.conninfo()))
            .output()
            .expect("pg_dump runs");
        assert!(
            out.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("a UTF-8 dump")
            .lines()
            .filter(|line| !is_dump_noise(line))
            .collect::<Vec<_>>()
            .join("\n")
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

    /// Holds a `mode` lock (`ACCESS SHARE`, …) on `loom.{table}` in
    /// database `dbname`, from its own connection in a transaction left
    /// open: until the returned client commits, rolls back or is dropped.
    /// What a long query or a stuck session does to a migration.
    ///
    /// # Panics
    ///
    /// When the cluster cannot be reached or the lock not taken.
    #[must_use]
    pub fn hold_lock(self, dbname: &str, table: &str, mode: &str) -> Client {
        let mut holder = self.connect(dbname);
        holder
            .batch_execute(&format!("BEGIN; LOCK TABLE loom.{table} IN {mode} MODE"))
            .unwrap_or_else(|e| panic!("LOCK TABLE loom.{table} IN {mode} MODE: {}", describe(&e)));
        holder
    }
}

/// Every execution id `loom_list_executions()` pages first (up to 1000),
/// in its order.
///
/// # Panics
///
/// When the query fails.
#[must_use]
pub fn listed_executions(client: &mut Client) -> Vec<String> {
    client
        .query("SELECT * FROM loom_list_executions()", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The SQLSTATE of `err`, or its text when the server sent none.
#[must_use]
pub fn sqlstate(err: &postgres::Error) -> String {
    err.code()
        .map_or_else(|| describe(err), |c| c.code().to_owned())
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

/// Lines of a binary-upgrade dump that differ between two databases of one
/// schema: OIDs, frozen xids, pg_dump 15.x's random `\restrict` keys,
/// comments and blank lines.
fn is_dump_noise(line: &str) -> bool {
    let line = line.trim();
    line.is_empty()
        || line.starts_with("--")
        || line.starts_with("\\restrict")
        || line.starts_with("\\unrestrict")
        || line.contains("binary_upgrade")
        || line.starts_with("UPDATE pg_catalog.pg_class")
        || line.starts_with("SET relfrozenxid")
        || line.starts_with("WHERE oid =")
        // A sequence's position is data, not schema.
        || line.starts_with("SELECT pg_catalog.setval(")
}

/// A version as numbers, so that 0.10.0 comes after 0.3.0.
///
/// # Panics
///
/// When `version` is not three dot-separated numbers.
#[must_use]
pub fn version_key(version: &str) -> Vec<u32> {
    version
        .split('.')
        .map(|part| part.parse().expect("a released version is numeric"))
        .collect()
}

/// The SQL that installs loom at an older `version` as that release did.
///
/// `sql/` keeps only 0.1.0's full script: PostgreSQL reaches any later
/// version from it through the upgrade steps. Those steps never add the
/// snapshot frame column (ADR 0141 D5, D9), but every release from 0.3.0 on
/// provisioned it at install, so this provisions it too.
#[must_use]
pub fn create_extension_at(version: &str) -> String {
    let mut sql = format!("CREATE EXTENSION loom VERSION '{version}'");
    if version_key(version) >= version_key("0.3.0") {
        sql.push_str("; SELECT loom_ensure_snapshot_zstd()");
    }
    sql
}

/// A mixed-case execution id with '-' and '_' (`"a_0000042-3f1"`), whose
/// en-US order differs from code point order: the shape of ADR 0108's bug,
/// for loading millions of them.
#[must_use]
pub fn mixed_case_id(i: u64) -> String {
    const PREFIXES: [&str; 6] = ["A", "a", "a_", "B-", "b", "_"];
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    format!(
        "{}{:07}-{:x}",
        PREFIXES[(mixed % 6) as usize],
        i,
        mixed & 0xfff
    )
}

/// Saves turns 1..=`turns` of the synthetic agent state as execution
/// `execution_id`'s snapshots, each through `loom_save_snapshot(...,
/// 'delta')`, as a runtime saves after every turn (the frame column must
/// exist). Returns the states saved, and the keyframe the last save names
/// (`None` when the last save is a keyframe itself).
///
/// # Panics
///
/// When a save or the read of the last one fails.
pub fn save_delta_run(
    client: &mut Client,
    execution_id: &str,
    turns: usize,
) -> (Vec<String>, Option<i64>) {
    let states: Vec<String> = (1..=turns)
        .map(|turn| loom_fixtures::agent_state(turn, false))
        .collect();
    for (sequence, state) in (1i64..).zip(&states) {
        client
            .execute(
                "SELECT loom_save_snapshot($1, 'wf', $2, $3, 'delta')",
                &[&execution_id, &sequence, state],
            )
            .unwrap_or_else(|e| panic!("save {sequence}: {}", describe(&e)));
    }
    let keyframe = client
        .query_one(
            "SELECT loom_snapshot_base_sequence(state_z) FROM loom.snapshots
             WHERE execution_id = $1 ORDER BY sequence DESC LIMIT 1",
            &[&execution_id],
        )
        .unwrap_or_else(|e| panic!("the last save: {}", describe(&e)))
        .get(0);
    (states, keyframe)
}

/// An adversarial execution id for paging tests: heads and tails that
/// sort differently under en-US than by code point (case, `-` and `_`,
/// NFC `é` beside NFD `e` + U+0301, astral characters, U+FFFD) around a hex
/// number that makes each unique (no head or tail ends or starts in a hex
/// digit, so the number's digits are always the whole run).
#[must_use]
pub fn adversarial_id(i: u64) -> String {
    const HEADS: [&str; 12] = [
        "a",
        "A",
        "a_",
        "a-",
        "A_",
        "_",
        "-",
        "\u{e9}",
        "e\u{301}",
        "\u{1d11e}",
        "\u{1f9f5}",
        "\u{fffd}",
    ];
    const JOINS: [&str; 4] = ["_", "-", "", "\u{301}"];
    const TAILS: [&str; 5] = ["x", "X", "\u{1d11e}", "\u{e9}", "_z"];
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    format!(
        "{}{:x}{}{}",
        HEADS[(mixed % 12) as usize],
        i,
        JOINS[((mixed / 12) % 4) as usize],
        TAILS[((mixed / 48) % 5) as usize]
    )
}

/// Loads two events for each execution id into `loom.events` with COPY
/// (the fast path for millions of rows), then VACUUM ANALYZEs the table.
///
/// # Panics
///
/// When the COPY fails.
pub fn copy_executions(client: &mut Client, ids: impl Iterator<Item = String>) {
    copy_events(client, ids, 2);
}

/// Loads `events_each` events (sequences 1 to `events_each`, a small
/// payload) for each execution id into `loom.events` with COPY, then VACUUM
/// ANALYZEs it and, from 0.4.0, `loom.executions` (which its trigger filled:
/// without a visibility map, an index-only scan visits the heap), as
/// autovacuum would after a bulk load: the shapes of the benches, from the
/// toy (2 events an execution) to an agent loop's (hundreds).
///
/// # Panics
///
/// When the COPY fails.
pub fn copy_events(client: &mut Client, ids: impl Iterator<Item = String>, events_each: u32) {
    use std::io::Write;
    let mut writer = client
        .copy_in("COPY loom.events (execution_id, sequence, kind, payload) FROM STDIN")
        .expect("COPY into loom.events");
    let mut buffer = Vec::with_capacity(1 << 20);
    for id in ids {
        for sequence in 1..=events_each {
            writeln!(buffer, "{id}\t{sequence}\tstep\t{{\"n\":{sequence}}}").expect("in memory");
            if buffer.len() > (1 << 20) - 256 {
                writer.write_all(&buffer).expect("COPY data");
                buffer.clear();
            }
        }
    }
    writer.write_all(&buffer).expect("COPY data");
    writer.finish().expect("COPY ends");
    let tables: Vec<String> = client
        .query(
            "SELECT 'loom.' || relname FROM pg_class
             WHERE relnamespace = 'loom'::regnamespace AND relname IN ('events', 'executions')",
            &[],
        )
        .expect("loom's tables")
        .iter()
        .map(|row| row.get(0))
        .collect();
    client
        .batch_execute(&format!("VACUUM ANALYZE {}", tables.join(", ")))
        .expect("VACUUM ANALYZE");
}

/// A two-worker tokio runtime, for tests and benches that drive
/// pgloom's async stores.
///
/// # Panics
///
/// When the OS refuses the runtime's threads.
#[must_use]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// EXPLAIN of the statement `loom_list_executions` runs for a page after a
/// cursor (a PL/pgSQL function's own plan cannot be EXPLAINed from outside),
/// one plan node a line.
///
/// # Panics
///
/// When EXPLAIN fails.
#[must_use]
pub fn pager_plan(client: &mut Client) -> String {
    client
        .query(
            r#"EXPLAIN (COSTS OFF) SELECT DISTINCT e.execution_id COLLATE "C" FROM loom.events e
               WHERE e.execution_id COLLATE "C" > 'a' COLLATE "C" ORDER BY 1 LIMIT 1000"#,
            &[],
        )
        .expect("EXPLAIN the pager")
        .iter()
        .map(|row| row.get::<_, String>(0).trim().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The collation of column `column` of table `loom.{table}` (`C`,
/// `en-US-x-icu`, …): what loom's collation migrations (ADR 0108 D2)
/// convert.
///
/// # Panics
///
/// When the query fails, or `loom.{table}` has no such column.
#[must_use]
pub fn collation_of(client: &mut Client, table: &str, column: &str) -> String {
    client
        .query_one(
            "SELECT c.collname::text FROM pg_attribute a
             JOIN pg_class t ON t.oid = a.attrelid JOIN pg_namespace n ON n.oid = t.relnamespace
             JOIN pg_collation c ON c.oid = a.attcollation
             WHERE n.nspname = 'loom' AND t.relname = $1 AND a.attname = $2",
            &[&table, &column],
        )
        .unwrap()
        .get(0)
}

/// The version of loom installed in `client`'s database (`extversion`).
///
/// # Panics
///
/// When the query fails, or loom is not installed there.
#[must_use]
pub fn version_of(client: &mut Client) -> String {
    client
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'loom'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Updates the extension the documented way (docs/upgrading.md): in one
/// transaction, wait for the migration lock with no timeouts (from 0.14.0
/// `loom_take_migration_lock()`, before it a `SHARE UPDATE EXCLUSIVE` lock
/// on `pg_extension`, as `migrate()` takes them), put
/// the caller's lock_timeout back, and run `ALTER EXTENSION loom UPDATE` with
/// statement_timeout 0, because that one statement's timer would otherwise
/// cover every rebuild its script does. The caller's settings return at
/// COMMIT (everything is SET LOCAL).
///
/// # Errors
///
/// What the update raises (a soft failure is a WARNING, not an error).
pub fn upgrade_extension(client: &mut Client, version: &str) -> Result<(), postgres::Error> {
    let caller_lock_timeout: String = client.query_one("SHOW lock_timeout", &[])?.get(0);
    let mut tx = client.transaction()?;
    tx.batch_execute(
        "SET LOCAL search_path = pg_catalog, pg_temp;
         SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0",
    )?;
    let lock: String = tx
        .query_one(
            "SELECT CASE WHEN pg_catalog.string_to_array(e.extversion, '.')::pg_catalog.int4[]
                              OPERATOR(pg_catalog.>=) '{0,14,0}'::pg_catalog.int4[]
                         THEN pg_catalog.format('SELECT %I.loom_take_migration_lock()', n.nspname)
                         ELSE 'LOCK TABLE pg_catalog.pg_extension IN SHARE UPDATE EXCLUSIVE MODE' END
             FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
             WHERE e.extname OPERATOR(pg_catalog.=) 'loom'",
            &[],
        )?
        .get(0);
    tx.batch_execute(&lock)?;
    tx.execute(
        "SELECT set_config('lock_timeout', $1, true)",
        &[&caller_lock_timeout],
    )?;
    tx.batch_execute(&format!("ALTER EXTENSION loom UPDATE TO '{version}'"))?;
    tx.commit()
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cluster::C => f.write_str("C"),
            Cluster::Icu => f.write_str("en-US"),
            Cluster::Shard(i) => write!(f, "shard {i}"),
            Cluster::Citus => f.write_str("Citus coordinator"),
            Cluster::CitusWorker(i) => write!(f, "Citus worker {i}"),
            Cluster::Cron => f.write_str("pg_cron"),
        }
    }
}

/// A pool of `max_size` connections to `config`, as the tests and benches
/// open them (the rest of [`pgloom::PgPoolOptions::new`]'s defaults).
pub fn pg_pool(config: &str, max_size: usize) -> pgloom::Result<pgloom::PgPool> {
    pgloom::PgPool::connect_with(config, pgloom::PgPoolOptions::new().max_size(max_size))
}

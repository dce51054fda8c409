//! The Makefile's Citus cluster (a coordinator and two workers) for the
//! scale-out tests and benches: whether it is there, and a new database
//! on it with loom's tables distributed.
//!
//! Citus keeps its node list per database, so each new database gets the
//! citus extension on every node and its workers registered on the
//! coordinator, as `make clusters.citus` does for `postgres`.

use postgres::{Client, Config};

use crate::{describe, Cluster};

/// Why the Citus tests cannot run here, when they cannot: the Makefile
/// exports `LOOM_CITUS_MISSING` when no supported Citus is installed for
/// the server under test and no `LOOM_PG_CITUS` names a running one.
#[must_use]
pub fn citus_missing() -> Option<String> {
    std::env::var("LOOM_CITUS_MISSING")
        .ok()
        .filter(|why| !why.is_empty())
}

/// True when the Citus benches can run; otherwise prints, loudly, that
/// `bench` is skipped and why.
#[must_use]
pub fn citus_available(bench: &str) -> bool {
    match citus_missing() {
        None => true,
        Some(why) => {
            eprintln!("\n*** SKIPPED {bench}: no Citus here ({why}).");
            eprintln!("*** Install Citus from the Citus project's packages, or set LOOM_PG_CITUS (docs/operations.md, Scale-out).\n");
            false
        }
    }
}

/// Whether the Citus cluster is the caller's (`LOOM_PG_CITUS` set outside
/// the Makefile, which then exports `LOOM_CITUS_EXTERNAL`): reached by its
/// conninfo only, never started or stopped through a data directory here.
#[must_use]
pub fn citus_is_external() -> bool {
    std::env::var_os("LOOM_CITUS_EXTERNAL").is_some_and(|v| !v.is_empty())
}

/// For the Citus tests, which run only when asked to (`--ignored`): fails
/// the test, saying why, where there is no Citus.
///
/// # Panics
///
/// When [`citus_missing`] says why Citus is not here.
pub fn require_citus() {
    if let Some(why) = citus_missing() {
        panic!("the Citus tests need Citus: {why}; `make test.citus` says what to install");
    }
}

fn host_and_port(cluster: Cluster) -> (String, i32) {
    let config: Config = cluster
        .conninfo()
        .parse()
        .expect("a valid connection string");
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("{cluster}: a TCP host is needed for Citus, got {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    (host, i32::from(port))
}

/// A new database `name` on the coordinator and both workers (each dropped
/// first if a previous run left it), Citus in each with the workers
/// registered, and `CREATE EXTENSION loom` on the coordinator (Citus runs
/// it on the workers too); not yet distributed.
///
/// # Panics
///
/// When a node cannot be reached or a step fails.
#[must_use]
pub fn fresh_citus_database(name: &str) -> Client {
    // The coordinator's database first: its maintenance daemon holds
    // connections to the workers' database of the same name.
    let mut admin = Cluster::Citus.connect("postgres");
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .unwrap_or_else(|e| panic!("DROP DATABASE {name}: {}", describe(&e)));
    for worker in Cluster::CITUS_WORKERS {
        let mut client = worker.fresh_database_without_loom(name, "");
        client
            .batch_execute("SET client_min_messages = warning; CREATE EXTENSION citus")
            .unwrap_or_else(|e| panic!("{worker}: CREATE EXTENSION citus: {}", describe(&e)));
    }
    let mut coordinator = Cluster::Citus.fresh_database_without_loom(name, "");
    coordinator
        .batch_execute("SET client_min_messages = warning; CREATE EXTENSION citus")
        .unwrap_or_else(|e| panic!("coordinator: CREATE EXTENSION citus: {}", describe(&e)));
    let (host, port) = host_and_port(Cluster::Citus);
    coordinator
        .execute("SELECT citus_set_coordinator_host($1, $2)", &[&host, &port])
        .unwrap_or_else(|e| panic!("citus_set_coordinator_host: {}", describe(&e)));
    for worker in Cluster::CITUS_WORKERS {
        let (host, port) = host_and_port(worker);
        coordinator
            .execute("SELECT citus_add_node($1, $2)", &[&host, &port])
            .unwrap_or_else(|e| panic!("citus_add_node {host}:{port}: {}", describe(&e)));
    }
    coordinator
        .batch_execute("CREATE EXTENSION loom")
        .unwrap_or_else(|e| panic!("CREATE EXTENSION loom on Citus: {}", describe(&e)));
    coordinator
}

/// [`fresh_citus_database`], then `loom_distribute(shard_count)`; returns
/// the coordinator's client.
///
/// # Panics
///
/// As [`fresh_citus_database`], or when a table is not distributed.
#[must_use]
pub fn fresh_distributed_database(name: &str, shard_count: i32) -> Client {
    let mut coordinator = fresh_citus_database(name);
    distribute(&mut coordinator, shard_count);
    coordinator
}

/// Runs `loom_distribute(shard_count)` with no statement_timeout and checks
/// that every table ended as it should.
///
/// # Panics
///
/// When the call fails or a table is left local.
pub fn distribute(coordinator: &mut Client, shard_count: i32) {
    coordinator
        .batch_execute("SET statement_timeout = 0")
        .unwrap();
    let outcomes: Vec<(String, String)> = coordinator
        .query("SELECT * FROM loom_distribute($1)", &[&shard_count])
        .unwrap_or_else(|e| panic!("loom_distribute: {}", describe(&e)))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(
        outcomes
            .iter()
            .all(|(_, outcome)| outcome.ends_with("distributed") || outcome.ends_with("reference")),
        "loom_distribute: {outcomes:?}"
    );
    coordinator
        .batch_execute("RESET statement_timeout")
        .unwrap();
}

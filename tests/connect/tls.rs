//! pgloom's connections against the Makefile's `tls` cluster: ssl=on,
//! a certificate for `localhost` and 127.0.0.1 signed by a throwaway CA,
//! and a pg_hba that refuses TCP without TLS (`hostnossl … reject`), so
//! every connection that succeeds here was encrypted. Then the pool's
//! timeouts: a saturated pool and a server that never answers are errors
//! within their bounds, never hangs.
//!
//! `make test` runs this file twice: over OpenSSL (the default), and with
//! pgloom's `rustls` feature (`LOOM_TLS_BACKEND=rustls`): the same
//! sslmodes, the same typed errors, from either TLS library.

#[path = "../../loom-client/tests/common/mod.rs"]
mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::snapshot;
use loom_harness::cli::snapshot_show;
use loom_harness::pg_pool;
use pgloom::error::PoolTimeout;
use pgloom::event_store::{Event, EventStore, PgEventStore, StoreConfig, TlsError, TLS_BACKEND};
use pgloom::migrate::{migrate, MigrateOptions};
use pgloom::snapshot_store::{PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore};
use pgloom::{Error, PgPoolOptions};

/// The tls cluster's connection string (no sslmode: each test states its
/// own).
fn tls_cluster() -> String {
    std::env::var("LOOM_PG_TLS").expect(
        "LOOM_PG_TLS is not set: run through `make test` (or `make clusters` and export it)",
    )
}

/// The CA that signed the tls cluster's certificate.
fn ca() -> String {
    std::env::var("LOOM_PG_TLS_CA").expect("LOOM_PG_TLS_CA is not set: run through `make test`")
}

/// Database `db` on the tls cluster, with `extra` keys (a later key
/// replaces an earlier one, as in libpq).
fn conninfo(db: &str, extra: &str) -> String {
    format!("{} dbname={db} {extra}", tls_cluster())
}

fn verify_full() -> String {
    format!("sslmode=verify-full sslrootcert={}", ca())
}

/// Whether the server sees this pool's session as encrypted.
async fn is_encrypted(pool: &pgloom::PgPool) -> bool {
    let client = pool
        .as_ref()
        .get()
        .await
        .map_err(Error::from)
        .expect("a connection");
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0)
}

/// A new, empty database `name` on the tls cluster (dropped first if a
/// previous run left it), made over TLS: the cluster takes nothing else.
async fn fresh_database(name: &str) {
    let pool = pg_pool(&conninfo("postgres", "sslmode=require"), 1).unwrap();
    let admin = pool.as_ref().get().await.map_err(Error::from).unwrap();
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin
            .batch_execute(&statement)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e:?}"));
    }
}

/// The error a pool's first connection fails with.
async fn first_connection_error(config: &str) -> Error {
    let pool = pg_pool(config, 1).unwrap_or_else(|e| panic!("{config}: {e}"));
    Error::from(
        pool.as_ref()
            .get()
            .await
            .expect_err("the connection must fail"),
    )
}

#[test]
fn runs_over_the_tls_library_the_makefile_asked_for() {
    let expected = std::env::var("LOOM_TLS_BACKEND").unwrap_or_else(|_| "openssl".to_owned());
    assert_eq!(TLS_BACKEND, expected);
}

#[tokio::test]
async fn require_prefer_and_allow_encrypt() {
    // require: encrypts, verifies nothing. prefer (also the default): the
    // server offers TLS. allow: plaintext first, refused by hostnossl, then
    // TLS, as libpq does.
    for sslmode in ["sslmode=require", "sslmode=prefer", "", "sslmode=allow"] {
        let pool = pg_pool(&conninfo("postgres", sslmode), 1).unwrap();
        assert!(is_encrypted(&pool).await, "{sslmode:?}");
    }
}

#[tokio::test]
async fn verify_full_and_verify_ca_connect_with_the_ca() {
    let ca = ca();
    for extra in [
        verify_full(),
        format!("sslmode=verify-ca sslrootcert={ca}"),
        // The certificate's IP address entry, as libpq 14+ checks it.
        format!("host=127.0.0.1 {}", verify_full()),
        // require with a root certificate verifies the chain (libpq's rule).
        format!("sslmode=require sslrootcert={ca}"),
    ] {
        let pool = pg_pool(&conninfo("postgres", &extra), 1).unwrap();
        assert!(is_encrypted(&pool).await, "{extra}");
    }
    // The same from a URL, the CA path percent-encoded.
    let port = port();
    let url = format!(
        "postgresql://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        ca.replace('%', "%25").replace('/', "%2F")
    );
    assert!(is_encrypted(&pg_pool(&url, 1).unwrap()).await, "{url}");
}

#[tokio::test]
async fn verify_full_refuses_a_host_the_certificate_does_not_cover() {
    // Same server (hostaddr), another name: the certificate covers only
    // localhost and 127.0.0.1.
    let wrong_name = conninfo(
        "postgres",
        &format!("host=db.other.invalid hostaddr=127.0.0.1 {}", verify_full()),
    );
    match first_connection_error(&wrong_name).await {
        Error::Tls(TlsError::HostnameMismatch { host, .. }) => {
            assert_eq!(host, "db.other.invalid");
        }
        other => panic!("expected a host name mismatch, got {other:?}"),
    }
    // Through a store and through migrate (a one-off connection): the same
    // typed error.
    let store = PgEventStore::connect(&wrong_name).unwrap();
    assert!(matches!(
        store.read_events("e").await,
        Err(Error::Tls(TlsError::HostnameMismatch { .. }))
    ));
    assert!(matches!(
        migrate(&wrong_name, &MigrateOptions::new()).await,
        Err(Error::Tls(TlsError::HostnameMismatch { .. }))
    ));
    // verify-ca checks the chain only: the same name is accepted.
    let chain_only = conninfo(
        "postgres",
        &format!(
            "host=db.other.invalid hostaddr=127.0.0.1 sslmode=verify-ca sslrootcert={}",
            ca()
        ),
    );
    assert!(is_encrypted(&pg_pool(&chain_only, 1).unwrap()).await);
}

#[tokio::test]
async fn verification_without_the_right_root_fails_typed() {
    // No root certificate: refused before any connection.
    for sslmode in ["verify-full", "verify-ca"] {
        assert!(
            matches!(
                pg_pool(&conninfo("postgres", &format!("sslmode={sslmode}")), 1),
                Err(Error::Tls(TlsError::MissingRootCert { .. }))
            ),
            "{sslmode}"
        );
    }
    // The system's roots do not include the throwaway CA.
    match first_connection_error(&conninfo("postgres", "sslrootcert=system")).await {
        Error::Tls(TlsError::UntrustedCertificate { host, reason, .. }) => {
            assert_eq!(host, "localhost");
            assert!(!reason.is_empty());
        }
        other => panic!("expected an untrusted certificate, got {other:?}"),
    }
    // A root file that is not there is an error, not a downgrade.
    assert!(matches!(
        pg_pool(
            &conninfo(
                "postgres",
                "sslmode=require sslrootcert=/nonexistent/ca.crt"
            ),
            1
        ),
        Err(Error::Tls(TlsError::File { .. }))
    ));
}

#[tokio::test]
async fn sslmode_disable_is_refused_by_the_server() {
    let err = first_connection_error(&conninfo("postgres", "sslmode=disable")).await;
    // pg_hba's hostnossl reject: invalid_authorization_specification.
    assert_eq!(err.sqlstate(), Some("28000"), "{err:?}");
    assert!(
        matches!(&err, Error::Pool(e) if e.postgres().is_some()),
        "{err:?}"
    );
}

#[tokio::test]
async fn stores_and_migrate_work_over_verified_tls() {
    let db = "loom_it_tls_stores";
    fresh_database(db).await;
    let verified = conninfo(db, &verify_full());
    let migration = migrate(&verified, &MigrateOptions::new()).await.unwrap();
    assert_eq!(migration.from_version, None, "a fresh database");

    let store = PgEventStore::connect(&verified).unwrap();
    assert!(is_encrypted(store.pool()).await);
    store
        .append(&[
            Event::new("b", 1, "started", serde_json::json!({})),
            Event::new("a", 1, "started", serde_json::json!({})),
        ])
        .await
        .unwrap();
    let page = store.list_executions_page(None, 10).await.unwrap();
    assert_eq!(page.ids, ["a", "b"]);

    // A configuration string (a URL here), with pool options.
    let port = port();
    let config: StoreConfig = format!(
        "postgres:postgres://postgres@localhost:{port}/{db}?sslmode=verify-full&sslrootcert={}",
        ca()
    )
    .parse()
    .unwrap();
    let mut options = PgPoolOptions::new();
    options.max_size(2).wait_timeout(Duration::from_secs(2));
    let configured = config.open_with(&options).unwrap();
    configured
        .append(&[Event::new("c", 1, "started", serde_json::json!({}))])
        .await
        .unwrap();
    let page = configured
        .list_executions_page(Some("a"), 10)
        .await
        .unwrap();
    assert_eq!(page.ids, ["b", "c"]);
    assert_eq!(
        config.open().unwrap().read_events("c").await.unwrap().len(),
        1
    );
}

#[tokio::test]
async fn a_saturated_pool_fails_after_its_wait_timeout_not_a_hang() {
    let mut options = PgPoolOptions::new();
    options.max_size(1).wait_timeout(Duration::from_millis(300));
    let pool =
        pgloom::PgPool::connect_with(&conninfo("postgres", "sslmode=require"), &options).unwrap();
    let store = PgEventStore::new(pool.clone());
    let held = pool.as_ref().get().await.map_err(Error::from).unwrap();

    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), store.read_events("e"))
        .await
        .expect("bounded by the pool's wait timeout")
        .expect_err("no connection is free");
    let waited = started.elapsed();
    assert!(
        matches!(&err, Error::Pool(e) if e.timeout() == Some(PoolTimeout::Wait)),
        "{err:?}"
    );
    assert!(err.is_timeout());
    assert!(err.is_transient());
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "waited {waited:?}"
    );

    drop(held);
    assert!(is_encrypted(&pool).await, "the pool serves again");
}

/// A TCP port that accepts connections and never answers: a server hung
/// before its first byte.
fn silent_server() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_timeout() {
    let (_listener, port) = silent_server();
    let config = format!("host=127.0.0.1 port={port} user=postgres sslmode=require");

    let mut options = PgPoolOptions::new();
    options.create_timeout(Duration::from_millis(300));
    let pool = pgloom::PgPool::connect_with(&config, &options).unwrap();
    let started = Instant::now();
    let err = Error::from(pool.as_ref().get().await.expect_err("no answer"));
    assert!(
        matches!(&err, Error::Pool(e) if e.timeout() == Some(PoolTimeout::Create)),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    // migrate's one connection: the default 5 s bound.
    let started = Instant::now();
    let err = migrate(&config, &MigrateOptions::new())
        .await
        .expect_err("no answer");
    assert!(matches!(err, Error::ConnectTimeout(_)), "{err:?}");
    assert!(err.is_timeout());
    assert!(started.elapsed() < Duration::from_secs(8));
}

#[tokio::test]
async fn the_cli_reads_over_verified_tls_and_bounds_its_connect() {
    let db = "loom_it_tls_cli";
    fresh_database(db).await;
    let verified = conninfo(db, &verify_full());
    migrate(&verified, &MigrateOptions::new()).await.unwrap();
    let store = PgSnapshotStore::start(
        pg_pool(&verified, 1).unwrap(),
        &PgSnapshotStoreOptions::new(),
    )
    .await
    .unwrap();
    store
        .save(&snapshot("exec-tls", 1, r#"{"over":"tls"}"#))
        .await
        .unwrap();

    let (code, out, _) = snapshot_show(&verified, &["exec-tls", "--connect-timeout", "5"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"over\": \"tls\""), "{out}");

    let (code, out, _) = snapshot_show(&conninfo(db, "sslmode=verify-full"), &["exec-tls"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("sslrootcert"), "{out}");

    let (_listener, port) = silent_server();
    let (code, out, took) = snapshot_show(
        &format!("host=127.0.0.1 port={port} user=postgres dbname={db}"),
        &["exec-tls", "--connect-timeout", "1"],
    );
    assert_eq!(code, 3, "cannot connect: {out}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {out}");

    let (code, out, _) = snapshot_show(&verified, &["exec-tls", "--connect-timeout", "0"]);
    assert_eq!(code, 2, "a bound of 0 is a usage error: {out}");
}

/// The tls cluster's port, from its connection string.
fn port() -> u16 {
    tls_cluster()
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .and_then(|p| p.parse().ok())
        .expect("LOOM_PG_TLS names a port")
}

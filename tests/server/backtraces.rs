//! No loom ERROR carries a Rust backtrace to its client (issue 25),
//! whatever the server's environment.
//!
//! pgrx's panic hook captures `std::backtrace::Backtrace::capture()` for
//! every ERROR that crosses loom's Rust frames, and appends it to the
//! DETAIL of PostgreSQL's own ERRORs raised under them (a duplicate
//! append's unique violation) and of panics. It resolves only when
//! `RUST_BACKTRACE` or `RUST_LIB_BACKTRACE` is set for the server, which the
//! Makefile's clusters never are, so this test starts a server of its own
//! with both set, makes loom fail in each way a role without privileges
//! beyond loom's writer can, and reads every field the client receives.

use loom_harness::cluster_control::pgroot;
use loom_harness::pg_bin;
use loom_harness::scratch_server::ScratchServer;
use postgres::{Client, NoTls};

const ROLE: &str = "loom_bt_writer";

/// What a backtrace, or the build it came from, looks like in a message:
/// std's header, a frame's `file.rs:line`, the checkout and the registry.
const MARKERS: [&str; 5] = ["backtrace", ".rs:", "/root", "cargo", "rust_begin_unwind"];

/// Each way a writer makes loom fail, named.
const FAILING: [(&str, &str); 6] = [
    (
        "a frame of an unknown format",
        r"SELECT loom_snapshot_state('\x07'::bytea)",
    ),
    (
        "an unknown codec",
        "SELECT loom_snapshot_frame('{}', 'nope')",
    ),
    (
        "a duplicate append (PostgreSQL's ERROR under loom's frames)",
        "SELECT loom_append_event('exec-1', 1, 'started', '{}')",
    ),
    (
        "a duplicate in a batch append",
        "SELECT loom_append_events(ARRAY['exec-2', 'exec-2'], ARRAY[1, 1]::bigint[], \
         ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[])",
    ),
    (
        "a state jsonb cannot hold",
        r#"SELECT loom_snapshot_state(loom_snapshot_frame('{"a":"\u0000"}', 'none'))"#,
    ),
    (
        "a truncated zstd frame",
        "SELECT loom_snapshot_state(substr(loom_snapshot_frame(repeat('ab', 500), 'zstd'), 1, 12))",
    ),
];

#[test]
fn no_loom_error_carries_a_backtrace_with_rust_backtrace_set_for_the_server() {
    let port = loom_harness::scratch_port("BACKTRACES");
    let server = ScratchServer::init(
        &pg_bin(),
        pgroot().join("backtraces"),
        port,
        &["--locale=C.UTF-8"],
    );
    server.start_with_env("", &[("RUST_BACKTRACE", "1"), ("RUST_LIB_BACKTRACE", "1")]);
    let mut admin = server.connect("postgres");
    admin
        .batch_execute(&format!(
            "CREATE EXTENSION loom;
             CREATE ROLE {ROLE} LOGIN;
             SELECT loom_grant_access('{ROLE}', 'writer');
             SELECT loom_append_event('exec-1', 1, 'started', '{{}}');"
        ))
        .unwrap();
    assert_server_has_backtraces_on(&mut admin);
    let mut writer = Client::connect(
        &format!("host=127.0.0.1 port={port} user={ROLE} dbname=postgres"),
        NoTls,
    )
    .unwrap();
    for (what, sql) in FAILING {
        let err = writer.batch_execute(sql).expect_err(what);
        let db = err
            .as_db_error()
            .unwrap_or_else(|| panic!("{what}: not the server's ERROR: {err}"));
        let fields = [
            ("message", Some(db.message())),
            ("detail", db.detail()),
            ("hint", db.hint()),
            ("context", db.where_()),
            ("file", db.file()),
            ("routine", db.routine()),
        ];
        for (field, text) in fields {
            let Some(text) = text else { continue };
            for marker in MARKERS {
                assert!(
                    !text.contains(marker),
                    "{what}: its {field} holds {marker:?}:\n{text}"
                );
            }
        }
    }
}

/// The variables reached the server: what a program the server starts
/// inherits (`COPY FROM PROGRAM`, as the superuser). `/proc/<pid>/environ`
/// cannot say: PostgreSQL writes its process titles over that memory.
fn assert_server_has_backtraces_on(admin: &mut Client) {
    admin
        .batch_execute(
            "CREATE TEMP TABLE server_env (line text);
             COPY server_env FROM PROGRAM 'env' WITH (FORMAT text, DELIMITER E'\\x01');",
        )
        .unwrap();
    let set: i64 = admin
        .query_one(
            "SELECT count(*) FROM server_env
              WHERE line IN ('RUST_BACKTRACE=1', 'RUST_LIB_BACKTRACE=1')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        set, 2,
        "the server's environment lacks the backtrace switches"
    );
}

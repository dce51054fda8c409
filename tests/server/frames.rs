//! The extension's frame and order functions against the Makefile's real
//! clusters (C and ICU en-US), with frames made by the `zstd` CLI.

#[path = "../../loom-core/tests/support/mod.rs"]
mod support;

use loom_fixtures::agent_state;
use loom_harness::Cluster;
use pgloom_core::frame::{decode, encode, Codec};
use postgres::error::SqlState;
use postgres::Client;
use support::zstd_cli_frame;

fn state_text(client: &mut Client, frame: &[u8]) -> Result<String, postgres::Error> {
    client
        .query_one("SELECT loom_snapshot_state_text($1)", &[&frame])
        .map(|row| row.get(0))
}

fn sqlstate(result: Result<String, postgres::Error>) -> SqlState {
    let err = result.expect_err("expected an ERROR");
    err.code()
        .cloned()
        .unwrap_or_else(|| panic!("no SQLSTATE: {err}"))
}

#[test]
fn the_server_reads_cli_frames_and_refuses_foreign_ones_by_sqlstate() {
    let state = agent_state(30, false);
    let declared = zstd_cli_frame(
        &format!("zstd -3 -c --stream-size={}", state.len()),
        state.as_bytes(),
    );
    let streamed = zstd_cli_frame("cat | zstd -3 -c", state.as_bytes());
    let unchecked = zstd_cli_frame("zstd -3 -c --no-check", state.as_bytes());
    let two = [&declared[..], &declared[1..]].concat();
    let huge = 600u64 * 1024 * 1024;
    let bomb = zstd_cli_frame(
        &format!("head -c {huge} /dev/zero | zstd -3 -c --stream-size={huge}"),
        b"",
    );
    let endless = zstd_cli_frame("head -c 300000000 /dev/zero | zstd -3 -c", b"");

    for cluster in Cluster::ALL {
        let mut client = cluster.fresh_database("loom_it_frames");
        assert_eq!(
            state_text(&mut client, &declared).unwrap(),
            state,
            "{cluster}"
        );
        assert_eq!(
            state_text(&mut client, &streamed).unwrap(),
            state,
            "{cluster}"
        );
        let cases = [
            (&unchecked, SqlState::INVALID_BINARY_REPRESENTATION),
            (&two, SqlState::INVALID_BINARY_REPRESENTATION),
            (&bomb, SqlState::PROGRAM_LIMIT_EXCEEDED),
            (&endless, SqlState::PROGRAM_LIMIT_EXCEEDED),
        ];
        for (frame, expected) in cases {
            assert_eq!(
                sqlstate(state_text(&mut client, frame)),
                expected,
                "{cluster}"
            );
        }
        let info = client
            .query_one(
                "SELECT format, stored_bytes, declared_bytes, has_checksum FROM loom_snapshot_frame_info($1)",
                &[&bomb],
            )
            .unwrap();
        assert_eq!(info.get::<_, &str>(0), "zstd");
        assert_eq!(info.get::<_, i32>(1) as usize, bomb.len());
        assert_eq!(info.get::<_, Option<i64>>(2), Some(huge as i64));
        assert!(info.get::<_, bool>(3));
        // The backend survived every refusal.
        assert_eq!(state_text(&mut client, &declared).unwrap(), state);
    }
}

#[test]
fn client_and_server_frame_and_decode_alike() {
    let mut client = Cluster::Icu.fresh_database("loom_it_agree");
    for state in [
        agent_state(40, false),
        agent_state(40, true),
        r#"{"b":"\ud800","a":1}"#.to_owned(),
    ] {
        for codec in [Codec::None, Codec::Zstd] {
            let ours = encode(&state, codec).unwrap();
            let theirs: Vec<u8> = client
                .query_one(
                    "SELECT loom_snapshot_frame($1::text, $2)",
                    &[&state, &codec.as_str()],
                )
                .unwrap()
                .get(0);
            assert_eq!(
                ours, theirs,
                "the server frames byte for byte as the client does"
            );
            assert_eq!(decode(&theirs).unwrap(), state);
            assert_eq!(state_text(&mut client, &ours).unwrap(), state);
        }
    }
}

#[test]
fn jsonb_reads_work_from_any_schema_and_search_path() {
    let mut client = Cluster::C.fresh_database_without_loom("loom_it_schema", "");
    client
        .batch_execute(
            "CREATE SCHEMA loomx; CREATE EXTENSION loom SCHEMA loomx; SET search_path = public",
        )
        .unwrap();
    let frame = encode(r#"{"turns":[{"tool":"search"}]}"#, Codec::Zstd).unwrap();
    let tool: String = client
        .query_one(
            "SELECT loomx.loom_snapshot_state($1)->'turns'->0->>'tool'",
            &[&frame],
        )
        .unwrap()
        .get(0);
    assert_eq!(tool, "search");
}

#[test]
fn create_extension_refuses_a_database_that_is_not_utf8() {
    let mut client = Cluster::C.fresh_database_without_loom(
        "loom_it_ascii",
        "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
    );
    let err = client.batch_execute("CREATE EXTENSION loom").unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{err}");
}

#[test]
fn code_point_order_holds_where_the_database_order_differs() {
    let ids = pgloom::conformance::CONFORMANCE_IDS;
    let mut expected: Vec<&str> = ids.to_vec();
    expected.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    let mut client = Cluster::Icu.fresh_database("loom_it_order");
    client.batch_execute("CREATE TABLE ids(id text)").unwrap();
    for id in ids {
        client
            .execute("INSERT INTO ids VALUES ($1)", &[&id])
            .unwrap();
    }
    let column = |client: &mut Client, sql: &str| -> Vec<String> {
        client
            .query(sql, &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let by_database = column(&mut client, "SELECT id FROM ids ORDER BY id");
    let by_c = column(&mut client, r#"SELECT id FROM ids ORDER BY id COLLATE "C""#);
    assert_ne!(
        by_database, expected,
        "en-US must differ, or this test proves nothing"
    );
    assert_eq!(by_c, expected);
    // loom's comparator agrees with COLLATE "C" pair by pair.
    let disagreements: i64 = client
        .query_one(
            r#"SELECT count(*) FROM ids x, ids y
               WHERE loom_compare_execution_ids(x.id, y.id)
                  <> (CASE WHEN x.id COLLATE "C" < y.id COLLATE "C" THEN -1
                               WHEN x.id = y.id THEN 0 ELSE 1 END)"#,
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(disagreements, 0);
}

//! ADR 0141's read path on this machine: the same 200-turn state read from
//! a JSONB column, as text through `loom_snapshot_state_text(frame)`, and as
//! jsonb through `loom_snapshot_state(frame)`, side by side in one run; then
//! where the server's time goes, from EXPLAIN ANALYZE of each step alone.
//!
//! Targets: the text path >= 2x faster than the JSONB read; the jsonb path
//! (which must parse into jsonb) within 1.5x of it.

use std::error::Error;
use std::time::Instant;

use loom_fixtures::agent_state;
use loom_harness::bench_support::{median, record};
use loom_harness::Cluster;
use pgloom_core::frame::{encode, Codec};
use postgres::types::{FromSql, Type};
use postgres::Client;

const READS: usize = 25;

/// A jsonb or text value as the bytes the server sent, unparsed: the read
/// is timed, not a client-side JSON parse.
struct RawValue(#[allow(dead_code)] Vec<u8>);

impl<'a> FromSql<'a> for RawValue {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        Ok(RawValue(raw.to_vec()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::TEXT
    }
}

/// Median client-observed milliseconds of `sql` (one row, one column).
fn read_ms(client: &mut Client, sql: &str) -> f64 {
    let statement = client.prepare(sql).unwrap();
    for _ in 0..3 {
        client.query_one(&statement, &[]).unwrap();
    }
    median(
        (0..READS)
            .map(|_| {
                let started = Instant::now();
                let row = client.query_one(&statement, &[]).unwrap();
                let _value: RawValue = row.get(0);
                started.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

/// Median server execution milliseconds of `sql`, from EXPLAIN ANALYZE
/// (which evaluates the target list but sends nothing).
fn server_ms(client: &mut Client, sql: &str) -> f64 {
    let explain = format!("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {sql}");
    median(
        (0..READS)
            .map(|_| {
                let plan = client
                    .simple_query(&explain)
                    .unwrap()
                    .into_iter()
                    .find_map(|m| match m {
                        postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                        _ => None,
                    })
                    .expect("EXPLAIN returns its plan");
                let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
                plan[0]["Execution Time"].as_f64().unwrap()
            })
            .collect(),
    )
}

fn main() {
    let mut client = Cluster::Icu.fresh_database("loom_bench_read");
    let state = agent_state(200, false);
    let frame = encode(&state, Codec::Zstd).unwrap();
    client
        .batch_execute(
            "CREATE TABLE snap (id int PRIMARY KEY, state jsonb NOT NULL, state_z bytea NOT NULL,
                                state_text text NOT NULL);
             ALTER TABLE snap ALTER state_z SET STORAGE EXTERNAL,
                              ALTER state_text SET STORAGE EXTERNAL;",
        )
        .unwrap();
    client
        .execute(
            "INSERT INTO snap VALUES (1, $1::text::jsonb, $2, $1)",
            &[&state, &frame],
        )
        .unwrap();
    client.batch_execute("VACUUM ANALYZE snap").unwrap();
    let sizes = client
        .query_one(
            "SELECT pg_column_size(state), pg_column_size(state_z) FROM snap",
            &[],
        )
        .unwrap();
    let (jsonb_bytes, frame_bytes): (i32, i32) = (sizes.get(0), sizes.get(1));

    let jsonb = read_ms(&mut client, "SELECT state FROM snap WHERE id = 1");
    let text = read_ms(
        &mut client,
        "SELECT loom_snapshot_state_text(state_z) FROM snap WHERE id = 1",
    );
    let as_jsonb = read_ms(
        &mut client,
        "SELECT loom_snapshot_state(state_z) FROM snap WHERE id = 1",
    );
    // Reference: the same text from a plain text column, no decoding at
    // all: what Postgres's own fetch and send of 600 KB of text costs.
    let plain_text = read_ms(&mut client, "SELECT state_text FROM snap WHERE id = 1");
    let client_decoded = median(
        (0..READS)
            .map(|_| {
                let started = Instant::now();
                let row = client
                    .query_one("SELECT state_z FROM snap WHERE id = 1", &[])
                    .unwrap();
                let text = pgloom_core::frame::decode(row.get::<_, &[u8]>(0)).unwrap();
                std::hint::black_box(text);
                started.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    );

    println!(
        "\nread of one 200-turn state ({} bytes of JSON; JSONB stores {jsonb_bytes}, the frame {frame_bytes}),",
        state.len()
    );
    println!("median of {READS} reads over loopback, ICU en-US database:");
    println!("{:<44} {:>9} {:>16}", "query", "ms", "speed-up vs JSONB");
    for (name, ms) in [
        ("SELECT state (JSONB column)", jsonb),
        ("SELECT loom_snapshot_state_text(state_z)", text),
        ("SELECT loom_snapshot_state(state_z)", as_jsonb),
        ("SELECT state_z, decoded in the client", client_decoded),
        ("(reference) SELECT the same text column", plain_text),
    ] {
        println!("{name:<44} {ms:>9.3} {:>15.2}x", jsonb / ms);
    }
    record("read: SELECT state (JSONB), ms", &format!("{jsonb:.3}"));
    record(
        "read: loom_snapshot_state_text(frame) vs JSONB",
        &format!("{:.2}x", jsonb / text),
    );
    record(
        "read: loom_snapshot_state(frame) vs JSONB",
        &format!("{:.2}x", jsonb / as_jsonb),
    );

    // What psql users type: one turn, not the whole state.
    println!("\none turn of it, as a psql user asks (median of {READS} reads):");
    println!("{:<58} {:>9} {:>16}", "query", "ms", "speed-up vs JSONB");
    let turns: Vec<(&str, f64)> = [
        (
            "SELECT state->'turns'->0 (JSONB column)",
            "SELECT state->'turns'->0 FROM snap WHERE id = 1",
        ),
        (
            "SELECT loom_snapshot_state(state_z)->'turns'->0",
            "SELECT loom_snapshot_state(state_z)->'turns'->0 FROM snap WHERE id = 1",
        ),
        (
            "SELECT loom_snapshot_get(state_z, 'turns', '0')",
            "SELECT loom_snapshot_get(state_z, 'turns', '0') FROM snap WHERE id = 1",
        ),
    ]
    .into_iter()
    .map(|(name, sql)| (name, read_ms(&mut client, sql)))
    .collect();
    for (name, ms) in &turns {
        println!("{name:<58} {ms:>9.3} {:>15.2}x", turns[0].1 / ms);
    }

    println!("\nwhere the server's time goes (EXPLAIN ANALYZE execution, no output, median ms):");
    let steps = [
        (
            "detoast + pglz-decompress the JSONB",
            "SELECT jsonb_typeof(state) FROM snap WHERE id = 1",
        ),
        (
            "... + jsonb_out (what a JSONB read sends)",
            "SELECT octet_length(state::text) FROM snap WHERE id = 1",
        ),
        (
            "fetch + decode the frame (zstd, UTF-8, JSON check)",
            "SELECT octet_length(loom_snapshot_state_text(state_z)) FROM snap WHERE id = 1",
        ),
        (
            "... + the jsonb built (loom_snapshot_state)",
            "SELECT jsonb_typeof(loom_snapshot_state(state_z)) FROM snap WHERE id = 1",
        ),
        (
            "... + the jsonb built + jsonb_out",
            "SELECT octet_length(loom_snapshot_state(state_z)::text) FROM snap WHERE id = 1",
        ),
    ];
    for (name, sql) in steps {
        println!("{name:<52} {:>8.3}", server_ms(&mut client, sql));
    }
}

//! `make demo`: loom's main job in a few lines. Build a deterministic
//! synthetic agent state, frame it both ways, store it beside the JSONB a
//! pre-codec deployment would write, and compare what each costs on disk.
//! The Makefile then reads the frame back from psql.

use loom_fixtures::agent_state;
use loom_harness::Cluster;
use pgloom_core::frame::{encode, Codec};

const TURNS: usize = 200;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut db = Cluster::Icu.fresh_database("loom_demo");
    db.batch_execute(
        "CREATE TABLE demo_snapshot (
             label text PRIMARY KEY,
             state jsonb NOT NULL,
             frame_json bytea NOT NULL,
             frame_zstd bytea NOT NULL
         );
         -- Frames are stored as they are: the server must not compress
         -- what is already compressed (ADR 0141 D2).
         ALTER TABLE demo_snapshot ALTER frame_json SET STORAGE EXTERNAL,
                                   ALTER frame_zstd SET STORAGE EXTERNAL;",
    )?;

    println!("loom demo: a synthetic agent state of {TURNS} turns (1-4 KB tool outputs over a");
    println!("20-word vocabulary), stored four ways in PostgreSQL 15 (ICU en-US database).\n");
    println!(
        "{:<15} {:>11} {:>11} {:>11} {:>11} {:>10}",
        "state", "JSON text", "JSONB", "0x01 frame", "0x02 frame", "zstd/JSONB"
    );
    for (label, claim_checked) in [("plain", false), ("claim-checked", true)] {
        let state = agent_state(TURNS, claim_checked);
        let frame_json = encode(&state, Codec::None)?;
        let frame_zstd = encode(&state, Codec::Zstd)?;
        db.execute(
            "INSERT INTO demo_snapshot VALUES ($1, $2::text::jsonb, $3, $4)",
            &[&label, &state, &frame_json, &frame_zstd],
        )?;
        let row = db.query_one(
            "SELECT pg_column_size(state), pg_column_size(frame_json), pg_column_size(frame_zstd)
             FROM demo_snapshot WHERE label = $1",
            &[&label],
        )?;
        let (jsonb, json_frame, zstd_frame): (i32, i32, i32) = (row.get(0), row.get(1), row.get(2));
        println!(
            "{label:<15} {:>11} {jsonb:>11} {json_frame:>11} {zstd_frame:>11} {:>9.2}x",
            state.len(),
            f64::from(zstd_frame) / f64::from(jsonb),
        );
    }
    println!("\nBytes as stored (pg_column_size: JSONB after Postgres's own pglz compression,");
    println!("frames with STORAGE EXTERNAL). A 0x02 frame is the exact JSON text, zstd level 3,");
    println!("checksummed; the server decodes it with loom_snapshot_state(frame) -> jsonb.");
    Ok(())
}

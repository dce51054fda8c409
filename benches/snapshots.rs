//! ADR 0141's measurements on this machine, with its synthetic agent state
//! at 50 and 200 turns, plain and claim-checked: stored bytes (raw JSON,
//! JSONB as pg_column_size, the frame as length(state_z)) and the median of
//! 25 loads through PgSnapshotStore of a JSONB row, of a frame decoded in
//! the client, and of a frame decoded in the server. Printed as a table,
//! and drawn to benches/results/snapshot_codec.svg for docs/benchmarks.md.
//!
//! Targets: frame <= 0.80x JSONB bytes plain, <= 0.50x claim-checked; the
//! client-decoded read >= 2.5x as fast as JSONB at 200 turns plain; the
//! server-decoded read no slower than JSONB.

use std::fmt::Write as _;
use std::time::Instant;

use loom_fixtures::agent_state;
use loom_harness::pg_pool;
use loom_harness::{runtime, Cluster};
use pgloom::snapshot_store::{
    Codec, Decode, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};

const READS: usize = 25;

struct Row {
    shape: String,
    raw: usize,
    jsonb: i32,
    frame: i32,
    read_jsonb: f64,
    read_client: f64,
    read_server: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn read_ms<S: SnapshotStore>(store: &S, execution_id: &str) -> f64 {
    for _ in 0..3 {
        store.load_latest(execution_id).await.unwrap().unwrap();
    }
    let mut times = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        std::hint::black_box(store.load_latest(execution_id).await.unwrap().unwrap());
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    median(times)
}

fn chart(rows: &[Row]) -> String {
    let (width, height, left, bottom) = (720.0, 300.0, 60.0, 40.0);
    let max = rows
        .iter()
        .map(|r| r.read_jsonb.max(r.read_server))
        .fold(0.0, f64::max)
        * 1.1;
    let group = (width - left - 20.0) / rows.len() as f64;
    let bar = group / 4.0;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{}" font-family="sans-serif" font-size="11">
<text x="{left}" y="16" font-size="13">snapshot read, median ms (PostgreSQL 15, loopback)</text>
<rect x="{left}" y="26" width="10" height="10" fill="#9e9e9e"/><text x="{}" y="35">JSONB row</text>
<rect x="{}" y="26" width="10" height="10" fill="#2e7d32"/><text x="{}" y="35">frame, decoded in the client</text>
<rect x="{}" y="26" width="10" height="10" fill="#1565c0"/><text x="{}" y="35">frame, decoded in the server</text>
"##,
        height + 20.0,
        left + 14.0,
        left + 100.0,
        left + 114.0,
        left + 290.0,
        left + 304.0,
    );
    for (i, row) in rows.iter().enumerate() {
        let x0 = left + i as f64 * group;
        for (j, (ms, color)) in [
            (row.read_jsonb, "#9e9e9e"),
            (row.read_client, "#2e7d32"),
            (row.read_server, "#1565c0"),
        ]
        .iter()
        .enumerate()
        {
            let h = (height - bottom - 30.0) * ms / max;
            let x = x0 + j as f64 * bar + bar / 2.0;
            let y = height - bottom - h;
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{color}"/>"#,
                bar * 0.9
            );
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{ms:.2}</text>"#,
                x + bar * 0.45,
                y - 3.0
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x0 + group / 2.0,
            height - bottom + 16.0,
            row.shape
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn main() {
    let rt = runtime();
    let db = "loom_bench_snapshots";
    let mut sql = Cluster::Icu.fresh_database(db);
    let store = |codec, decode| {
        let mut options = PgSnapshotStoreOptions::new();
        options.codec(codec).decode(decode);
        rt.block_on(PgSnapshotStore::start(
            pg_pool(&Cluster::Icu.database(db), 2).unwrap(),
            &options,
        ))
        .unwrap()
    };
    let (jsonb_store, client_store, server_store) = (
        store(Codec::None, Decode::Client),
        store(Codec::Zstd, Decode::Client),
        store(Codec::Zstd, Decode::Server),
    );
    let mut rows = Vec::new();
    for turns in [50, 200] {
        for (kind, claim_checked) in [("plain", false), ("claim-checked", true)] {
            let shape = format!("{turns} {kind}");
            let state = JsonText::new(agent_state(turns, claim_checked)).unwrap();
            let save = |store: &PgSnapshotStore, id: &str| {
                let snapshot = NewSnapshot::new(id, "agentLoop$", 1, state.clone());
                rt.block_on(store.save(&snapshot)).unwrap();
            };
            let (jsonb_id, frame_id) = (format!("jsonb {shape}"), format!("frame {shape}"));
            save(&jsonb_store, &jsonb_id);
            save(&client_store, &frame_id);
            let mut bytes = |q: &str, id: &str| -> i32 { sql.query_one(q, &[&id]).unwrap().get(0) };
            let jsonb = bytes(
                "SELECT pg_column_size(state) FROM loom.snapshots WHERE execution_id = $1",
                &jsonb_id,
            );
            let frame = bytes(
                "SELECT length(state_z) FROM loom.snapshots WHERE execution_id = $1",
                &frame_id,
            );
            rows.push(Row {
                shape,
                raw: state.as_str().len(),
                jsonb,
                frame,
                read_jsonb: rt.block_on(read_ms(&jsonb_store, &jsonb_id)),
                read_client: rt.block_on(read_ms(&client_store, &frame_id)),
                read_server: rt.block_on(read_ms(&server_store, &frame_id)),
            });
        }
    }
    println!("\nADR 0141's table on this machine (ICU en-US database, median of {READS} loads):");
    println!(
        "{:<18} {:>9} {:>9} {:>9} {:>11} {:>10} {:>12} {:>12} {:>10} {:>10}",
        "state",
        "raw JSON",
        "JSONB",
        "frame",
        "frame/JSONB",
        "read JSONB",
        "read client",
        "read server",
        "client x",
        "server x"
    );
    for r in &rows {
        println!(
            "{:<18} {:>9} {:>9} {:>9} {:>10.2}x {:>7.2} ms {:>9.2} ms {:>9.2} ms {:>9.2}x {:>9.2}x",
            r.shape,
            r.raw,
            r.jsonb,
            r.frame,
            f64::from(r.frame) / f64::from(r.jsonb),
            r.read_jsonb,
            r.read_client,
            r.read_server,
            r.read_jsonb / r.read_client,
            r.read_jsonb / r.read_server,
        );
    }
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/snapshot_codec.svg");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, chart(&rows)).unwrap();
    println!("chart: {}", path.display());
}

//! Delta snapshots (issue 37), measured on a run saved after every turn:
//! 200 turns of the synthetic agent state of `make demo`, and 200 turns of
//! `prose_state`, whose text is less compressible. Each save is framed
//! three ways, side by side: a zstd keyframe every time (`0x02`, what a
//! zstd store writes today), a delta against the latest keyframe with the
//! default `KeyframePolicy` (`0x03`), and the JSONB PostgreSQL would store
//! (`pg_column_size`, on the icu cluster).
//!
//! Printed: the bytes of the whole run; the median time to frame a save
//! (a delta's includes decoding its keyframe, which a writer needs); the
//! median time to decode the latest state and a random older one (a
//! delta's includes its keyframe's decode). Client side, in this process.
//!
//! Then the run saved in the server (`loom_save_snapshot`), and through
//! pgloom's `PgSnapshotStore` with `Codec::Zstd` beside `Codec::Delta`.
//!
//! Targets: delta bytes <= 0.15x the zstd frames' (moonshot 0.1x); a save
//! no slower than a zstd frame's; the latest load within 1.5x.

use std::time::{Duration, Instant};

use loom_fixtures::{agent_state, prose_state};
use loom_harness::Cluster;
use pgloom::snapshot_store::{
    Codec as StoreCodec, JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions,
    SnapshotQuery, SnapshotStore,
};
use pgloom_core::frame::delta::{decode_with_base, Keyframe, KeyframeBase, KeyframePolicy};
use pgloom_core::frame::{decode, encode, Codec, Format};

const TURNS: usize = 200;

/// One save as a delta store frames it: the frame, and the index of its
/// keyframe (itself for a keyframe).
struct Saved {
    frame: Vec<u8>,
    keyframe: usize,
}

/// Frames every state as a delta store would, and how long each took.
fn frame_run(states: &[String], policy: KeyframePolicy) -> (Vec<Saved>, Vec<Duration>) {
    let mut saved: Vec<Saved> = Vec::with_capacity(states.len());
    let mut took = Vec::with_capacity(states.len());
    let mut current: Option<usize> = None;
    let mut since = 0;
    for state in states {
        let started = Instant::now();
        // What a writer holds: the keyframe's frame, decoded.
        let text = current.map(|k| (k, decode(&saved[k].frame).expect("a keyframe decodes")));
        let base = text.as_ref().map(|(k, text)| KeyframeBase {
            keyframe: Keyframe {
                sequence: *k as i64,
                text,
            },
            frame_bytes: saved[*k].frame.len(),
            deltas_since: since,
        });
        let frame = policy.encode(state, base).expect("a save encodes");
        took.push(started.elapsed());
        let keyframe = match (frame[0] == Format::Delta.byte(), current) {
            (true, Some(k)) => {
                since += 1;
                k
            }
            _ => {
                current = Some(saved.len());
                since = 0;
                saved.len()
            }
        };
        saved.push(Saved { frame, keyframe });
    }
    (saved, took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timed(times: usize, mut f: impl FnMut()) -> Duration {
    median(
        (0..times)
            .map(|_| {
                let started = Instant::now();
                f();
                started.elapsed()
            })
            .collect(),
    )
}

fn load(saved: &[Saved], i: usize) -> String {
    let base = (saved[i].keyframe != i).then(|| saved[saved[i].keyframe].frame.as_slice());
    decode_with_base(&saved[i].frame, base).expect("every save decodes")
}

fn jsonb_bytes(states: &[String]) -> i64 {
    let mut client = Cluster::Icu.connect("postgres");
    states
        .iter()
        .map(|s| {
            client
                .query_one("SELECT pg_column_size($1::text::jsonb)::int8", &[s])
                .expect("pg_column_size")
                .get::<_, i64>(0)
        })
        .sum()
}

fn main() {
    let policy = KeyframePolicy::default();
    println!(
        "\ndelta snapshots: {TURNS} turns saved after every turn, KeyframePolicy {{ max_deltas: {}, max_delta_percent: {} }}",
        policy.max_deltas, policy.max_delta_percent
    );
    println!(
        "{:<10} {:>11} {:>11} {:>11} {:>7} {:>9} {:>11} {:>11} {:>7} {:>11} {:>11} {:>11} {:>11}",
        "state",
        "JSONB",
        "zstd",
        "delta",
        "delta/",
        "keyframes",
        "save zstd",
        "save delta",
        "save",
        "latest zstd",
        "latest delta",
        "older zstd",
        "older delta"
    );
    for (name, make) in [
        (
            "synthetic",
            (|t| agent_state(t, false)) as fn(usize) -> String,
        ),
        ("prose", prose_state),
    ] {
        let states: Vec<String> = (1..=TURNS).map(make).collect();
        let jsonb = jsonb_bytes(&states);
        let full: Vec<Vec<u8>> = states
            .iter()
            .map(|s| encode(s, Codec::Zstd).expect("encodes"))
            .collect();
        let full_bytes: usize = full.iter().map(Vec::len).sum();
        let full_save = median(
            states
                .iter()
                .map(|s| {
                    let started = Instant::now();
                    encode(s, Codec::Zstd).expect("encodes");
                    started.elapsed()
                })
                .collect(),
        );
        let (saved, delta_took) = frame_run(&states, policy);
        let delta_bytes: usize = saved.iter().map(|s| s.frame.len()).sum();
        let keyframes = saved
            .iter()
            .enumerate()
            .filter(|(i, s)| s.keyframe == *i)
            .count();
        for (i, state) in states.iter().enumerate() {
            assert_eq!(&load(&saved, i), state, "save {i} decodes exactly");
        }
        let last = TURNS - 1;
        let latest_full = timed(25, || {
            decode(&full[last]).expect("decodes");
        });
        let latest_delta = timed(25, || {
            load(&saved, last);
        });
        // A fixed spread of older saves, the same for both.
        let older: Vec<usize> = (0..25).map(|k| (k * 7919 + 13) % last).collect();
        let older_full = median(
            older
                .iter()
                .map(|&i| timed(3, || drop(decode(&full[i]).expect("decodes"))))
                .collect(),
        );
        let older_delta = median(
            older
                .iter()
                .map(|&i| timed(3, || drop(load(&saved, i))))
                .collect(),
        );
        let delta_save = median(delta_took);
        println!(
            "{:<10} {:>11} {:>11} {:>11} {:>6.3}x {:>9} {:>11.2?} {:>11.2?} {:>6.2}x {:>11.2?} {:>11.2?} {:>11.2?} {:>11.2?}",
            name,
            jsonb,
            full_bytes,
            delta_bytes,
            delta_bytes as f64 / full_bytes as f64,
            keyframes,
            full_save,
            delta_save,
            delta_save.as_secs_f64() / full_save.as_secs_f64(),
            latest_full,
            latest_delta,
            older_full,
            older_delta,
        );
    }
    println!("(bytes of the whole run; times are medians; a delta's save includes decoding its keyframe, its loads decode the keyframe too)");
    let synthetic: Vec<String> = (1..=TURNS).map(|t| agent_state(t, false)).collect();
    in_the_server(&synthetic);
    through_the_client_stores(&synthetic);
}

/// The same run saved through pgloom's `PgSnapshotStore` on the icu
/// cluster, a zstd store and a delta store side by side (each encodes in
/// the client; the delta store's save is one statement while it holds the
/// keyframe): the frame bytes, the median save, the median load of the
/// latest state and of older ones, decoded in the client.
fn through_the_client_stores(states: &[String]) {
    let db = "loom_bench_delta_client";
    drop(Cluster::Icu.fresh_database(db));
    let rt = loom_harness::runtime();
    let pool = loom_harness::pg_pool(&Cluster::Icu.database(db), 2).expect("a pool");
    let mut client = Cluster::Icu.connect(db);
    println!(
        "\nthrough pgloom's PgSnapshotStore (icu cluster, {TURNS} turns of the synthetic state, decoded in the client):"
    );
    println!(
        "{:<14} {:>12} {:>11} {:>11} {:>11}",
        "store", "frame bytes", "save", "latest", "older"
    );
    // The third is a delta store that keeps no keyframe between saves,
    // as a worker cycling through more executions than its cache holds:
    // each save fetches its keyframe first.
    let kinds: [(&str, StoreCodec, Option<usize>); 3] = [
        ("zstd", StoreCodec::Zstd, None),
        ("delta", StoreCodec::Delta, None),
        ("delta, cold", StoreCodec::Delta, Some(0)),
    ];
    let stores: Vec<PgSnapshotStore> = kinds
        .iter()
        .map(|&(_, codec, cache)| {
            let mut options = PgSnapshotStoreOptions::new();
            options.codec(codec);
            if let Some(bytes) = cache {
                options.keyframe_cache_bytes(bytes);
            }
            rt.block_on(PgSnapshotStore::start(pool.clone(), &options))
                .expect("a store")
        })
        .collect();
    let execution = |k: usize| format!("client-{k}");
    // Interleaved, turn by turn and load by load, as in the server.
    let mut saves: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    for (i, state) in states.iter().enumerate() {
        for (k, store) in stores.iter().enumerate() {
            let snapshot = NewSnapshot::new(
                execution(k),
                "wf",
                i as i64 + 1,
                JsonText::new(state.clone()).expect("JSON"),
            );
            let started = Instant::now();
            rt.block_on(store.save(&snapshot)).expect("a save");
            saves[k].push(started.elapsed());
        }
    }
    let mut latest: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    let mut older: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    for n in 0..25 {
        let sequence = ((n * 7919 + 13) % (TURNS - 1) + 1) as i64;
        for (k, store) in stores.iter().enumerate() {
            let id = execution(k);
            latest[k].push(timed(1, || {
                let loaded = rt.block_on(store.load_latest(&id)).expect("a load");
                assert_eq!(
                    loaded.map(|s| s.state.into_string()).as_ref(),
                    states.last()
                );
            }));
            older[k].push(timed(1, || {
                let loaded = rt
                    .block_on(store.load(&id, SnapshotQuery::At(sequence)))
                    .expect("a load")
                    .expect("saved");
                assert_eq!(loaded.state.as_str(), states[sequence as usize - 1]);
            }));
        }
    }
    let mut rows = Vec::new();
    for (k, (label, _, _)) in kinds.iter().enumerate() {
        let bytes: i64 = client
            .query_one(
                "SELECT sum(octet_length(state_z))::int8 FROM loom.snapshots WHERE execution_id = $1",
                &[&execution(k)],
            )
            .expect("bytes")
            .get(0);
        let (save, latest, older) = (
            median(saves[k].clone()),
            median(latest[k].clone()),
            median(older[k].clone()),
        );
        println!("{label:<14} {bytes:>12} {save:>11.2?} {latest:>11.2?} {older:>11.2?}");
        rows.push((bytes, save, latest, older));
    }
    let full = rows[0];
    for (k, label) in [(1, "delta"), (2, "delta, cold")] {
        let delta = rows[k];
        println!(
            "{label}/zstd: bytes {:.3}x, save {:.2}x, latest {:.2}x, older {:.2}x",
            delta.0 as f64 / full.0 as f64,
            delta.1.as_secs_f64() / full.1.as_secs_f64(),
            delta.2.as_secs_f64() / full.2.as_secs_f64(),
            delta.3.as_secs_f64() / full.3.as_secs_f64(),
        );
    }
}

/// The same run saved through SQL on the icu cluster, each save with
/// `loom_save_snapshot(..., 'zstd')` in one execution and `'delta'` in
/// another (the server encodes both): loom.snapshots' frame bytes, the
/// median save, and the median load of the latest state through
/// `loom_load_snapshot` (decoded to jsonb in the server) and as text.
fn in_the_server(states: &[String]) {
    let db = "loom_bench_delta";
    let mut client = Cluster::Icu.fresh_database(db);
    client
        .batch_execute("SELECT loom_ensure_snapshot_zstd()")
        .expect("frames provisioned");
    println!(
        "\nin the server (loom_save_snapshot on the icu cluster, {TURNS} turns of the synthetic state):"
    );
    println!(
        "{:<7} {:>12} {:>11} {:>14} {:>14}",
        "codec", "frame bytes", "save", "latest jsonb", "latest text"
    );
    const CODECS: [&str; 2] = ["zstd", "delta"];
    // Saves alternate between the codecs, turn by turn, and so do the
    // loads below: both see the same server, caches and neighbours.
    let mut saves: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for (i, state) in states.iter().enumerate() {
        for (c, codec) in CODECS.iter().enumerate() {
            let started = Instant::now();
            client
                .execute(
                    "SELECT loom_save_snapshot($1, 'wf', $2, $3, $4)",
                    &[codec, &(i as i64 + 1), state, codec],
                )
                .expect("a save");
            saves[c].push(started.elapsed());
        }
    }
    // As autovacuum would have by now: a fresh table's estimates
    // would join each delta's keyframe by scanning the execution.
    client
        .batch_execute("ANALYZE loom.snapshots")
        .expect("analyze");
    let mut jsonb: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut text: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..25 {
        for (c, codec) in CODECS.iter().enumerate() {
            jsonb[c].push(timed(1, || {
                client
                    .query_one("SELECT state FROM loom_load_snapshot($1)", &[codec])
                    .expect("a load");
            }));
            text[c].push(timed(1, || {
                client
                    .query_one(
                        "SELECT loom_snapshot_state_text(s.state_z, b.state_z) FROM loom.snapshots s
                         LEFT JOIN loom.snapshots b ON b.execution_id = s.execution_id
                          AND b.sequence = loom_snapshot_base_sequence(s.state_z)
                         WHERE s.execution_id = $1 ORDER BY s.sequence DESC LIMIT 1",
                        &[codec],
                    )
                    .expect("a load");
            }));
        }
    }
    let mut rows = Vec::new();
    for (c, codec) in CODECS.iter().enumerate() {
        let bytes: i64 = client
            .query_one(
                "SELECT sum(octet_length(state_z))::int8 FROM loom.snapshots WHERE execution_id = $1",
                &[codec],
            )
            .expect("bytes")
            .get(0);
        let (save, latest_jsonb, latest_text) = (
            median(saves[c].clone()),
            median(jsonb[c].clone()),
            median(text[c].clone()),
        );
        println!("{codec:<7} {bytes:>12} {save:>11.2?} {latest_jsonb:>14.2?} {latest_text:>14.2?}");
        rows.push((bytes, save, latest_jsonb, latest_text));
    }
    let (full, delta) = (rows[0], rows[1]);
    println!(
        "delta/zstd: bytes {:.3}x, save {:.2}x, latest jsonb {:.2}x, latest text {:.2}x",
        delta.0 as f64 / full.0 as f64,
        delta.1.as_secs_f64() / full.1.as_secs_f64(),
        delta.2.as_secs_f64() / full.2.as_secs_f64(),
        delta.3.as_secs_f64() / full.3.as_secs_f64(),
    );
}

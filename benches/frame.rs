//! Encode and decode of ADR 0141's state shapes, raced against the
//! reference implementation: the `zstd` CLI's own `zstd -b3` on the same
//! bytes, side by side in one run.
//!
//! Criterion prints each bench's throughput; the table at the end prints
//! MB/s (10^6 bytes of JSON text a second, the CLI's unit) for loom and for
//! the CLI, and their ratio. Targets: decode >= 0.9x, encode >= 0.8x.

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use loom_core::frame::{decode, encode, Codec};
use loom_core::synthetic::agent_state;

fn shapes() -> Vec<(String, String)> {
    let mut shapes = Vec::new();
    for turns in [50, 200] {
        for (name, claim_checked) in [("plain", false), ("claim-checked", true)] {
            shapes.push((
                format!("{turns} turns {name}"),
                agent_state(turns, claim_checked),
            ));
        }
    }
    shapes
}

fn criterion_benches(c: &mut Criterion, shapes: &[(String, String)]) {
    for (name, state) in shapes {
        let frame = encode(state, Codec::Zstd).unwrap();
        let mut group = c.benchmark_group(name.as_str());
        group.throughput(Throughput::Bytes(state.len() as u64));
        group.bench_function("encode zstd", |b| {
            b.iter(|| encode(black_box(state), Codec::Zstd))
        });
        group.bench_function("decode zstd", |b| b.iter(|| decode(black_box(&frame))));
        group.bench_function("decode 0x01", |b| {
            let plain = encode(state, Codec::None).unwrap();
            b.iter(|| decode(black_box(&plain)))
        });
        group.finish();
    }
}

/// Best MB/s of `f` over rounds of about 100 ms each, for at least `total`:
/// the same statistic `zstd -b` reports (its fastest round).
fn best_mb_per_s(bytes: usize, total: Duration, mut f: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut best = 0.0f64;
    while started.elapsed() < total {
        let round = Instant::now();
        let mut runs = 0u32;
        while round.elapsed() < Duration::from_millis(100) {
            f();
            runs += 1;
        }
        let secs = round.elapsed().as_secs_f64();
        best = best.max(bytes as f64 * f64::from(runs) / secs / 1e6);
    }
    best
}

/// Microseconds per call at `mb_per_s` for `bytes`.
fn us(bytes: usize, mb_per_s: f64) -> f64 {
    bytes as f64 / mb_per_s
}

/// (compression MB/s, decompression MB/s) that `zstd -b3` reports.
fn zstd_cli_speeds(state: &str) -> (f64, f64) {
    let path = std::env::temp_dir().join(format!("loom-bench-{}.json", std::process::id()));
    std::fs::write(&path, state).unwrap();
    let out = Command::new("zstd")
        .args(["-b3", "-i3", "-q"])
        .arg(&path)
        .output()
        .expect("the zstd CLI (installed by `make deps`)");
    std::fs::remove_file(&path).ok();
    // `zstd -b -q` prints one line: "-3  <size> (<ratio>) <c> MB/s <d> MB/s <file>".
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let tokens: Vec<&str> = text.split_whitespace().collect();
    let speeds: Vec<f64> = tokens
        .windows(2)
        .filter(|pair| pair[1].starts_with("MB/s"))
        .filter_map(|pair| pair[0].parse().ok())
        .collect();
    match speeds[..] {
        [.., compress, decompress] => (compress, decompress),
        _ => panic!("no speeds in `zstd -b3` output: {text}"),
    }
}

fn main() {
    let shapes = shapes();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    criterion_benches(&mut criterion, &shapes);

    println!("\nloom vs the zstd CLI (zstd -b3), MB/s of JSON text, best round of each:");
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>7} | {:>9} {:>9} {:>7}",
        "state", "bytes", "encode", "zstd -b3", "ratio", "decode", "zstd -b3", "ratio"
    );
    for (name, state) in &shapes {
        let frame = encode(state, Codec::Zstd).unwrap();
        let budget = Duration::from_secs(2);
        let ours_encode = best_mb_per_s(state.len(), budget, || {
            black_box(encode(black_box(state), Codec::Zstd).unwrap());
        });
        let ours_decode = best_mb_per_s(state.len(), budget, || {
            black_box(decode(black_box(&frame)).unwrap());
        });
        let (cli_encode, cli_decode) = zstd_cli_speeds(state);
        println!(
            "{name:<26} {:>9} {ours_encode:>9.0} {cli_encode:>9.0} {:>6.2}x | {ours_decode:>9.0} {cli_decode:>9.0} {:>6.2}x",
            state.len(),
            ours_encode / cli_encode,
            ours_decode / cli_decode,
        );
    }
    // Where decode's time goes: the checks that the CLI's decompression
    // does not make (the payload is UTF-8 and one JSON text), timed alone.
    println!("\nof decode's time, the UTF-8 and JSON checks (the CLI checks neither):");
    for (name, state) in &shapes {
        let frame = encode(state, Codec::Zstd).unwrap();
        let budget = Duration::from_secs(1);
        let decode = best_mb_per_s(state.len(), budget, || {
            black_box(decode(black_box(&frame)).unwrap());
        });
        let checks = best_mb_per_s(state.len(), budget, || {
            // What decode runs: one pass, UTF-8 checked inside strings.
            loom_core::json::validate(black_box(state.as_bytes())).unwrap();
        });
        let (decode_us, checks_us) = (us(state.len(), decode), us(state.len(), checks));
        println!(
            "{name:<26} decode {decode_us:>7.1} us, checks {checks_us:>7.1} us ({:.0}%), checks at {checks:.0} MB/s",
            100.0 * checks_us / decode_us
        );
    }
    criterion.final_summary();
}

//! Encode and decode of ADR 0141's state shapes, raced against the
//! reference implementation: the `zstd` CLI's own `zstd -b3` on the same
//! bytes, side by side in one run.
//!
//! Criterion prints each bench's throughput; the table at the end prints
//! MB/s (10^6 bytes of JSON text a second, the CLI's unit) for loom and for
//! the CLI, and their ratio. Targets: decode >= 0.9x, encode >= 0.9x.
//!
//! A second table says where decode's time goes. `zstd -b3` times frames
//! without a content checksum (its frames are 4 bytes shorter than
//! `zstd -3 --check`'s); loom's carry one and decode verifies it (ADR 0141),
//! then checks that the text is UTF-8 JSON. So the table times libzstd alone
//! on a frame like the CLI's and on loom's own, and prints the ratio decode
//! would reach if its checks were free, and how fast they would have to run
//! for 0.9x.

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use loom_fixtures::agent_state;
use pgloom_core::frame::{decode, encode, Codec};

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

/// A level-3 zstd frame of `text` without a content checksum: what
/// `zstd -b3` times.
fn frame_like_the_cli(text: &str) -> Vec<u8> {
    let mut cctx = zstd_safe::CCtx::create();
    cctx.set_parameter(zstd_safe::CParameter::CompressionLevel(3))
        .unwrap();
    cctx.set_parameter(zstd_safe::CParameter::ChecksumFlag(false))
        .unwrap();
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(text.len()));
    cctx.compress2(&mut out, text.as_bytes()).unwrap();
    out
}

/// Best MB/s of libzstd alone inflating `payload` into a reused buffer.
fn inflate_mb_per_s(payload: &[u8], len: usize) -> f64 {
    let mut dctx = zstd_safe::DCtx::create();
    let mut out = Vec::with_capacity(len);
    best_mb_per_s(len, Duration::from_secs(1), || {
        out.clear();
        let written = dctx.decompress(&mut out, black_box(payload)).unwrap();
        assert_eq!(written, len);
    })
}

/// The second table: per state, microseconds of the CLI's decode, of
/// libzstd on a frame like the CLI's and on loom's (checksum verified), of
/// loom's checks alone and of its whole decode; then decode's ratio, the
/// ratio it would reach with free checks, and the checks' speed 0.9x needs.
/// `decode_speeds` are the first table's (the CLI's, loom's) decode MB/s
/// for each shape, so that both tables print the same ratio.
fn where_decode_time_goes(shapes: &[(String, String)], decode_speeds: &[(f64, f64)]) {
    println!("\nwhere decode's time goes, us per state, best round of each:");
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8} {:>16}",
        "state",
        "zstd -b3",
        "inflate",
        "+ XXH64",
        "checks",
        "decode",
        "ratio",
        "ceiling",
        "checks for 0.9x"
    );
    for ((name, state), &(cli, ours)) in shapes.iter().zip(decode_speeds) {
        let bytes = state.len();
        let frame = encode(state, Codec::Zstd).unwrap();
        let (cli_us, decode_us) = (us(bytes, cli), us(bytes, ours));
        let inflate_us = us(bytes, inflate_mb_per_s(&frame_like_the_cli(state), bytes));
        let checked_us = us(bytes, inflate_mb_per_s(&frame[1..], bytes));
        let checks_us = us(
            bytes,
            best_mb_per_s(bytes, Duration::from_secs(1), || {
                // What decode runs: one pass, UTF-8 checked inside strings.
                pgloom_core::json::validate(black_box(state.as_bytes())).unwrap();
            }),
        );
        // 0.9x leaves the checks what is left of CLI time / 0.9.
        let budget_us = cli_us / 0.9 - checked_us;
        let needed = if budget_us > 0.0 {
            format!("{:.1} GB/s", bytes as f64 / budget_us / 1e3)
        } else {
            "unreachable".to_owned()
        };
        println!(
            "{name:<26} {cli_us:>9.1} {inflate_us:>9.1} {checked_us:>9.1} {checks_us:>9.1} {decode_us:>9.1} {:>6.2}x {:>7.2}x {needed:>16}",
            cli_us / decode_us,
            cli_us / checked_us,
        );
    }
    println!(
        "inflate: libzstd on a frame without a checksum, as zstd -b3 times; + XXH64: on loom's\n\
         frame, checksum verified; checks: loom's UTF-8 + JSON checks alone; ceiling: decode's\n\
         ratio if the checks were free; checks for 0.9x: how fast they would have to run"
    );
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
    let mut decode_speeds = Vec::new();
    for (name, state) in &shapes {
        let frame = encode(state, Codec::Zstd).unwrap();
        let budget = Duration::from_secs(2);
        let ours_encode = best_mb_per_s(state.len(), budget, || {
            black_box(encode(black_box(state), Codec::Zstd).unwrap());
        });
        let ours_decode = best_mb_per_s(state.len(), budget, || {
            black_box(decode(black_box(&frame)).unwrap());
        });
        let (cli_encode, cli) = zstd_cli_speeds(state);
        decode_speeds.push((cli, ours_decode));
        println!(
            "{name:<26} {:>9} {ours_encode:>9.0} {cli_encode:>9.0} {:>6.2}x | {ours_decode:>9.0} {cli:>9.0} {:>6.2}x",
            state.len(),
            ours_encode / cli_encode,
            ours_decode / cli,
        );
    }
    where_decode_time_goes(&shapes, &decode_speeds);
    criterion.final_summary();
}

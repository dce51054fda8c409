//! ADR 0108 D2's table on this machine: paging 1M executions (2M events,
//! loaded with COPY) on an en-US column with COLLATE "C" stated in the
//! query vs the converted COLLATE "C" column, the plan of each, a full pass
//! at 1M and 2M executions (to show it is linear), the append cost of 100k
//! events in 3 rounds on either column, and how long the conversion holds
//! its lock. Printed, not asserted.
//!
//! Targets: p50 <= 1 ms per 1000-id page converted, a linear full pass,
//! appends on "C" >= 1.2x as fast as on en-US.

use std::time::{Duration, Instant};

use loom_harness::bench_support::record;
use loom_harness::{
    copy_executions, mixed_case_id as execution_id, pager_plan, upgrade_extension, Cluster,
};
use postgres::Client;

const PAGE: i32 = 1000;
const SAMPLES: usize = 21;

fn load(client: &mut Client, from: u64, executions: u64) -> Duration {
    let started = Instant::now();
    copy_executions(client, (from..from + executions).map(execution_id));
    started.elapsed()
}

fn page(client: &mut Client, after: Option<&str>) -> Vec<String> {
    client
        .query(
            "SELECT * FROM loom_list_executions($1, $2)",
            &[&after, &PAGE],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// p50 of one page after cursors spread over the id space.
fn page_p50(client: &mut Client, executions: u64) -> f64 {
    let mut times: Vec<f64> = (0..SAMPLES as u64)
        .map(|k| {
            let cursor = execution_id(k * executions / SAMPLES as u64);
            let started = Instant::now();
            let ids = page(client, Some(&cursor));
            assert!(!ids.is_empty() || k > 0);
            ms(started.elapsed())
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A full pass over every id, page by page with the last id as cursor.
fn full_pass(client: &mut Client) -> (u64, Duration, f64) {
    let started = Instant::now();
    let mut after: Option<String> = None;
    let (mut count, mut pages) = (0u64, Vec::new());
    loop {
        let t = Instant::now();
        let ids = page(client, after.as_deref());
        pages.push(ms(t.elapsed()));
        count += ids.len() as u64;
        if ids.len() < PAGE as usize {
            break;
        }
        after = ids.last().cloned();
    }
    pages.sort_by(f64::total_cmp);
    (count, started.elapsed(), pages[pages.len() / 2])
}

/// 3 rounds of 100k appended events in batches of 1000, each round
/// removed afterwards; the median round.
fn append_rounds(client: &mut Client) -> Duration {
    let mut rounds: Vec<Duration> = (0..3)
        .map(|round| {
            let started = Instant::now();
            for batch in 0..100u64 {
                let ids: Vec<String> = (0..1000u64)
                    .map(|i| format!("append-{round}-{}", execution_id(batch * 1000 + i)))
                    .collect();
                let sequences = vec![1i64; ids.len()];
                let kinds = vec!["step"; ids.len()];
                let payloads = vec![r#"{"n":1}"#; ids.len()];
                client
                    .execute(
                        "SELECT loom_append_events($1, $2, $3, $4::text[]::jsonb[])",
                        &[&ids, &sequences, &kinds, &payloads],
                    )
                    .unwrap();
            }
            let took = started.elapsed();
            client
                .batch_execute("DELETE FROM loom.events WHERE execution_id LIKE 'append-%'")
                .unwrap();
            client.batch_execute("VACUUM loom.events").unwrap();
            took
        })
        .collect();
    rounds.sort();
    rounds[1]
}

fn main() {
    let executions: u64 = std::env::var("LOOM_BENCH_EXECUTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let mut client = Cluster::Icu.fresh_database_at("loom_bench_order", "0.1.0");
    println!(
        "\nADR 0108 D2 on this machine: ICU en-US database, {executions} executions / {} events",
        2 * executions
    );
    let loaded = load(&mut client, 0, executions);
    println!("loaded with COPY in {:.1} s", loaded.as_secs_f64());

    let unconverted_p50 = page_p50(&mut client, executions);
    let unconverted_plan = pager_plan(&mut client).replace('\n', " / ");
    let enus_appends = append_rounds(&mut client);

    // The conversion as operators run it: the documented upgrade to 0.2.0,
    // whose ALTERs hold ACCESS EXCLUSIVE until it commits.
    let started = Instant::now();
    upgrade_extension(&mut client, "0.2.0").unwrap();
    let conversion = started.elapsed();
    let collation: String = client
        .query_one(
            "SELECT collation_name FROM information_schema.columns
             WHERE table_schema = 'loom' AND table_name = 'events' AND column_name = 'execution_id'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(collation, "C", "the bench needs the conversion to have run");

    let converted_p50 = page_p50(&mut client, executions);
    let converted_plan = pager_plan(&mut client).replace('\n', " / ");
    let c_appends = append_rounds(&mut client);
    let (count, pass, pass_p50) = full_pass(&mut client);
    assert_eq!(count, executions, "a full pass sees every id once");

    load(&mut client, executions, executions);
    let (count2, pass2, pass2_p50) = full_pass(&mut client);
    assert_eq!(count2, 2 * executions);

    println!("\n{:<38} {:>14} {:>14}", "", "en-US column", "\"C\" column");
    println!(
        "{:<38} {:>11.2} ms {:>11.2} ms",
        "p50 per 1000-id page", unconverted_p50, converted_p50
    );
    println!(
        "{:<38} {:>11.2} s {:>12.2} s   (\"C\" {:.2}x faster)",
        "append 100k events (median of 3)",
        enus_appends.as_secs_f64(),
        c_appends.as_secs_f64(),
        enus_appends.as_secs_f64() / c_appends.as_secs_f64()
    );
    record(
        "paging: p50 per 1000-id page, en-US column, ms",
        &format!("{unconverted_p50:.2}"),
    );
    record(
        "paging: p50 per 1000-id page, \"C\" column, ms",
        &format!("{converted_p50:.2}"),
    );
    record(
        "appends on \"C\" vs en-US",
        &format!(
            "{:.2}x",
            enus_appends.as_secs_f64() / c_appends.as_secs_f64()
        ),
    );
    println!("plan on en-US: {unconverted_plan}");
    println!("plan on \"C\":   {converted_plan}");
    println!(
        "conversion (ALTER EXTENSION loom UPDATE TO '0.2.0': refs.name, events.execution_id, ANALYZE): {:.2} s under ACCESS EXCLUSIVE",
        conversion.as_secs_f64()
    );
    println!(
        "full pass, {count} ids: {:.2} s (p50 page {pass_p50:.2} ms); {count2} ids: {:.2} s (p50 page {pass2_p50:.2} ms): {:.2}x the time for 2x the ids",
        pass.as_secs_f64(),
        pass2.as_secs_f64(),
        pass2.as_secs_f64() / pass.as_secs_f64()
    );
    record(
        "full pass: time for 2x the ids",
        &format!("{:.2}x", pass2.as_secs_f64() / pass.as_secs_f64()),
    );
}

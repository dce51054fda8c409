//! A feed consumer process for the crash test (tests/server/feed.rs): it
//! reads pages after its acknowledged position, prints each event, then
//! `batch`, waits 200 ms (a window to kill it in, mid-batch), and
//! acknowledges the page, printing `acked <position>`. It exits once it
//! has acknowledged the page holding the last event it is told of, and
//! fails after 60 s without a new event.
//!
//! Usage: `loom-feed-consumer <conninfo> <consumer> <batch size> <last id> <last sequence>`

use std::io::Write;
use std::time::{Duration, Instant};

use pgloom::event_store::PgFeed;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, conninfo, consumer, batch, last_id, last_sequence] = &args[..] else {
        return Err("usage: loom-feed-consumer <conninfo> <consumer> <batch size> <last id> <last sequence>".into());
    };
    let (batch, last_sequence): (usize, i64) = (batch.parse()?, last_sequence.parse()?);
    let feed = PgFeed::new(loom_harness::pg_pool(conninfo, 1)?);
    feed.create_consumer(consumer, None).await?;
    let mut after = feed.acknowledged(consumer).await?;
    let mut out = std::io::stdout().lock();
    let mut last_new = Instant::now();
    loop {
        let page = feed.read(after.as_ref(), batch).await?;
        let events = page.events;
        let Some(acked) = page.next_after.filter(|_| !events.is_empty()) else {
            if last_new.elapsed() > Duration::from_secs(60) {
                return Err("no new event for 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        last_new = Instant::now();
        for item in &events {
            writeln!(
                out,
                "event {} {}",
                item.event.execution_id, item.event.sequence
            )?;
        }
        writeln!(out, "batch")?;
        out.flush()?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        feed.ack(consumer, &acked).await?;
        writeln!(out, "acked {acked}")?;
        out.flush()?;
        if events
            .iter()
            .any(|item| &item.event.execution_id == last_id && item.event.sequence == last_sequence)
        {
            return Ok(());
        }
        after = Some(acked);
    }
}

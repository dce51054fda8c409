//! A service's log, wherever configuration puts it. The code below never
//! changes; only LOOM_STORE does:
//!
//! ```sh
//! cargo run -p pgloom --example grow                                  # SQLite in memory
//! LOOM_STORE=sqlite:/tmp/app.db cargo run -p pgloom --example grow    # a SQLite file
//! LOOM_STORE="postgres:host=127.0.0.1 port=25432 user=postgres dbname=app" cargo run -p pgloom --example grow
//! LOOM_STORE="postgres:host=127.0.0.1 port=25433 user=postgres dbname=app;postgres:host=127.0.0.1 port=25434 user=postgres dbname=app;postgres:host=127.0.0.1 port=25435 user=postgres dbname=app" \
//!     cargo run -p pgloom --example grow                              # three shards
//! ```
//!
//! (Each Postgres database needs `CREATE EXTENSION loom`; `migrate` does it.)

use futures::TryStreamExt;
use pgloom::event_store::{iterate_execution_ids, Event, EventStore, StoreConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config: StoreConfig = std::env::var("LOOM_STORE")
        .unwrap_or_else(|_| "sqlite::memory:".to_owned())
        .parse()?;
    if let StoreConfig::Postgres(conninfo) = &config {
        pgloom::migrate::migrate(conninfo, &Default::default()).await?;
    }
    if let StoreConfig::Sharded(shards) = &config {
        for shard in shards {
            if let StoreConfig::Postgres(conninfo) = shard {
                pgloom::migrate::migrate(conninfo, &Default::default()).await?;
            }
        }
    }
    let store = config.open()?;
    let run = std::process::id();
    for (i, workflow) in ["a_b", "A1", "a-b", "B"].iter().enumerate() {
        let id = format!("{workflow}-{run}");
        store
            .append(&[
                Event::new(
                    &id,
                    1,
                    "started",
                    serde_json::json!({ "workflow": workflow }),
                ),
                Event::new(&id, 2, "step", serde_json::json!({ "n": i })),
            ])
            .await?;
    }
    let ids: Vec<String> = iterate_execution_ids(&store, 2).try_collect().await?;
    println!("{} executions, in code point order:", ids.len());
    for id in ids.iter().filter(|id| id.ends_with(&format!("-{run}"))) {
        println!("  {id}: {} events", store.read_events(id).await?.len());
    }
    Ok(())
}

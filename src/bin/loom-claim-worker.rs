//! A worker process for the zombie test (tests/server/claims.rs): it
//! claims one execution, says so on stdout, and waits for a line on stdin
//! (the test stops it with SIGSTOP meanwhile, past its lease). Then it
//! writes as the holder it believes it still is: an append, a snapshot
//! save and a ref put, each in its own transaction that checks its fencing
//! token first, and prints each outcome's name.
//!
//! Usage: `loom-claim-worker <conninfo> <queue> <execution id> <sequence>`

use std::io::BufRead;
use std::time::Duration;

use pgloom::branch_registry::{BranchRegistry, PgBranchRegistry};
use pgloom::claims::{ClaimOptions, PgClaims};
use pgloom::event_store::{Event, EventStore, PgEventStore};
use pgloom::snapshot_store::{
    JsonText, NewSnapshot, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};

fn outcome(result: pgloom::Result<()>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(e) => e.variant_name().to_owned(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, conninfo, queue, execution_id, sequence] = &args[..] else {
        return Err("usage: loom-claim-worker <conninfo> <queue> <execution id> <sequence>".into());
    };
    let sequence: i64 = sequence.parse()?;
    let pool = loom_harness::pg_pool(conninfo, 2)?;
    let claims = PgClaims::new(
        pool.clone(),
        ClaimOptions::new(queue.as_str(), format!("zombie-{}", std::process::id()))
            .lease(Duration::from_secs(1)),
    );
    let claim = claims.claim(1).await?.pop().ok_or("nothing to claim")?;
    assert_eq!(&claim.execution_id, execution_id);
    println!("claimed {}", claim.fence);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;

    let events = PgEventStore::new(pool.clone());
    let snapshots = PgSnapshotStore::new(pool.clone(), &PgSnapshotStoreOptions::new())?;
    let refs = PgBranchRegistry::new(pool.clone());
    let mut conn = pool.as_ref().get().await?;
    let append = async {
        let tx = conn.transaction().await?;
        claims.check_fence(&tx, &claim).await?;
        events
            .on(&tx)
            .append(&[Event::new(
                execution_id.as_str(),
                sequence,
                "zombie",
                serde_json::json!({}),
            )])
            .await?;
        tx.commit().await?;
        Ok(())
    }
    .await;
    println!("append {}", outcome(append));
    let save = async {
        let tx = conn.transaction().await?;
        claims.check_fence(&tx, &claim).await?;
        let state = JsonText::new(r#"{"by":"zombie"}"#.to_owned())?;
        snapshots
            .on(&tx)
            .save(&NewSnapshot::new(
                execution_id.as_str(),
                "wf",
                sequence,
                state,
            ))
            .await?;
        tx.commit().await?;
        Ok(())
    }
    .await;
    println!("save {}", outcome(save));
    let put = async {
        let tx = conn.transaction().await?;
        claims.check_fence(&tx, &claim).await?;
        refs.on(&tx)
            .put_ref("zombie-ref", execution_id, sequence)
            .await?;
        tx.commit().await?;
        Ok(())
    }
    .await;
    println!("put_ref {}", outcome(put));
    let mut claim = claim;
    println!("renew {}", outcome(claims.renew(&mut claim).await));
    Ok(())
}

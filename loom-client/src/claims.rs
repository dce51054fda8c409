//! Claims with fencing (docs/claims.md): which executions a worker runs
//! now, and a token that stops a worker that lost its turn from writing.
//!
//! An execution is **scheduled** ([`PgClaims::schedule`]) for now or for a
//! time (a timer). Workers **claim** a batch of due executions
//! ([`PgClaims::claim`]) for a lease, **renew** the lease while they work
//! ([`PgClaims::renew`]) and **complete** the claim
//! ([`PgClaims::complete`]), optionally with the next time it should run.
//! A lease that lapses (a worker that crashed, or was paused past it) is
//! claimable again by any worker.
//!
//! Every claim carries a **fencing token** ([`Claim::fence`]), higher than
//! every token before it. A worker's writes call
//! [`PgClaims::check_fence`] first, in their own transaction: once another
//! worker holds a newer token they fail with [`Error::FencedOut`]
//! (SQLSTATE `LM001`), and nothing of the transaction is written. The
//! check holds the claim until that transaction ends, so no new claim can
//! slip between the check and the commit; the transaction may idle no
//! longer than what is left of the lease (a worker paused inside it loses
//! its session rather than blocking the execution for ever).
//!
//! ```no_run
//! # async fn f(pool: pgloom::PgPool) -> pgloom::Result<()> {
//! use std::time::Duration;
//! use pgloom::claims::{ClaimOptions, PgClaims};
//! use pgloom::event_store::{Event, EventStore, PgEventStore};
//!
//! let claims = PgClaims::new(pool.clone(), ClaimOptions::new("orders", "worker-1").lease(Duration::from_secs(30)));
//! let events = PgEventStore::new(pool.clone());
//! claims.schedule("order-42", None).await?;
//! for claim in claims.claim(8).await? {
//!     let mut conn = pool.as_ref().get().await?;
//!     let tx = conn.transaction().await?;
//!     claims.check_fence(&tx, &claim).await?; // Error::FencedOut once another worker took it
//!     events.on(&tx).append(&[Event::new(&claim.execution_id, 1, "ran", serde_json::json!({}))]).await?;
//!     tx.commit().await?;
//!     claims.complete(&claim, None).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! [`PgClaims::run`] is the loop a worker runs: claim, run a handler,
//! renew while it runs, complete.

use std::future::Future;
use std::pin::pin;
use std::time::{Duration, SystemTime};

use futures::future::{select, Either};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio_postgres::types::Type;

use crate::pg_executor::{Conn, PgConnection};
use crate::pg_row::column;
use crate::pg_schema::SchemaCell;
use crate::{Error, PgPool, Result};

const SCHEDULE: &str = "SELECT @extschema@.loom_schedule($1::pg_catalog.text, $2::pg_catalog.timestamptz, $3::pg_catalog.text)";
const CLAIM: &str = "SELECT execution_id, fence, lease_until, was_due_at, lapsed_holder
     FROM @extschema@.loom_claim($1::pg_catalog.text, $2::pg_catalog.text,
                                 pg_catalog.make_interval(secs => $3::pg_catalog.float8), $4::pg_catalog.int4)";
const RENEW: &str = "SELECT @extschema@.loom_renew($1::pg_catalog.text, $2::pg_catalog.int8,
                                                   pg_catalog.make_interval(secs => $3::pg_catalog.float8))";
const COMPLETE: &str = "SELECT @extschema@.loom_complete($1::pg_catalog.text, $2::pg_catalog.int8, $3::pg_catalog.timestamptz)";
const CHECK_FENCE: &str =
    "SELECT @extschema@.loom_check_fence($1::pg_catalog.text, $2::pg_catalog.int8)";
const COUNTS: &str =
    "SELECT queue, due, claimed, lapsed, scheduled FROM @extschema@.loom_claim_counts()";

/// The SQLSTATE loom raises for a write under a stale fencing token.
pub const FENCED_OUT_SQLSTATE: &str = "LM001";

/// Which queue a [`PgClaims`] claims from, as which worker, for how long.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimOptions {
    /// The queue: a name runtimes use to split work (a workflow type, a
    /// tenant's lane). Executions are scheduled into one.
    pub queue: String,
    /// This worker's name, kept with each claim it holds (a host and pid
    /// say where a lapsed lease was held).
    pub worker: String,
    /// How long a claim lasts unless renewed: from 1 second to 1 day.
    pub lease: Duration,
}

impl ClaimOptions {
    /// Claims of `queue` by `worker`, under a 30 s lease.
    ///
    /// ```
    /// let options = pgloom::claims::ClaimOptions::new("orders", "host-a:4242");
    /// assert_eq!(options.lease, std::time::Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn new(queue: impl Into<String>, worker: impl Into<String>) -> Self {
        ClaimOptions {
            queue: queue.into(),
            worker: worker.into(),
            lease: Duration::from_secs(30),
        }
    }

    /// The lease each claim and renewal takes.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

/// One execution a worker holds: what [`PgClaims::claim`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The execution to run.
    pub execution_id: String,
    /// The fencing token: higher than every earlier claim's, of this
    /// execution and of any other.
    pub fence: i64,
    /// When the lease ends unless renewed (the server's clock).
    pub lease_until: SystemTime,
    /// When the execution was due: its schedule, or the end of a lease that lapsed.
    pub was_due_at: SystemTime,
    /// The worker whose lease lapsed, when this claim took it over.
    pub lapsed_holder: Option<String>,
}

/// Per queue, the executions in flight ([`PgClaims::counts`], and
/// `loom status`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueCounts {
    /// The queue.
    pub queue: String,
    /// Due now, not claimed.
    pub due: i64,
    /// Claimed under a live lease.
    pub claimed: i64,
    /// Claimed under a lease that lapsed: claimable again.
    pub lapsed: i64,
    /// Scheduled for later (timers).
    pub scheduled: i64,
}

/// What a handler of [`PgClaims::run`] says when it is done with a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: not due again until scheduled again.
    Done,
    /// Run it again at this time (a timer: `sleep` in a workflow).
    RunAt(SystemTime),
}

/// Claims over a PostgreSQL database with loom 0.16.0 or later (either
/// flavour): see the [module](self).
#[derive(Clone)]
pub struct PgClaims {
    pool: PgPool,
    schema: SchemaCell,
    options: ClaimOptions,
}

impl std::fmt::Debug for PgClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClaims")
            .field("options", &self.options)
            .field("pool", &self.pool.status())
            .finish()
    }
}

/// A duration as the float seconds the SQL casts to an interval.
fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// `e`, as [`Error::FencedOut`] when the server raised `LM001`.
fn fenced(e: tokio_postgres::Error, execution_id: &str, fence: i64) -> Error {
    if e.code().map(tokio_postgres::error::SqlState::code) == Some(FENCED_OUT_SQLSTATE) {
        Error::FencedOut {
            execution_id: execution_id.to_owned(),
            fence,
        }
    } else {
        e.into()
    }
}

impl PgClaims {
    /// Claims over `pool`, as `options` say.
    #[must_use]
    pub fn new(pool: PgPool, options: ClaimOptions) -> Self {
        PgClaims {
            pool,
            schema: SchemaCell::new(),
            options,
        }
    }

    /// The options this worker claims with.
    #[must_use]
    pub fn options(&self) -> &ClaimOptions {
        &self.options
    }

    async fn conn(&self) -> Result<Conn<'static>> {
        self.pool.conn().await
    }

    /// Marks `execution_id` runnable at `run_at` (`None`: now): a new
    /// execution in this queue, one scheduled before in the queue it is
    /// in (a signal from another queue's worker never moves it). An execution not held keeps the earlier of its due time and
    /// `run_at`; one a worker holds is due again once that worker
    /// completes. Returns when it will be due (the server's clock).
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`] with `22023` for an empty id, and `42501` for a
    /// role that is not a writer.
    pub async fn schedule(
        &self,
        execution_id: &str,
        run_at: Option<SystemTime>,
    ) -> Result<SystemTime> {
        let client = self.conn().await?;
        let row = client
            .query_one(
                &self.schema.sql(&client, SCHEDULE).await?,
                &[
                    (&execution_id, Type::TEXT),
                    (&run_at, Type::TIMESTAMPTZ),
                    (&self.options.queue, Type::TEXT),
                ],
            )
            .await?;
        column(&row, 0)
    }

    /// Claims up to `max` (1 to 1000) due executions of the queue, oldest
    /// due first, each with a new fencing token and a lease of
    /// [`ClaimOptions::lease`]. Workers never wait on each other (`SKIP
    /// LOCKED`); an empty batch means nothing is due.
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`] with `22023` for a `max` or lease out of range,
    /// and `42501` for a role that is not a writer.
    pub async fn claim(&self, max: usize) -> Result<Vec<Claim>> {
        let max = i32::try_from(max).unwrap_or(i32::MAX);
        let client = self.conn().await?;
        let rows = client
            .query(
                &self.schema.sql(&client, CLAIM).await?,
                &[
                    (&self.options.queue, Type::TEXT),
                    (&self.options.worker, Type::TEXT),
                    (&seconds(self.options.lease), Type::FLOAT8),
                    (&max, Type::INT4),
                ],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(Claim {
                    execution_id: column(row, 0)?,
                    fence: column(row, 1)?,
                    lease_until: column(row, 2)?,
                    was_due_at: column(row, 3)?,
                    lapsed_holder: column(row, 4)?,
                })
            })
            .collect()
    }

    /// Extends `claim`'s lease to at least now plus [`ClaimOptions::lease`],
    /// and records its new end in it.
    ///
    /// # Errors
    ///
    /// [`Error::FencedOut`] once another worker claimed the execution (or
    /// this claim was completed): stop working on it.
    pub async fn renew(&self, claim: &mut Claim) -> Result<()> {
        let client = self.conn().await?;
        let sql = self.schema.sql(&client, RENEW).await?;
        let row = client
            .query_one(
                &sql,
                &[
                    (&claim.execution_id, Type::TEXT),
                    (&claim.fence, Type::INT8),
                    (&seconds(self.options.lease), Type::FLOAT8),
                ],
            )
            .await
            .map_err(|e| fenced(e, &claim.execution_id, claim.fence))?;
        claim.lease_until = column(&row, 0)?;
        Ok(())
    }

    /// Ends `claim`: the execution is due again at `next_run_at`, or at a
    /// [`PgClaims::schedule`] made while it was held, the earlier; with
    /// neither, once scheduled again. Returns when it is next due.
    ///
    /// # Errors
    ///
    /// [`Error::FencedOut`] once another worker claimed the execution (or
    /// this claim was completed already).
    pub async fn complete(
        &self,
        claim: &Claim,
        next_run_at: Option<SystemTime>,
    ) -> Result<Option<SystemTime>> {
        let client = self.conn().await?;
        let sql = self.schema.sql(&client, COMPLETE).await?;
        let row = client
            .query_one(
                &sql,
                &[
                    (&claim.execution_id, Type::TEXT),
                    (&claim.fence, Type::INT8),
                    (&next_run_at, Type::TIMESTAMPTZ),
                ],
            )
            .await
            .map_err(|e| fenced(e, &claim.execution_id, claim.fence))?;
        column(&row, 0)
    }

    /// Checks, on the caller's transaction, that `claim`'s token is still
    /// the execution's newest, and holds the claim until that transaction
    /// ends: call it first in the transaction of each write made under the
    /// claim (an append, a snapshot save, a ref put, through the stores'
    /// `on(&tx)`), so that a worker that lost the claim writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::FencedOut`] once another worker claimed the execution. The
    /// transaction is then aborted, as after any failed statement: roll it
    /// back.
    pub async fn check_fence(&self, connection: &impl PgConnection, claim: &Claim) -> Result<()> {
        let client = Conn::Caller(connection.pg_client());
        let sql = self.schema.sql(&client, CHECK_FENCE).await?;
        client
            .query(
                &sql,
                &[
                    (&claim.execution_id, Type::TEXT),
                    (&claim.fence, Type::INT8),
                ],
            )
            .await
            .map_err(|e| fenced(e, &claim.execution_id, claim.fence))?;
        Ok(())
    }

    /// Per queue, the executions due, claimed, lapsed and scheduled.
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`] with `42501` for a role that may not read
    /// `loom.claims`.
    pub async fn counts(&self) -> Result<Vec<QueueCounts>> {
        let client = self.conn().await?;
        let rows = client
            .query(&self.schema.sql(&client, COUNTS).await?, &[])
            .await?;
        rows.iter()
            .map(|row| {
                Ok(QueueCounts {
                    queue: column(row, 0)?,
                    due: column(row, 1)?,
                    claimed: column(row, 2)?,
                    lapsed: column(row, 3)?,
                    scheduled: column(row, 4)?,
                })
            })
            .collect()
    }

    /// The worker loop: claims up to `concurrency` executions at a time,
    /// runs `handler` on each, renews each lease every third of it while
    /// the handler runs, and completes the claim as the handler says
    /// ([`Outcome`]). When nothing is due it waits `poll` before claiming
    /// again. It returns once `shutdown` resolves and the handlers running
    /// then have finished, or with the first error of a claim itself.
    ///
    /// A handler whose claim is lost (a renewal says [`Error::FencedOut`])
    /// is dropped at its next await: its writes, which check the fence,
    /// are refused anyway. A handler that fails has its claim completed
    /// with a retry `poll` later. Cancel safety: dropping this future drops
    /// the running handlers at their await points and completes nothing;
    /// their executions are claimable again when their leases lapse, and
    /// the fence keeps the dropped handlers' writes out.
    ///
    /// ```no_run
    /// # async fn f(claims: pgloom::claims::PgClaims, stop: tokio::sync::oneshot::Receiver<()>) -> pgloom::Result<()> {
    /// use pgloom::claims::Outcome;
    /// claims
    ///     .run(8, std::time::Duration::from_millis(200), |claim| async move {
    ///         println!("running {}", claim.execution_id);
    ///         Ok(Outcome::Done)
    ///     }, async { stop.await.ok(); })
    ///     .await
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The first error of a claim, renewal or completion that is not
    /// [`Error::FencedOut`] (a lost connection, a revoked grant).
    pub async fn run<H, F>(
        &self,
        concurrency: usize,
        poll: Duration,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()>
    where
        H: Fn(Claim) -> F,
        F: Future<Output = Result<Outcome>>,
    {
        let concurrency = concurrency.clamp(1, 1000);
        let mut running = FuturesUnordered::new();
        let mut shutdown = pin!(shutdown);
        let mut stopping = false;
        loop {
            if !stopping && running.len() < concurrency {
                for claim in self.claim(concurrency - running.len()).await? {
                    running.push(self.run_one(claim, &handler, poll));
                }
            }
            if stopping && running.is_empty() {
                return Ok(());
            }
            // Wait for a handler to finish, the poll interval (when there
            // is room for more claims), or the shutdown signal.
            let idle = running.len() < concurrency && !stopping;
            let wake = async {
                if idle {
                    tokio::time::sleep(poll).await;
                } else {
                    futures::future::pending::<()>().await;
                }
            };
            let next = async {
                if running.is_empty() {
                    futures::future::pending::<Option<Result<()>>>().await
                } else {
                    running.next().await
                }
            };
            let (next, wake) = (pin!(next), pin!(wake));
            let waiting = select(next, wake);
            let finished = if stopping {
                match waiting.await {
                    Either::Left((finished, _)) => finished,
                    Either::Right(_) => None,
                }
            } else {
                match select(waiting, shutdown.as_mut()).await {
                    Either::Left((Either::Left((finished, _)), _)) => finished,
                    Either::Left((Either::Right(_), _)) => None,
                    Either::Right(_) => {
                        stopping = true;
                        None
                    }
                }
            };
            if let Some(result) = finished {
                result?;
            }
        }
    }

    /// One claim's run: the handler, with a renewal every third of the
    /// lease; then its completion. The handler is polled while a renewal
    /// is in flight, so a renewal that waits (for a pooled connection the
    /// handler holds, say) never waits on the handler.
    async fn run_one<H, F>(&self, mut claim: Claim, handler: &H, retry: Duration) -> Result<()>
    where
        H: Fn(Claim) -> F,
        F: Future<Output = Result<Outcome>>,
    {
        let mut work = pin!(handler(claim.clone()));
        let every = self.options.lease / 3;
        let outcome = loop {
            let renewal = match select(work.as_mut(), pin!(tokio::time::sleep(every))).await {
                Either::Left((outcome, _)) => break outcome,
                Either::Right(_) => {
                    let renewing = pin!(self.renew(&mut claim));
                    match select(work.as_mut(), renewing).await {
                        Either::Left((outcome, _)) => break outcome,
                        Either::Right((renewal, _)) => renewal,
                    }
                }
            };
            match renewal {
                Ok(()) => {}
                Err(Error::FencedOut { .. }) => {
                    tracing::warn!(execution_id = %claim.execution_id, fence = claim.fence, "claim lost; its handler is dropped");
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        };
        let next = match outcome {
            Ok(Outcome::Done) => None,
            Ok(Outcome::RunAt(at)) => Some(at),
            Err(e) => {
                tracing::warn!(execution_id = %claim.execution_id, error = %e, "handler failed; retried after the poll interval");
                Some(SystemTime::now() + retry)
            }
        };
        match self.complete(&claim, next).await {
            Ok(_) | Err(Error::FencedOut { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

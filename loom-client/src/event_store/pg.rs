//! An event store over loom's PostgreSQL extension, through its SQL API
//! (`loom_append_events`, `loom_read_events`, `loom_list_executions`,
//! `loom_delete_events`, and retention's `loom_prune_events` and
//! `loom_delete_execution`) and a connection pool, with statements prepared
//! once per connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use deadpool_postgres::{Object, Pool};

use super::{check_limit, Event, EventStore, Page, PgPoolOptions};
use crate::{Error, Result};

const APPEND: &str = "SELECT loom_append_events($1, $2, $3, $4)";
const READ: &str = "SELECT sequence, kind, payload FROM loom_read_events($1, $2, $3)";
const DELETE: &str = "SELECT loom_delete_events($1, $2, $3)";
const PRUNE: &str = "SELECT loom_prune_events($1, $2)";
const DELETE_EXECUTION: &str = "SELECT loom_delete_execution($1, $2)";
const LIST: &str = "SELECT * FROM loom_list_executions($1, $2)";
/// What a Citus store checks once: loom's tables laid out as
/// `loom_distribute` makes them (false, or no such function before 0.5.0,
/// on anything else).
const IS_DISTRIBUTED: &str = "SELECT to_regprocedure('loom_is_distributed()') IS NOT NULL
         AND loom_is_distributed()";
/// Which of a batch's events already existed, after a unique violation.
const FIND_DUPLICATE: &str = "SELECT e.execution_id, e.sequence FROM loom.events e
     JOIN unnest($1::text[], $2::bigint[]) AS b(execution_id, sequence)
       ON e.execution_id = b.execution_id AND e.sequence = b.sequence
     LIMIT 1";

/// An [`EventStore`] in a PostgreSQL database with `CREATE EXTENSION loom`
/// (its functions on the connection's search_path).
///
/// The same store serves one server and a Citus coordinator: loom's SQL
/// functions are the contract on both. [`PgEventStore::connect_citus`]
/// adds one check, that the database is distributed.
#[derive(Clone)]
pub struct PgEventStore {
    pool: Pool,
    /// Set for a store that must find loom distributed on Citus; true once
    /// it has.
    citus: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for PgEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgEventStore")
            .field("pool", &self.pool.status())
            .field("citus", &self.citus.is_some())
            .finish()
    }
}

impl PgEventStore {
    /// A store over `pool`.
    #[must_use]
    pub fn new(pool: Pool) -> Self {
        PgEventStore { pool, citus: None }
    }

    /// A store over a Citus coordinator's database: as [`PgEventStore::new`],
    /// and its first call checks that loom's tables are distributed there
    /// (`SELECT * FROM loom_distribute()` did it), failing with
    /// [`Error::NotDistributed`] until they are. Without that check, a
    /// store pointed at a coordinator whose tables were never distributed
    /// would work, on the coordinator alone.
    #[must_use]
    pub fn new_citus(pool: Pool) -> Self {
        PgEventStore {
            pool,
            citus: Some(Arc::new(AtomicBool::new(false))),
        }
    }

    /// [`PgEventStore::new_citus`] with its own pool to the coordinator, as
    /// [`PgEventStore::connect_with`] builds it.
    ///
    /// ```no_run
    /// use loom_client::event_store::{PgEventStore, PgPoolOptions};
    /// let store = PgEventStore::connect_citus("host=coordinator.internal dbname=app", &PgPoolOptions::new())?;
    /// # Ok::<(), loom_client::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`pg_pool_with`](super::pg_pool_with).
    pub fn connect_citus(config: &str, options: &PgPoolOptions) -> Result<Self> {
        Ok(Self::new_citus(super::pg_pool_with(config, options)?))
    }

    /// A pooled connection, once a Citus store has found loom distributed.
    async fn client(&self) -> Result<Object> {
        let client = self.pool.get().await?;
        if let Some(checked) = &self.citus {
            if !checked.load(Ordering::Acquire) {
                let statement = client.prepare_cached(IS_DISTRIBUTED).await?;
                if !client.query_one(&statement, &[]).await?.get::<_, bool>(0) {
                    return Err(Error::NotDistributed);
                }
                checked.store(true, Ordering::Release);
            }
        }
        Ok(client)
    }

    /// A store with its own pool to `config` (a libpq connection string or
    /// URL, TLS as its `sslmode` says): 4 connections, 5 s timeouts
    /// ([`PgPoolOptions::new`]).
    ///
    /// ```no_run
    /// use loom_client::event_store::PgEventStore;
    /// let store = PgEventStore::connect("postgres://app@db.internal/app?sslmode=require")?;
    /// # Ok::<(), loom_client::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`pg_pool_with`](super::pg_pool_with): when `config` does not
    /// parse or its certificate files cannot be loaded.
    pub fn connect(config: &str) -> Result<Self> {
        Self::connect_with(config, &PgPoolOptions::new())
    }

    /// A store with its own pool to `config`, sized and bounded by
    /// `options`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use loom_client::event_store::{PgEventStore, PgPoolOptions};
    /// let store = PgEventStore::connect_with(
    ///     "host=db.internal user=app dbname=app sslmode=verify-full sslrootcert=/etc/app/db-ca.crt",
    ///     PgPoolOptions::new().max_size(8).wait_timeout(Duration::from_millis(250)),
    /// )?;
    /// # Ok::<(), loom_client::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`pg_pool_with`](super::pg_pool_with).
    pub fn connect_with(config: &str, options: &PgPoolOptions) -> Result<Self> {
        Ok(Self::new(super::pg_pool_with(config, options)?))
    }

    /// The pool, to share with other stores of the same database.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl EventStore for PgEventStore {
    async fn append(&self, events: &[Event]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = events.iter().map(|e| e.execution_id.as_str()).collect();
        let sequences: Vec<i64> = events.iter().map(|e| e.sequence).collect();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        let payloads: Vec<&serde_json::Value> = events.iter().map(|e| &e.payload).collect();
        let client = self.client().await?;
        let append = client.prepare_cached(APPEND).await?;
        match client
            .execute(&append, &[&ids, &sequences, &kinds, &payloads])
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                let find = client.prepare_cached(FIND_DUPLICATE).await?;
                match client.query_opt(&find, &[&ids, &sequences]).await? {
                    Some(row) => Err(Error::DuplicateEvent {
                        execution_id: row.get(0),
                        sequence: row.get(1),
                    }),
                    // Two of the batch's own events collided.
                    None => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        self.read_events_after(execution_id, None, usize::MAX).await
    }

    async fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        check_limit(limit)?;
        let client = self.client().await?;
        let read = client.prepare_cached(READ).await?;
        let rows = client
            .query(&read, &[&execution_id, &after, &sql_limit(limit)])
            .await?;
        Ok(rows
            .iter()
            .map(|row| Event {
                execution_id: execution_id.to_owned(),
                sequence: row.get(0),
                kind: row.get(1),
                payload: row.get(2),
            })
            .collect())
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        check_limit(limit)?;
        deleted_rows(
            &self.client().await?,
            DELETE,
            &[&execution_id, &through, &sql_limit(limit)],
        )
        .await
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        let client = self.client().await?;
        let list = client.prepare_cached(LIST).await?;
        let rows = client.query(&list, &[&after, &sql_limit(limit)]).await?;
        Ok(Page::from_ids(
            rows.iter().map(|r| r.get(0)).collect(),
            limit,
        ))
    }
}

/// A limit as the SQL API takes it: an integer, capped.
pub(crate) fn sql_limit(limit: usize) -> i32 {
    i32::try_from(limit).unwrap_or(i32::MAX)
}

/// Runs one retention batch on `client`: a loom function returning the
/// rows it deleted.
pub(crate) async fn deleted_rows(
    client: &Object,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<u64> {
    let statement = client.prepare_cached(sql).await?;
    let deleted: i64 = client.query_one(&statement, params).await?.get(0);
    Ok(deleted.unsigned_abs())
}

impl PgEventStore {
    /// A retention function's batches until one deletes nothing; each is
    /// its own short transaction.
    async fn until_done(&self, sql: &str, execution_id: &str, batch_size: usize) -> Result<u64> {
        check_limit(batch_size)?;
        let limit = sql_limit(batch_size);
        crate::retention::until_done(|| async move {
            deleted_rows(&self.client().await?, sql, &[&execution_id, &limit]).await
        })
        .await
    }

    /// Deletes the events of an execution that resume no longer needs: those
    /// older than its latest snapshot (`loom_prune_events`; the last event
    /// at or before the snapshot's sequence stays), `batch_size` rows a
    /// transaction. Returns how many went; 0 without a snapshot.
    ///
    /// ```no_run
    /// # async fn f(store: &loom_client::event_store::PgEventStore) -> loom_client::Result<()> {
    /// let pruned = store.prune_events("exec-1", 10_000).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a batch of 0; what the server raises.
    pub async fn prune_events(&self, execution_id: &str, batch_size: usize) -> Result<u64> {
        self.until_done(PRUNE, execution_id, batch_size).await
    }

    /// Deletes an execution everywhere in the database: the refs pointing
    /// at it, its lineage row, its snapshots and its events
    /// (`loom_delete_execution`), `batch_size` rows a transaction, so no
    /// lock is held long and paging over the others goes on. Returns how
    /// many rows went.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a batch of 0; what the server raises.
    pub async fn delete_execution(&self, execution_id: &str, batch_size: usize) -> Result<u64> {
        self.until_done(DELETE_EXECUTION, execution_id, batch_size)
            .await
    }
}

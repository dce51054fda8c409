//! An event store over loom's PostgreSQL extension, through its SQL API
//! (`loom_append_events`, `loom_read_events`, `loom_list_executions`,
//! `loom_delete_events`, and retention's `loom_prune_events` and
//! `loom_delete_execution`) and a connection pool, with statements prepared
//! once per connection. Every statement names loom's schema and
//! `pg_catalog` outright and casts each argument to its declared type
//! (`crate::pg_schema`): the session's `search_path` resolves nothing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::{check_limit, check_payloads, single_execution, Event, EventStore, Page, Payload};
use crate::pg_executor::{Conn, Param, PgConnection};
use crate::pg_row::{column, JsonbText};
use crate::pg_schema::SchemaCell;
use crate::retention::{ExecutionActivity, IdleBatch};
use crate::telemetry::{traced, Database};
use crate::{Error, PgPool, PgPoolOptions, Result};

/// The append statements, in one place: one event or a batch, with or
/// without metadata (0.11.0's parameter), notifying or not. Payloads and
/// metadata go as text and become jsonb in the server (`jsonb_in`): the
/// exact text the caller holds, never a value re-printed by a client
/// parser that rounds numbers or stops at some depth.
macro_rules! append_template {
    (one) => {
        "SELECT @extschema@.loom_append_event($1::pg_catalog.text, $2::pg_catalog.int8,
         $3::pg_catalog.text, $4::pg_catalog.text::pg_catalog.jsonb)"
    };
    (one with metadata) => {
        "SELECT @extschema@.loom_append_event($1::pg_catalog.text, $2::pg_catalog.int8,
         $3::pg_catalog.text, $4::pg_catalog.text::pg_catalog.jsonb,
         $5::pg_catalog.text::pg_catalog.jsonb)"
    };
    (many) => {
        "SELECT @extschema@.loom_append_events($1::pg_catalog.text[], $2::pg_catalog.int8[],
         $3::pg_catalog.text[], $4::pg_catalog.text[]::pg_catalog.jsonb[])"
    };
    (many with metadata) => {
        "SELECT @extschema@.loom_append_events($1::pg_catalog.text[], $2::pg_catalog.int8[],
         $3::pg_catalog.text[], $4::pg_catalog.text[]::pg_catalog.jsonb[],
         $5::pg_catalog.text[]::pg_catalog.jsonb[])"
    };
}
/// What a notifying append selects beside the append: one event's
/// execution, notified at commit.
macro_rules! notify_one {
    () => {
        ",
         pg_catalog.pg_notify('loom_events', pg_catalog.md5($1::pg_catalog.text))"
    };
}
/// Each execution of a batch, notified once.
macro_rules! notify_many {
    () => {
        ",
         (SELECT pg_catalog.count(pg_catalog.pg_notify('loom_events', pg_catalog.md5(d.id)))
          FROM (SELECT DISTINCT u.id FROM pg_catalog.unnest($1::pg_catalog.text[]) AS u (id)) AS d)"
    };
}

/// A batch.
const APPEND: &str = append_template!(many);
/// One event (an agent loop's usual append): no arrays to build and take
/// apart on either side.
const APPEND_ONE: &str = append_template!(one);
/// The channel appends notify when a store asks ([`PgEventStore::with_append_notifications`]).
/// The payload is the md5 of the execution id, not the id: any session of
/// the database may `LISTEN`, and ids can name tenants and customers.
pub const NOTIFY_CHANNEL: &str = "loom_events";
/// The append statements a store sends, by whether they pass metadata (all
/// five arguments: from 0.11.0) and whether the store notifies:
/// `[one, many]`.
const APPENDS: [[[&str; 2]; 2]; 2] = [
    [
        [APPEND_ONE, APPEND],
        [
            concat!(append_template!(one), notify_one!()),
            concat!(append_template!(many), notify_many!()),
        ],
    ],
    [
        [
            append_template!(one with metadata),
            append_template!(many with metadata),
        ],
        [
            concat!(append_template!(one with metadata), notify_one!()),
            concat!(append_template!(many with metadata), notify_many!()),
        ],
    ],
];
/// Events' metadata came in this version of the extension.
pub(crate) const METADATA_SINCE: &str = "0.11.0";
/// Reads a page of one log, metadata included (0.11.0).
const READ: &str = "SELECT sequence, kind, payload, created_at, metadata
     FROM @extschema@.loom_read_events($1::pg_catalog.text, $2::pg_catalog.int8, $3::pg_catalog.int4)";
/// [`READ`] for an extension the store last saw before 0.11.0: the
/// metadata from the row whatever its columns, so that a peer's update
/// between the catalog read and this read loses nothing (slower: each row
/// is made a jsonb value; once the store sees 0.11.0 it sends [`READ`]).
const READ_BEFORE_METADATA: &str =
    "SELECT r.sequence, r.kind, r.payload, r.created_at,
            pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.->) 'metadata'
     FROM @extschema@.loom_read_events($1::pg_catalog.text, $2::pg_catalog.int8, $3::pg_catalog.int4) AS r";
const DELETE: &str = "SELECT @extschema@.loom_delete_events($1::pg_catalog.text, $2::pg_catalog.int8, $3::pg_catalog.int4)";
const PRUNE: &str =
    "SELECT @extschema@.loom_prune_events($1::pg_catalog.text, $2::pg_catalog.int4)";
const DELETE_EXECUTION: &str =
    "SELECT @extschema@.loom_delete_execution($1::pg_catalog.text, $2::pg_catalog.int4)";
const LIST: &str =
    "SELECT * FROM @extschema@.loom_list_executions($1::pg_catalog.text, $2::pg_catalog.int4)";
/// Intervals travel as microseconds: no interval text to get wrong. There
/// is no `bigint * interval`, so the product is `float8 * interval`, named
/// (exact to the microsecond for 285 years).
const DELETE_IDLE: &str = "SELECT examined, executions_deleted, rows_deleted, next_after, done
     FROM @extschema@.loom_delete_idle_executions(
         ($1::pg_catalog.int8::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval)::pg_catalog.interval,
         $2::pg_catalog.text, $3::pg_catalog.int4)";
/// One batch of the executions index's check, and of its online repair.
const VERIFY: &str = "SELECT checked, missing, orphaned, next_after, done
     FROM @extschema@.loom_verify_executions($1::pg_catalog.text, $2::pg_catalog.int4)";
const REPAIR: &str = "SELECT checked, added, removed, next_after, done
     FROM @extschema@.loom_repair_executions($1::pg_catalog.text, $2::pg_catalog.int4)";
const ACTIVITY: &str = "SELECT execution_id, last_sequence,
            (extract(epoch FROM last_event_at) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8
     FROM @extschema@.loom_execution_activity($1::pg_catalog.text, $2::pg_catalog.int4)";
/// What a Citus store checks once, where the installed version has
/// `loom_is_distributed` (0.5.0+): loom's tables laid out as
/// `loom_distribute` makes them.
const IS_DISTRIBUTED: &str = "SELECT @extschema@.loom_is_distributed()";
/// Which of a batch's events already existed, after a unique violation
/// whose detail did not say (needs SELECT on loom.events; only tried then).
/// `ROWS FROM`, not a two-argument `unnest`: the parser only expands an
/// unqualified one.
const FIND_DUPLICATE: &str = "SELECT e.execution_id, e.sequence FROM loom.events e
     JOIN ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.int8[]))
         AS b (execution_id, sequence)
       ON e.execution_id OPERATOR(pg_catalog.=) b.execution_id AND e.sequence OPERATOR(pg_catalog.=) b.sequence
     LIMIT 1";

/// An [`EventStore`] in a PostgreSQL database with `CREATE EXTENSION loom`,
/// in whichever schema: the store reads it from the catalog at its first
/// call, and names it in every statement (nothing is resolved through the
/// connection's `search_path`, which another role may have planted).
///
/// The same store serves one server and a Citus coordinator: loom's SQL
/// functions are the contract on both. [`PgEventStore::connect_citus`]
/// adds one check, that the database is distributed.
#[derive(Clone)]
pub struct PgEventStore {
    pool: PgPool,
    db: Arc<Database>,
    /// Where loom's functions are, read at the first call.
    schema: SchemaCell,
    /// Set for a store that must find loom distributed on Citus; true once
    /// it has.
    citus: Option<Arc<AtomicBool>>,
    /// Whether appends also `NOTIFY` [`NOTIFY_CHANNEL`] ([`PgEventStore::with_append_notifications`]).
    notify: bool,
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
    pub fn new(pool: PgPool) -> Self {
        PgEventStore {
            pool,
            db: Database::postgresql(),
            schema: SchemaCell::new(),
            citus: None,
            notify: false,
        }
    }

    /// A store over a Citus coordinator's database: as [`PgEventStore::new`],
    /// and its first call checks that loom's tables are distributed there
    /// (`SELECT * FROM public.loom_distribute(NULL::integer, NULL::integer)` did it), failing with
    /// [`Error::NotDistributed`] until they are. Without that check, a
    /// store pointed at a coordinator whose tables were never distributed
    /// would work, on the coordinator alone.
    #[must_use]
    pub fn new_citus(pool: PgPool) -> Self {
        PgEventStore {
            pool,
            db: Database::postgresql(),
            schema: SchemaCell::new(),
            citus: Some(Arc::new(AtomicBool::new(false))),
            notify: false,
        }
    }

    /// [`PgEventStore::new_citus`] with its own pool to the coordinator, as
    /// [`PgEventStore::connect_with`] builds it.
    ///
    /// ```no_run
    /// use pgloom::event_store::PgEventStore;
    /// use pgloom::PgPoolOptions;
    /// let store = PgEventStore::connect_citus("host=coordinator.internal dbname=app", &PgPoolOptions::new())?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`PgPool::connect_with`].
    pub fn connect_citus(config: &str, options: &PgPoolOptions) -> Result<Self> {
        Ok(Self::new_citus(PgPool::connect_with(config, options)?))
    }

    /// A pooled connection, as the operations take it, once a Citus store
    /// has found loom distributed.
    async fn pooled(&self) -> Result<Conn<'static>> {
        let client = self.pool.conn().await?;
        self.ready(&client).await?;
        Ok(client)
    }

    /// Checks, once, what a first call on `client`'s database must: where
    /// it is (for traces), and for a Citus store that loom is distributed.
    async fn ready(&self, client: &Client) -> Result<()> {
        self.db.learn(client).await;
        if let Some(checked) = &self.citus {
            if !checked.load(Ordering::Acquire) {
                let distributed = self.schema.has(client, "loom_is_distributed").await?
                    && column::<bool>(
                        &client
                            .query_typed_one(&self.sql(client, IS_DISTRIBUTED).await?, &[])
                            .await?,
                        0,
                    )?;
                if !distributed {
                    return Err(Error::NotDistributed);
                }
                checked.store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    /// `template` naming loom's schema as this store found it.
    async fn sql(&self, client: &Client, template: &str) -> Result<String> {
        self.schema.sql(client, template).await
    }

    /// This store's operations on the caller's connection or transaction
    /// (a [`crate::interop::PgConnection`]: a `tokio_postgres::Client` or
    /// `Transaction`, or deadpool's pooled connection or transaction)
    /// instead of its pool: an append in the
    /// same transaction as the caller's own writes, committed or rolled
    /// back with them, with the same checks and duplicate handling. The
    /// view is an [`EventStore`].
    ///
    /// In a transaction, a statement that fails (a duplicate's 23505)
    /// aborts it, as any failed statement does: the duplicate is named
    /// from the server's detail when the role may read `loom.events`, and
    /// is the server's own 23505 otherwise ([`Error::is_duplicate`] is
    /// true for both).
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::event_store::PgEventStore, pool: &pgloom::PgPool) -> pgloom::Result<()> {
    /// use pgloom::event_store::{Event, EventStore};
    /// let mut conn = pool.as_ref().get().await?;
    /// let tx = conn.transaction().await?;
    /// tx.execute("UPDATE orders SET state = 'paid' WHERE id = $1", &[&42_i64]).await?;
    /// store.on(&tx).append(&[Event::new("order-42", 7, "paid", serde_json::json!({"id": 42}))]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn on<'a>(&'a self, connection: &'a impl PgConnection) -> PgEventStoreOn<'a> {
        PgEventStoreOn {
            store: self,
            client: connection.pg_client(),
        }
    }

    /// A store with its own pool to `config` (a libpq connection string or
    /// URL, TLS as its `sslmode` says): 4 connections, 5 s timeouts
    /// ([`PgPoolOptions::new`]).
    ///
    /// ```no_run
    /// use pgloom::event_store::PgEventStore;
    /// let store = PgEventStore::connect("postgres://app@db.internal/app?sslmode=require")?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`PgPool::connect_with`]: when `config` does not parse or its
    /// certificate files cannot be loaded.
    pub fn connect(config: &str) -> Result<Self> {
        Self::connect_with(config, &PgPoolOptions::new())
    }

    /// A store with its own pool to `config`, sized and bounded by
    /// `options`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use pgloom::event_store::PgEventStore;
    /// use pgloom::PgPoolOptions;
    /// let store = PgEventStore::connect_with(
    ///     "host=db.internal user=app dbname=app sslmode=verify-full sslrootcert=/etc/app/db-ca.crt",
    ///     PgPoolOptions::new().max_size(8).wait_timeout(Duration::from_millis(250)),
    /// )?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`PgPool::connect_with`].
    pub fn connect_with(config: &str, options: &PgPoolOptions) -> Result<Self> {
        Ok(Self::new(PgPool::connect_with(config, options)?))
    }

    /// This store, its appends also notifying [`NOTIFY_CHANNEL`] with (the
    /// md5 of) each execution id appended to, in the same statement (so at its commit,
    /// and not if it rolls back): what wakes a
    /// [`watch_events`](super::watch_events) through
    /// [`PgNotifications`](super::PgNotifications). Opt-in: `NOTIFY` serializes commits on one
    /// global lock, so appends that notify are slower
    /// (`docs/benchmarks.md` measures it); an appender that does not
    /// notify only leaves watchers to their poll interval.
    ///
    /// ```no_run
    /// # fn f(pool: pgloom::PgPool) {
    /// let store = pgloom::event_store::PgEventStore::new(pool).with_append_notifications(true);
    /// # }
    /// ```
    #[must_use]
    pub fn with_append_notifications(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// The pool, to share with other stores of the same database.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The installed extension's version and schema, checked against this
    /// client ([`crate::compat::check_server`]), as the store's first call
    /// checks them: call it at boot to fail there rather than on a request.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::event_store::PgEventStore) -> pgloom::Result<()> {
    /// let server = store.check_server().await?;
    /// assert!(pgloom::compat::supports(&server.extension_version));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`crate::compat::check_server`]; [`Error::Pool`] without a
    /// connection.
    pub async fn check_server(&self) -> Result<crate::compat::ServerInfo> {
        crate::compat::check_server(&self.pool.object().await?).await
    }

    /// The database this store traces its operations against.
    pub(crate) fn database(&self) -> &Database {
        &self.db
    }
}

/// A [`PgEventStore`]'s operations on the caller's connection or
/// transaction ([`PgEventStore::on`]).
#[derive(Clone, Copy)]
pub struct PgEventStoreOn<'a> {
    store: &'a PgEventStore,
    client: &'a Client,
}

impl std::fmt::Debug for PgEventStoreOn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgEventStoreOn").finish_non_exhaustive()
    }
}

impl PgEventStoreOn<'_> {
    async fn conn(&self) -> Result<Conn<'_>> {
        self.store.ready(self.client).await?;
        Ok(Conn::Caller(self.client))
    }
}

/// Each operation once, on whichever connection it is given.
impl PgEventStore {
    async fn append_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        events: &[Event],
    ) -> Result<()> {
        traced(&self.db, "append", single_execution(events), async {
            if events.is_empty() {
                return Ok(());
            }
            check_payloads(events)?;
            let ids: Vec<&str> = events.iter().map(|e| e.execution_id.as_str()).collect();
            let sequences: Vec<i64> = events.iter().map(|e| e.sequence).collect();
            let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
            let payloads: Vec<&str> = events.iter().map(|e| e.payload.as_str()).collect();
            let metadata: Vec<Option<&str>> = events
                .iter()
                .map(|e| e.stored_metadata().map(Payload::as_str))
                .collect();
            let with_metadata = metadata.iter().any(Option::is_some);
            let mut conn = conn.await?;
            if with_metadata {
                self.schema
                    .require(
                        &conn,
                        "an event's metadata",
                        METADATA_SINCE,
                        "loom_append_events",
                    )
                    .await?;
            }
            // From 0.11.0 every append passes all five arguments, NULL
            // metadata included: a call with four would also match a
            // four-parameter function someone created beside loom's in its
            // schema (the update freed that signature), and be ambiguous.
            let five = with_metadata || self.schema.at_least(&conn, METADATA_SINCE).await?;
            let [append_one, append_many] = APPENDS[usize::from(five)][usize::from(self.notify)];
            let appended = if let [event] = events {
                let payload = event.payload.as_str();
                let mut params: Vec<Param<'_>> = vec![
                    (&event.execution_id, Type::TEXT),
                    (&event.sequence, Type::INT8),
                    (&event.kind, Type::TEXT),
                    (&payload, Type::TEXT),
                ];
                if five {
                    params.push((&metadata[0], Type::TEXT));
                }
                conn.query(&self.sql(&conn, append_one).await?, &params)
                    .await
            } else {
                let mut params: Vec<Param<'_>> = vec![
                    (&ids, Type::TEXT_ARRAY),
                    (&sequences, Type::INT8_ARRAY),
                    (&kinds, Type::TEXT_ARRAY),
                    (&payloads, Type::TEXT_ARRAY),
                ];
                if five {
                    params.push((&metadata, Type::TEXT_ARRAY));
                }
                conn.query(&self.sql(&conn, append_many).await?, &params)
                    .await
            };
            match appended {
                Ok(_) => Ok(()),
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                    let append = self.sql(&conn, APPEND).await?;
                    Err(duplicate(&mut conn, &append, events, &ids, &sequences, e).await)
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    async fn read_events_after_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        traced(&self.db, "read_events", Some(execution_id), async {
            check_limit(limit)?;
            let conn = conn.await?;
            let read = if self.schema.at_least(&conn, METADATA_SINCE).await? {
                READ
            } else {
                READ_BEFORE_METADATA
            };
            let rows = conn
                .query(
                    &self.sql(&conn, read).await?,
                    &[
                        (&execution_id, Type::TEXT),
                        (&after, Type::INT8),
                        (&sql_limit(limit), Type::INT4),
                    ],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(Event {
                        execution_id: execution_id.to_owned(),
                        sequence: column(row, 0)?,
                        kind: column(row, 1)?,
                        payload: payload(row, 2)?,
                        created_at: Some(column(row, 3)?),
                        metadata: metadata(row, 4)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn delete_events_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        traced(&self.db, "delete_events", Some(execution_id), async {
            check_limit(limit)?;
            deleted_rows(
                &conn.await?,
                &self.schema,
                DELETE,
                &[
                    (&execution_id, Type::TEXT),
                    (&through, Type::INT8),
                    (&sql_limit(limit), Type::INT4),
                ],
            )
            .await
        })
        .await
    }

    async fn list_executions_page_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page> {
        traced(&self.db, "list_executions", None, async {
            check_limit(limit)?;
            let conn = conn.await?;
            let rows = conn
                .query(
                    &self.sql(&conn, LIST).await?,
                    &[(&after, Type::TEXT), (&sql_limit(limit), Type::INT4)],
                )
                .await?;
            Ok(Page::from_ids(
                rows.iter().map(|r| column(r, 0)).collect::<Result<_>>()?,
                limit,
            ))
        })
        .await
    }
}

impl EventStore for PgEventStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    fn postgres_pool(&self) -> Option<&PgPool> {
        // A Citus store checks its distribution at each first call; the
        // snapshot store's one statement would skip that check.
        self.citus.is_none().then_some(&self.pool)
    }

    async fn append(&self, events: &[Event]) -> Result<()> {
        let conn = self.pooled();
        self.append_on(conn, events).await
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
        let conn = self.pooled();
        self.read_events_after_on(conn, execution_id, after, limit)
            .await
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        let conn = self.pooled();
        self.delete_events_on(conn, execution_id, through, limit)
            .await
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        let conn = self.pooled();
        self.list_executions_page_on(conn, after, limit).await
    }
}

impl EventStore for PgEventStoreOn<'_> {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    async fn append(&self, events: &[Event]) -> Result<()> {
        self.store.append_on(self.conn(), events).await
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
        self.store
            .read_events_after_on(self.conn(), execution_id, after, limit)
            .await
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        self.store
            .delete_events_on(self.conn(), execution_id, through, limit)
            .await
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        self.store
            .list_executions_page_on(self.conn(), after, limit)
            .await
    }
}

/// A limit as the SQL API takes it: an integer, capped.
pub(crate) fn sql_limit(limit: usize) -> i32 {
    i32::try_from(limit).unwrap_or(i32::MAX)
}

/// A payload column (jsonb) as the server printed it: read whole, never
/// parsed here, so a depth or a number PostgreSQL holds is never refused.
pub(crate) fn payload(row: &tokio_postgres::Row, index: usize) -> Result<Payload> {
    Ok(Payload::printed_by_server(
        column::<JsonbText>(row, index)?.0,
    ))
}

/// Column `index` of `row`: an event's metadata, `None` for SQL NULL and
/// JSON `null` alike (loom writes no metadata as SQL NULL, and
/// `to_jsonb(r) -> 'metadata'` turns that into JSON `null`).
pub(crate) fn metadata(row: &tokio_postgres::Row, index: usize) -> Result<Option<Payload>> {
    Ok(column::<Option<JsonbText>>(row, index)?
        .map(|text| Payload::printed_by_server(text.0))
        .filter(|metadata| !metadata.is_null()))
}

/// The [`Error::DuplicateEvent`] for a batch PostgreSQL refused with a
/// unique violation (23505), which only a duplicate raises (the extension
/// turns Citus's XX000 into it). Which event it was, in the cheapest way
/// that works for a writer holding only INSERT on loom.events:
///
/// 1. the key in the error's detail, `(execution_id, sequence)=(<id>,
///    <sequence>)`, matched against the batch (the server writes the key
///    only for a role that may SELECT the table);
/// 2. an event the batch holds twice, or the batch's only event;
/// 3. the first batch event loom.events already has, looked up (needs
///    SELECT);
/// 4. replaying the batch one event at a time in a transaction rolled back
///    at the first 23505: INSERT alone is enough.
///
/// A look-up this role may not make is never what it gets back.
async fn duplicate(
    client: &mut Conn<'_>,
    append: &str,
    events: &[Event],
    ids: &[&str],
    sequences: &[i64],
    error: tokio_postgres::Error,
) -> Error {
    let found = |event: &Event| Error::DuplicateEvent {
        execution_id: event.execution_id.clone(),
        sequence: event.sequence,
    };
    let detail = error
        .as_db_error()
        .and_then(|e| e.detail())
        .unwrap_or_default();
    if let Some(event) = events
        .iter()
        .find(|e| detail.contains(&format!("=({}, {})", e.execution_id, e.sequence)))
    {
        return found(event);
    }
    if let Some(event) = super::held_twice(events) {
        return found(event);
    }
    if let [event] = events {
        return found(event);
    }
    let looked_up = async {
        let row = client
            .query_opt(
                FIND_DUPLICATE,
                &[(&ids, Type::TEXT_ARRAY), (&sequences, Type::INT8_ARRAY)],
            )
            .await?;
        row.map(|row| {
            Ok::<_, Error>(Error::DuplicateEvent {
                execution_id: column(&row, 0)?,
                sequence: column(&row, 1)?,
            })
        })
        .transpose()
    };
    match looked_up.await {
        Ok(Some(duplicate)) => return duplicate,
        // Gone since (a concurrent delete): the server's own error.
        Ok(None) => return error.into(),
        Err(_) => {}
    }
    // A replay needs a transaction of its own: on the caller's connection
    // (whose transaction the 23505 aborted) the server's error stands.
    let Some(client) = client.pooled_object() else {
        return error.into();
    };
    match duplicate_by_replay(client, append, events).await {
        Ok(Some(event)) => found(event),
        _ => error.into(),
    }
}

/// The first event of `events` that is already in loom.events: each
/// appended alone (by `append`, [`APPEND`] in loom's schema), in order, in
/// a transaction that is rolled back.
async fn duplicate_by_replay<'a>(
    client: &mut deadpool_postgres::Object,
    append: &str,
    events: &'a [Event],
) -> Result<Option<&'a Event>> {
    let tx = client.transaction().await?;
    let mut duplicate = None;
    for event in events {
        let appended = tx
            .query_typed(
                append,
                &[
                    (&[event.execution_id.as_str()].as_slice(), Type::TEXT_ARRAY),
                    (&[event.sequence].as_slice(), Type::INT8_ARRAY),
                    (&[event.kind.as_str()].as_slice(), Type::TEXT_ARRAY),
                    (&[event.payload.as_str()].as_slice(), Type::TEXT_ARRAY),
                ],
            )
            .await;
        match appended {
            Ok(_) => {}
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                duplicate = Some(event);
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    tx.rollback().await?;
    Ok(duplicate)
}

/// Runs one retention batch on `client`: a loom function (`template`, in
/// the schema `schema` finds) returning the rows it deleted.
pub(crate) async fn deleted_rows(
    client: &Conn<'_>,
    schema: &SchemaCell,
    template: &str,
    params: &[Param<'_>],
) -> Result<u64> {
    let deleted: i64 = column(
        &client
            .query_one(&schema.sql(client, template).await?, params)
            .await?,
        0,
    )?;
    Ok(deleted.unsigned_abs())
}

impl PgEventStore {
    /// A retention function's batches until one deletes nothing; each is
    /// its own short transaction.
    async fn until_done(
        &self,
        operation: &'static str,
        sql: &str,
        execution_id: &str,
        batch_size: usize,
    ) -> Result<u64> {
        traced(&self.db, operation, Some(execution_id), async {
            check_limit(batch_size)?;
            let limit = sql_limit(batch_size);
            crate::retention::until_done(|| async move {
                deleted_rows(
                    &self.pooled().await?,
                    &self.schema,
                    sql,
                    &[(&execution_id, Type::TEXT), (&limit, Type::INT4)],
                )
                .await
            })
            .await
        })
        .await
    }

    /// Deletes the events of an execution that resume no longer needs: those
    /// older than its latest snapshot (`loom_prune_events`; the last event
    /// at or before the snapshot's sequence stays), `batch_size` rows a
    /// transaction. Returns how many went; 0 without a snapshot.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::event_store::PgEventStore) -> pgloom::Result<()> {
    /// let pruned = store.prune_events("exec-1", 10_000).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a batch of 0; what the server raises.
    pub async fn prune_events(&self, execution_id: &str, batch_size: usize) -> Result<u64> {
        self.until_done("prune_events", PRUNE, execution_id, batch_size)
            .await
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
        self.until_done(
            "delete_execution",
            DELETE_EXECUTION,
            execution_id,
            batch_size,
        )
        .await
    }

    /// One bounded batch of retention by age (`loom_delete_idle_executions`,
    /// loom 0.8.0+): examines at most `batch_size` executions after
    /// `after` and deletes those with no event for longer than `idle_for`,
    /// at most `batch_size` rows, in one transaction. Call it again with
    /// the batch's `next_after` until it is `done`;
    /// [`crate::retention::sweep_idle_executions`] does.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::event_store::PgEventStore) -> pgloom::Result<()> {
    /// use std::time::Duration;
    /// let month = Duration::from_secs(30 * 86_400);
    /// let batch = store.delete_idle_executions(month, None, 10_000).await?;
    /// println!("{} executions went", batch.executions_deleted);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a batch of 0;
    /// [`Error::ExtensionMissing`] before loom 0.8.0; what the server
    /// raises (`42501` without a writer's grants).
    pub async fn delete_idle_executions(
        &self,
        idle_for: Duration,
        after: Option<&str>,
        batch_size: usize,
    ) -> Result<IdleBatch> {
        traced(&self.db, "delete_idle_executions", None, async {
            check_limit(batch_size)?;
            let limit = sql_limit(batch_size);
            let micros = i64::try_from(idle_for.as_micros()).unwrap_or(i64::MAX);
            let client = self.pooled().await?;
            let row = client
                .query_one(
                    &self.sql(&client, DELETE_IDLE).await?,
                    &[
                        (&micros, Type::INT8),
                        (&after, Type::TEXT),
                        (&limit, Type::INT4),
                    ],
                )
                .await?;
            let count = |i| column::<i64>(&row, i).map(|n| u64::try_from(n).unwrap_or(0));
            Ok(IdleBatch {
                examined: count(0)?,
                executions_deleted: count(1)?,
                rows_deleted: count(2)?,
                next_after: column(&row, 3)?,
                done: column(&row, 4)?,
            })
        })
        .await
    }

    /// One page of execution ids after `after`, each with when it was last
    /// written (`loom_execution_activity`, loom 0.8.0+): what a dry run of
    /// retention by age reads.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a page of 0; what the server raises.
    pub async fn execution_activity(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ExecutionActivity>> {
        traced(&self.db, "execution_activity", None, async {
            check_limit(limit)?;
            let limit = sql_limit(limit);
            let client = self.pooled().await?;
            client
                .query(
                    &self.sql(&client, ACTIVITY).await?,
                    &[(&after, Type::TEXT), (&limit, Type::INT4)],
                )
                .await?
                .iter()
                .map(|row| {
                    Ok(ExecutionActivity::new(
                        column(row, 0)?,
                        column(row, 1)?,
                        column(row, 2)?,
                    ))
                })
                .collect()
        })
        .await
    }

    /// Checks that `loom.executions` (the id pager's index) holds exactly
    /// the execution ids of the log, `batch` ids a statement
    /// (`loom_verify_executions`, loom 0.10.0+): each batch reads both in
    /// one snapshot and takes no lock a writer waits on, so it runs beside
    /// live traffic. `on_progress` hears the running totals after each
    /// batch. What `loom status --verify` runs.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::event_store::PgEventStore) -> pgloom::Result<()> {
    /// let check = store.verify_executions_index(10_000, |so_far| eprint!("\r{} ids", so_far.checked)).await?;
    /// if !check.in_step() {
    ///     println!("{} missing, {} without events: run loom repair", check.missing, check.orphaned);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a `batch` of 0 (one above `i32::MAX`
    /// is capped);
    /// [`Error::ExtensionMissing`] before loom 0.10.0.
    pub async fn verify_executions_index(
        &self,
        batch: usize,
        on_progress: impl FnMut(&IndexCheck),
    ) -> Result<IndexCheck> {
        traced(&self.db, "verify_executions_index", None, async {
            self.index_batches(false, batch, on_progress).await
        })
        .await
    }

    /// Brings `loom.executions` back in step with the log, online, `batch`
    /// ids a transaction (`loom_repair_executions`, loom 0.10.0+, the
    /// owner's): each batch checks a range of ids as
    /// [`verify_executions_index`](Self::verify_executions_index) does and
    /// fixes only the ids that disagree, holding back appends to those
    /// executions alone until it commits. Needed after writes with the
    /// triggers disabled (`pg_restore --disable-triggers`), or around
    /// loom's functions on Citus. `on_progress` hears the running totals
    /// after each batch. What `loom repair` runs.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::event_store::PgEventStore) -> pgloom::Result<()> {
    /// let repair = store.repair_executions_index(1000, |_| {}).await?;
    /// println!("{} ids checked, {} added, {} removed", repair.checked, repair.added, repair.removed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a `batch` of 0 (one above `i32::MAX`
    /// is capped);
    /// [`Error::ExtensionMissing`] before loom 0.10.0 (where
    /// `loom_rebuild_executions()` is the repair); what the server raises:
    /// `42501` for a role that does not own the extension.
    pub async fn repair_executions_index(
        &self,
        batch: usize,
        on_progress: impl FnMut(&IndexCheck),
    ) -> Result<IndexCheck> {
        traced(&self.db, "repair_executions_index", None, async {
            self.index_batches(true, batch, on_progress).await
        })
        .await
    }

    /// Runs the verification's or the repair's batch (`checked`, two
    /// counts, `next_after`, `done`) one after another, each its own
    /// transaction, until done.
    async fn index_batches(
        &self,
        repair: bool,
        batch: usize,
        mut on_progress: impl FnMut(&IndexCheck),
    ) -> Result<IndexCheck> {
        check_limit(batch)?;
        let limit = sql_limit(batch);
        let client = self.pooled().await?;
        let statement = self
            .sql(&client, if repair { REPAIR } else { VERIFY })
            .await?;
        let mut total = IndexCheck::default();
        let mut after: Option<String> = None;
        loop {
            let started = std::time::Instant::now();
            let row = client
                .query_one(&statement, &[(&after, Type::TEXT), (&limit, Type::INT4)])
                .await?;
            let took = started.elapsed();
            total.batches += 1;
            total.longest_batch = total.longest_batch.max(took);
            total.checked += column::<i64>(&row, 0)?.unsigned_abs();
            let (first, second) = (column::<i64>(&row, 1)?, column::<i64>(&row, 2)?);
            if repair {
                total.added += first.unsigned_abs();
                total.removed += second.unsigned_abs();
            } else {
                total.missing += first.unsigned_abs();
                total.orphaned += second.unsigned_abs();
            }
            after = column(&row, 3)?;
            on_progress(&total);
            if column::<bool>(&row, 4)? {
                return Ok(total);
            }
        }
    }
}

/// What [`PgEventStore::verify_executions_index`] found, or what
/// [`PgEventStore::repair_executions_index`] found and did: running totals
/// over the batches so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexCheck {
    /// Distinct execution ids checked, of the log and the index together.
    pub checked: u64,
    /// Ids of the log missing from the index (a verification).
    pub missing: u64,
    /// Ids of the index without events (a verification).
    pub orphaned: u64,
    /// Ids the repair added to the index.
    pub added: u64,
    /// Ids the repair removed from the index.
    pub removed: u64,
    /// Batches run, each one statement in its own transaction.
    pub batches: u64,
    /// The longest batch: the longest a repair could hold back an append
    /// to an execution it changed.
    pub longest_batch: Duration,
}

impl IndexCheck {
    /// No disagreement found (a verification), or none left (a repair).
    ///
    /// ```
    /// assert!(pgloom::event_store::IndexCheck::default().in_step());
    /// ```
    #[must_use]
    pub fn in_step(&self) -> bool {
        self.missing == 0 && self.orphaned == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_schema::assert_resolves_nothing;

    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        for sql in APPENDS.iter().flatten().flatten() {
            assert_resolves_nothing(sql);
        }
        for sql in [
            READ,
            READ_BEFORE_METADATA,
            DELETE,
            PRUNE,
            DELETE_EXECUTION,
            LIST,
            DELETE_IDLE,
            VERIFY,
            REPAIR,
            ACTIVITY,
            IS_DISTRIBUTED,
            FIND_DUPLICATE,
        ] {
            assert_resolves_nothing(sql);
        }
    }
}

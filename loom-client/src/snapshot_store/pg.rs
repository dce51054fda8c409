//! Snapshots in PostgreSQL with the loom extension (ADR 0141 D2, D5).
//!
//! Reads dispatch on the row, whatever this store writes: `state_z` set
//! means a frame, else the JSONB `state`. A zstd store provisions the frame
//! column at start (`loom_ensure_snapshot_zstd`, fail soft) and writes JSONB
//! while it is missing. That fallback is not only larger: a JSONB state is
//! only as exact as JSONB is (keys reordered and duplicates merged, numbers
//! and whitespace re-printed), and a state JSONB cannot hold (a string with
//! `\u0000`, an escaped lone surrogate) is refused by the server (`22P05`,
//! `22P02`) where a frame would have kept it. Whether the column exists is
//! read from the catalog, never assumed from this store's own provisioning:
//! a peer (another replica's start, `migrate()`) may have added it, so a
//! store writing JSONB while configured for zstd looks again at its first
//! save after each [`PgSnapshotStoreOptions::reprobe_interval`] (default
//! 30 s), besides on the check's 23514. A JSONB save over a frame row
//! clears the frame; a store that probed before a peer opted in gets the
//! check's 23514, re-probes, and retries correctly. No stale frame is ever
//! left.
//!
//! Every statement names loom's schema (read from the catalog) and
//! `pg_catalog` outright (`crate::pg_schema`): the session's
//! `search_path` resolves nothing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::pg_executor::{Conn, Param, PgConnection};
use pgloom_core::frame::{self, Codec, SNAPSHOT_FRAME_SENTINEL};
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

mod delta_save;

use pgloom_core::frame::delta::KeyframePolicy;

use super::keyframe_cache::KeyframeCache;
use super::verify::{verify_pages, FrameCheck};
use super::{check_codec, JsonText, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::event_store::Event;
use crate::pg_row::{column, JsonbText};
use crate::pg_schema::SchemaCell;
use crate::resume::Resume;
use crate::telemetry::{self, traced, Database};
use crate::{Error, PgPool, Result};

/// Where a frame is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Decode {
    /// In the client (default): ship the compressed bytes, which ADR 0141
    /// measured faster at every size than the server's jsonb output.
    #[default]
    Client,
    /// In the server, by `loom_snapshot_state_text`: the exact text, sent
    /// as text. (Not through jsonb: `loom_snapshot_state` would parse the
    /// text into jsonb only for it to be printed again, twice the work of a
    /// JSONB read, and would lose what jsonb cannot hold.)
    Server,
}

/// What a [`PgSnapshotStore`]'s start did about the frame column
/// (ADR 0141 D5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameProvisioning {
    /// The store writes JSONB: it asked for no DDL.
    NotRequested,
    /// The frame column and its check exist: saves write frames.
    Ready,
    /// `loom_ensure_snapshot_zstd` failed soft (a lock held too long, a
    /// missing privilege, a cancel): saves write JSONB until the column is
    /// there (a later start, a peer's, or `migrate()` adds it; the store
    /// looks again every [`PgSnapshotStoreOptions::reprobe_interval`]).
    /// Not only larger: JSONB reorders keys, merges duplicates, and refuses
    /// a state holding `\u0000` or an escaped lone surrogate, which a frame
    /// keeps. Never silent: the options' warning callback was called too.
    Deferred,
    /// Built by [`PgSnapshotStore::new`], which does no DDL: saves write
    /// frames once the column is there (provisioned by `migrate()` with
    /// [`crate::migrate::MigrateOptions::snapshot_codec`] zstd, or a
    /// peer's [`PgSnapshotStore::start`]), looked for at the first save
    /// and every [`PgSnapshotStoreOptions::reprobe_interval`] while it is
    /// missing; JSONB until then, said once through the options' warning
    /// callback.
    LeftToMigrate,
}

/// Receives the warning a zstd store's start gives when provisioning
/// failed soft.
type WarningSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How a [`PgSnapshotStore`] writes and reads. `Default` is
/// [`PgSnapshotStoreOptions::new`].
#[derive(Clone, Default)]
pub struct PgSnapshotStoreOptions {
    codec: Codec,
    decode: Decode,
    on_warning: Option<WarningSink>,
    /// `None`: [`DEFAULT_REPROBE_INTERVAL`].
    reprobe_interval: Option<Duration>,
    /// `None`: [`DEFAULT_PROVISION_WAIT`].
    provision_wait: Option<Duration>,
    keyframe_policy: KeyframePolicy,
    /// `None`: [`DEFAULT_KEYFRAME_CACHE_BYTES`].
    keyframe_cache_bytes: Option<usize>,
}

/// How much keyframe text a delta store keeps between saves: 64 MiB, a
/// hundred executions of 600 KB states.
const DEFAULT_KEYFRAME_CACHE_BYTES: usize = 64 << 20;

/// How long a zstd store's start waits for loom's migration lock before it
/// writes JSONB for now: a peer's long migration (a collation conversion
/// of a big table) must not hold a replica's start forever.
const DEFAULT_PROVISION_WAIT: Duration = Duration::from_secs(5);

/// How long a zstd store writing JSONB (its frame column missing) goes
/// before it looks in the catalog again: one cheap catalog read a
/// replica's lifetime of saves hardly notices, and a fallback that ends
/// within half a minute of a peer adding the column.
const DEFAULT_REPROBE_INTERVAL: Duration = Duration::from_secs(30);

impl std::fmt::Debug for PgSnapshotStoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSnapshotStoreOptions")
            .field("codec", &self.codec)
            .field("decode", &self.decode)
            .field("on_warning", &self.on_warning.is_some())
            .field("reprobe_interval", &self.reprobe_interval)
            .field("provision_wait", &self.provision_wait)
            .finish()
    }
}

impl PgSnapshotStoreOptions {
    /// Writes JSONB (no DDL), decodes in the client.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The codec to write with. Default [`Codec::None`].
    pub fn codec(&mut self, codec: Codec) -> &mut Self {
        self.codec = codec;
        self
    }

    /// When a [`Codec::Delta`] store writes a keyframe instead of a
    /// delta. Default [`KeyframePolicy::default`] (docs/frames.md).
    pub fn keyframe_policy(&mut self, policy: KeyframePolicy) -> &mut Self {
        self.keyframe_policy = policy;
        self
    }

    /// How many bytes of keyframe text a [`Codec::Delta`] store keeps
    /// between saves, the least recently used dropped first. A save whose
    /// keyframe is kept is one statement, as a zstd save is; one whose
    /// keyframe is not fetches it first (two). Default 64 MiB; zero keeps
    /// none.
    ///
    /// ```
    /// use pgloom::snapshot_store::{Codec, PgSnapshotStoreOptions};
    /// let mut options = PgSnapshotStoreOptions::new();
    /// options.codec(Codec::Delta).keyframe_cache_bytes(16 << 20);
    /// ```
    pub fn keyframe_cache_bytes(&mut self, bytes: usize) -> &mut Self {
        self.keyframe_cache_bytes = Some(bytes);
        self
    }

    /// Where to decode frames. Default [`Decode::Client`].
    pub fn decode(&mut self, decode: Decode) -> &mut Self {
        self.decode = decode;
        self
    }

    /// Called once when a zstd store's start could not provision the frame
    /// column and it writes JSONB instead ([`FrameProvisioning::Deferred`]).
    /// Default: none (the outcome is still in
    /// [`PgSnapshotStore::frame_provisioning`]).
    pub fn on_warning(&mut self, f: impl Fn(&str) + Send + Sync + 'static) -> &mut Self {
        self.on_warning = Some(Arc::new(f));
        self
    }

    /// How often a zstd store whose frame column is missing (provisioning
    /// [`FrameProvisioning::Deferred`], or a database not yet migrated)
    /// reads the catalog again, at its next save, to start writing frames
    /// once a peer or `migrate()` added the column. Default 30 s; zero
    /// looks before every such save. A store configured for JSONB never
    /// looks.
    ///
    /// ```
    /// use std::time::Duration;
    /// use pgloom::snapshot_store::{Codec, PgSnapshotStoreOptions};
    /// let mut options = PgSnapshotStoreOptions::new();
    /// options.codec(Codec::Zstd).reprobe_interval(Duration::from_secs(5));
    /// ```
    pub fn reprobe_interval(&mut self, interval: Duration) -> &mut Self {
        self.reprobe_interval = Some(interval);
        self
    }

    /// How long a zstd store's start waits for loom's migration lock (held
    /// by a peer's `migrate()` or provisioning) before it gives up for now
    /// and writes JSONB ([`FrameProvisioning::Deferred`], a later save
    /// looks again). Default 5 s; rounded up to whole milliseconds, at
    /// least 1 (0 would mean "wait forever").
    pub fn provision_wait(&mut self, wait: Duration) -> &mut Self {
        self.provision_wait = Some(wait);
        self
    }
}

/// A [`SnapshotStore`] in `loom.snapshots`. A clone shares the pool and
/// what the store knows of the catalog (as [`crate::event_store::PgEventStore`]'s
/// clones do): clone it into each task.
#[derive(Clone)]
pub struct PgSnapshotStore {
    pool: PgPool,
    db: Arc<Database>,
    /// Where loom's functions are, read at the first call of one.
    schema: SchemaCell,
    codec: Codec,
    decode: Decode,
    provisioning: FrameProvisioning,
    /// What the catalog said last: does `loom.snapshots.state_z` exist?
    frame_column: Arc<AtomicBool>,
    /// When the catalog was last read, and how long until a zstd store
    /// without the column reads it again.
    probed_at: Arc<Mutex<Instant>>,
    reprobe_interval: Duration,
    /// Told, once, that a zstd store built by `new` writes JSONB for want
    /// of the column.
    on_warning: Option<WarningSink>,
    warned: Arc<AtomicBool>,
    keyframe_policy: KeyframePolicy,
    /// A delta store's keyframes, shared by its clones.
    keyframes: Arc<Mutex<KeyframeCache>>,
}

impl std::fmt::Debug for PgSnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSnapshotStore")
            .field("codec", &self.codec)
            .field("decode", &self.decode)
            .field("frame_column", &self.frame_column.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A page of stored frames in id order (the primary key's), through the
/// view that has `state_z` whether or not the table has the column yet.
const FRAMES_AFTER: &str =
    "SELECT id, execution_id, sequence, state_z, NULL::pg_catalog.bytea FROM loom.snapshots_stored
     WHERE id OPERATOR(pg_catalog.>) $1::pg_catalog.int8 AND state_z IS NOT NULL
     ORDER BY id LIMIT $2::pg_catalog.int8";
/// [`FRAMES_AFTER`] with each delta's keyframe, from the version that
/// writes deltas ([`DELTA_SINCE`]).
const FRAMES_AND_BASES_AFTER: &str = "SELECT s.id, s.execution_id, s.sequence, s.state_z,
            (SELECT b.state_z FROM loom.snapshots_stored b
             WHERE b.execution_id OPERATOR(pg_catalog.=) s.execution_id
               AND b.sequence OPERATOR(pg_catalog.=) @extschema@.loom_snapshot_base_sequence(s.state_z::pg_catalog.bytea))
     FROM loom.snapshots_stored s
     WHERE s.id OPERATOR(pg_catalog.>) $1::pg_catalog.int8 AND s.state_z IS NOT NULL
     ORDER BY s.id LIMIT $2::pg_catalog.int8";

/// The first version that writes delta frames (`0x03`), and whose
/// `loom_resume` returns a delta's keyframe.
const DELTA_SINCE: &str = "0.16.0";

/// Whether `loom.snapshots` has the frame column `state_z` (also what a
/// move to the extension checks after creating it at an older version).
pub(crate) const PROBE: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
     JOIN pg_catalog.pg_class t ON t.oid OPERATOR(pg_catalog.=) a.attrelid
     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.relnamespace
     WHERE n.nspname OPERATOR(pg_catalog.=) 'loom' AND t.relname OPERATOR(pg_catalog.=) 'snapshots'
       AND a.attname OPERATOR(pg_catalog.=) 'state_z' AND NOT a.attisdropped)";

// A re-save stamps created_at with excluded.created_at (the column's
// default, now()): Citus takes no non-IMMUTABLE function in an upsert's SET.
// Each save holds the lock appends hold (loom 0.9.0+): a sweep deleting the
// execution waits for it and deletes the snapshot with the rest, instead of
// leaving a snapshot of an execution that is gone. A server older than that
// saves without it ([`PgSnapshotStore::save_sql`]).
const SAVE_FRAME: &str = "INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
     SELECT $1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.int8,
             $4::pg_catalog.text::pg_catalog.jsonb, $5::pg_catalog.bytea
     FROM @extschema@.loom_lock_execution_for_write($1::pg_catalog.text) AS lock
     ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
         SET workflow_id = excluded.workflow_id, state = excluded.state, state_z = excluded.state_z, created_at = excluded.created_at
     RETURNING s.id";
/// A JSONB save where the frame column exists: clears any frame.
const SAVE_JSONB_CLEARING: &str = "INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state, state_z)
     SELECT $1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.int8,
             $4::pg_catalog.text::pg_catalog.jsonb, NULL
     FROM @extschema@.loom_lock_execution_for_write($1::pg_catalog.text) AS lock
     ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
         SET workflow_id = excluded.workflow_id, state = excluded.state, state_z = NULL, created_at = excluded.created_at
     RETURNING s.id";
const SAVE_JSONB: &str =
    "INSERT INTO loom.snapshots AS s (execution_id, workflow_id, sequence, state)
     SELECT $1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.int8,
             $4::pg_catalog.text::pg_catalog.jsonb
     FROM @extschema@.loom_lock_execution_for_write($1::pg_catalog.text) AS lock
     ON CONFLICT ON CONSTRAINT snapshots_execution_id_sequence_key DO UPDATE
         SET workflow_id = excluded.workflow_id, state = excluded.state, created_at = excluded.created_at
     RETURNING s.id";
/// Every save from 0.16.0 on ([`PgSnapshotStore::store`]).
const STORE: &str =
    "SELECT @extschema@.loom_store_snapshot($1::pg_catalog.text, $2::pg_catalog.text,
     $3::pg_catalog.int8, $4::pg_catalog.text, $5::pg_catalog.bytea, $6::pg_catalog.bytea)";
const LATEST_SEQUENCE: &str = "SELECT pg_catalog.max(s.sequence) FROM loom.snapshots s
     WHERE s.execution_id OPERATOR(pg_catalog.=) $1::pg_catalog.text";
const DELETE_SNAPSHOTS: &str =
    "SELECT @extschema@.loom_delete_snapshots($1::pg_catalog.text, $2::pg_catalog.int4)";

impl PgSnapshotStore {
    /// A store over `pool`, built without I/O, as every PostgreSQL store
    /// is built by `new` ([`crate::event_store::PgEventStore::new`],
    /// [`crate::branch_registry::PgBranchRegistry::new`]): the extension
    /// is read at the first call, and a zstd store does no DDL
    /// ([`FrameProvisioning::LeftToMigrate`]: frames once `migrate()` has
    /// provisioned the column). [`PgSnapshotStore::start`] is this plus
    /// the start's I/O, done at once.
    ///
    /// ```no_run
    /// use pgloom::snapshot_store::{Codec, PgSnapshotStore, PgSnapshotStoreOptions};
    /// use pgloom::PgPool;
    /// let pool = PgPool::connect("host=db.internal user=app dbname=app")?;
    /// let mut options = PgSnapshotStoreOptions::new();
    /// options.codec(Codec::Zstd);
    /// let snapshots = PgSnapshotStore::new(pool, &options)?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A codec this build lacks ([`Error::CodecUnavailable`]).
    pub fn new(pool: PgPool, options: &PgSnapshotStoreOptions) -> Result<Self> {
        check_codec(options.codec)?;
        let provisioning = match options.codec {
            Codec::None => FrameProvisioning::NotRequested,
            Codec::Zstd | Codec::Delta => FrameProvisioning::LeftToMigrate,
        };
        let reprobe_interval = options.reprobe_interval.unwrap_or(DEFAULT_REPROBE_INTERVAL);
        let now = Instant::now();
        Ok(PgSnapshotStore {
            pool,
            db: Database::postgresql(),
            schema: SchemaCell::new(),
            codec: options.codec,
            decode: options.decode,
            provisioning,
            frame_column: Arc::new(AtomicBool::new(false)),
            // Due at once: the first save looks for the column.
            probed_at: Arc::new(Mutex::new(now.checked_sub(reprobe_interval).unwrap_or(now))),
            reprobe_interval,
            on_warning: options.on_warning.clone(),
            warned: Arc::new(AtomicBool::new(false)),
            keyframe_policy: options.keyframe_policy,
            keyframes: Arc::new(Mutex::new(KeyframeCache::new(
                options
                    .keyframe_cache_bytes
                    .unwrap_or(DEFAULT_KEYFRAME_CACHE_BYTES),
            ))),
        })
    }

    /// [`PgSnapshotStore::new`], then the start's I/O at once: the
    /// extension's version checked, and a zstd store provisions the frame
    /// column (`loom_ensure_snapshot_zstd`, serialized with its peers on
    /// the migration lock, bounded by
    /// [`PgSnapshotStoreOptions::provision_wait`]); if that fails soft (a
    /// lock held too long), it says so ([`Self::frame_provisioning`], the
    /// options' warning callback) and writes JSONB until the column is
    /// there.
    ///
    /// # Errors
    ///
    /// A codec this build lacks; [`Error::IncompatibleExtension`] for an
    /// extension version this client does not work with
    /// ([`crate::compat`]); what the server raises.
    pub async fn start(pool: PgPool, options: &PgSnapshotStoreOptions) -> Result<Self> {
        let mut store = Self::new(pool, options)?;
        let mut client = store.pool.object().await?;
        // An extension version this client does not work with is refused
        // here, at construction (crate::compat); what the catalog says is
        // kept for the store's first calls.
        store.schema.read(&client).await?;
        if options.codec != Codec::None {
            // As migrate() provisions them, with the SQL function's own
            // default wait for the table lock (200 ms).
            let wait = options.provision_wait.unwrap_or(DEFAULT_PROVISION_WAIT);
            store.provisioning = if crate::migrate::ensure_snapshot_frames(
                &mut client,
                &store.schema,
                200,
                Some(wait),
            )
            .await?
            {
                FrameProvisioning::Ready
            } else {
                crate::telemetry::degraded(
                    "loom: the zstd snapshot store could not add the frame column (loom_ensure_snapshot_zstd failed soft; the server log has why): snapshots are written as JSONB until a later start succeeds",
                    options.on_warning.as_deref(),
                );
                FrameProvisioning::Deferred
            };
        }
        store.probe(&client).await?;
        Ok(store)
    }

    /// What this store's start did about the frame column.
    #[must_use]
    pub fn frame_provisioning(&self) -> FrameProvisioning {
        self.provisioning
    }

    /// Whether saves write frames now (zstd configured and the column there).
    #[must_use]
    pub fn writes_frames(&self) -> bool {
        self.codec != Codec::None && self.frame_column.load(Ordering::Relaxed)
    }

    /// Decodes every frame stored in `loom.snapshots` (read through
    /// `loom.snapshots_stored`, `batch_size` rows a query in id order),
    /// and lists the rows that do not decode with the typed cause. Writes
    /// nothing: an unreadable row is left as it is. `on_progress` sees the
    /// count after each page. A database without the frame column has no
    /// frames, and checks none.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::snapshot_store::PgSnapshotStore) -> pgloom::Result<()> {
    /// let check = store.verify_frames(1000, |p| eprintln!("{} frames read", p.frames)).await?;
    /// for bad in &check.unreadable {
    ///     println!("snapshot {} of {:?}: {}", bad.id, bad.execution_id, bad.cause);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`](crate::Error::InvalidPageSize) for a
    /// batch of 0; what the server raises.
    pub async fn verify_frames(
        &self,
        batch_size: usize,
        on_progress: impl FnMut(&FrameCheck),
    ) -> Result<FrameCheck> {
        traced(&self.db, "verify_frames", None, async {
            let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
            let client = self.pooled().await?;
            let sql = if self.schema.at_least(&client, DELTA_SINCE).await? {
                self.schema.sql(&client, FRAMES_AND_BASES_AFTER).await?
            } else {
                FRAMES_AFTER.to_owned()
            };
            verify_pages(
                batch_size,
                |after| {
                    let (client, sql) = (&client, &sql);
                    async move {
                        client
                            .query(sql.as_str(), &[(&after, Type::INT8), (&limit, Type::INT8)])
                            .await?
                            .iter()
                            .map(|row| {
                                Ok((
                                    column(row, 0)?,
                                    column(row, 1)?,
                                    column(row, 2)?,
                                    column(row, 3)?,
                                    column(row, 4)?,
                                ))
                            })
                            .collect()
                    }
                },
                on_progress,
            )
            .await
        })
        .await
    }

    /// A pooled connection, as the operations take it, the database
    /// named for the spans once.
    async fn pooled(&self) -> Result<Conn<'static>> {
        let client = self.pool.conn().await?;
        self.db.learn(&client).await;
        Ok(client)
    }

    /// This store's operations on the caller's connection or transaction
    /// (a [`crate::interop::PgConnection`]) instead of its pool: a snapshot saved in
    /// the same transaction as the events it covers, or as the caller's
    /// own writes. The view is a [`SnapshotStore`], with this store's codec
    /// and decode site.
    ///
    /// ```no_run
    /// # async fn f(events: &pgloom::event_store::PgEventStore, snapshots: &pgloom::snapshot_store::PgSnapshotStore, pool: &pgloom::PgPool) -> pgloom::Result<()> {
    /// use pgloom::event_store::{Event, EventStore};
    /// use pgloom::snapshot_store::{JsonText, NewSnapshot, SnapshotStore};
    /// let mut conn = pool.as_ref().get().await?;
    /// let tx = conn.transaction().await?;
    /// events.on(&tx).append(&[Event::new("run-1", 12, "turn", serde_json::json!({"n": 12}))]).await?;
    /// snapshots.on(&tx).save(&NewSnapshot::new("run-1", "agentLoop", 12, JsonText::new(r#"{"turns":12}"#.to_owned())?)).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn on<'a>(&'a self, connection: &'a impl PgConnection) -> PgSnapshotStoreOn<'a> {
        PgSnapshotStoreOn {
            store: self,
            client: connection.pg_client(),
        }
    }

    /// Reads from the catalog whether the frame column exists, on
    /// `client` (the connection the operation holds: a pool of one has no
    /// other to lend).
    async fn probe(&self, client: &Client) -> Result<bool> {
        let exists: bool = column(&client.query_typed_one(PROBE, &[]).await?, 0)?;
        self.frame_column.store(exists, Ordering::Relaxed);
        *self
            .probed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        Ok(exists)
    }

    /// A zstd store writing JSONB because the column was missing when it
    /// last looked: looks again once the interval has passed since. (Only
    /// a 23514 or a sentinel would tell it otherwise, and neither comes
    /// while it is the one writing JSONB.)
    async fn reprobe_if_due(&self, client: &Client) -> Result<()> {
        if self.codec == Codec::None || self.frame_column.load(Ordering::Relaxed) {
            return Ok(());
        }
        let due = self
            .probed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
            >= self.reprobe_interval;
        if due
            && !self.probe(client).await?
            && self.provisioning == FrameProvisioning::LeftToMigrate
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            crate::telemetry::degraded(
                "loom: this zstd snapshot store (built by PgSnapshotStore::new, which does no DDL) finds no frame column: snapshots are written as JSONB until migrate() with snapshot_codec zstd provisions it",
                self.on_warning.as_deref(),
            );
        }
        Ok(())
    }

    /// A save statement ready for `client`: with the lock appends hold
    /// where the installed extension has it (0.9.0+), else without, as an
    /// older server's saves were.
    async fn save_sql(&self, client: &tokio_postgres::Client, template: &str) -> Result<String> {
        if self
            .schema
            .has(client, "loom_lock_execution_for_write")
            .await?
        {
            return self.schema.sql(client, template).await;
        }
        Ok(template.replace(
            "FROM @extschema@.loom_lock_execution_for_write($1::pg_catalog.text) AS lock",
            "FROM (VALUES (true)) AS lock",
        ))
    }

    /// Stores through `loom_store_snapshot` (0.16.0+), the one save the
    /// server's own saves go through: it refuses (55006) to save over a
    /// keyframe that deltas name with another frame, which a plain upsert
    /// would do, leaving those deltas without their keyframe.
    async fn store(
        &self,
        client: &Conn<'_>,
        snapshot: &NewSnapshot,
        text: Option<&str>,
        frame: Option<&[u8]>,
    ) -> Result<i64> {
        self.store_frame(client, snapshot, text, frame, None).await
    }

    /// [`Self::store`], a delta with the SHA-256 of the keyframe's frame
    /// it was encoded against.
    async fn store_frame(
        &self,
        client: &Conn<'_>,
        snapshot: &NewSnapshot,
        text: Option<&str>,
        frame: Option<&[u8]>,
        base_digest: Option<&[u8]>,
    ) -> Result<i64> {
        let params: [Param<'_>; 6] = [
            (&snapshot.execution_id, Type::TEXT),
            (&snapshot.workflow_id, Type::TEXT),
            (&snapshot.sequence, Type::INT8),
            (&text, Type::TEXT),
            (&frame, Type::BYTEA),
            (&base_digest, Type::BYTEA),
        ];
        let sql = self.schema.sql(client, STORE).await?;
        match client.query_one(&sql, &params).await {
            Ok(row) => column(&row, 0),
            Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) => Err(Error::KeyframeInUse {
                execution_id: snapshot.execution_id.clone(),
                sequence: snapshot.sequence,
            }),
            Err(e) => Err(e.into()),
        }
    }

    async fn save_jsonb(&self, client: &Conn<'_>, snapshot: &NewSnapshot) -> Result<i64> {
        telemetry::snapshot_stored(&self.db, "jsonb", snapshot.state.as_str().len());
        if self.schema.at_least(client, DELTA_SINCE).await? {
            return self
                .store(client, snapshot, Some(snapshot.state.as_str()), None)
                .await;
        }
        let clearing = self.frame_column.load(Ordering::Relaxed);
        let state = snapshot.state.as_str();
        let params: [Param<'_>; 4] = [
            (&snapshot.execution_id, Type::TEXT),
            (&snapshot.workflow_id, Type::TEXT),
            (&snapshot.sequence, Type::INT8),
            (&state, Type::TEXT),
        ];
        let sql = if clearing {
            SAVE_JSONB_CLEARING
        } else {
            SAVE_JSONB
        };
        match client
            .query_one(&self.save_sql(client, sql).await?, &params)
            .await
        {
            Ok(row) => column(&row, 0),
            // A peer added the column and framed this row since we probed:
            // the check refused leaving its frame. Re-probe, clear, retry.
            // (In a caller's transaction the 23514 aborted it: the probe
            // fails there, and the check's error is the answer.)
            Err(e) if !clearing && e.code() == Some(&SqlState::CHECK_VIOLATION) => {
                if matches!(self.probe(client).await, Ok(true)) {
                    let sql = self.save_sql(client, SAVE_JSONB_CLEARING).await?;
                    column(&client.query_one(&sql, &params).await?, 0)
                } else {
                    Err(e.into())
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn load_checked(
        &self,
        client: &Conn<'_>,
        execution_id: &str,
        query: SnapshotQuery,
    ) -> Result<Option<Snapshot>> {
        match self.load_once(client, execution_id, query).await {
            // Read before a peer's frame column existed for us: look again.
            Err(Error::SentinelWithoutFrame { .. })
                if !self.frame_column.load(Ordering::Relaxed) =>
            {
                self.probe(client).await?;
                self.load_once(client, execution_id, query).await
            }
            other => other,
        }
    }

    async fn load_once(
        &self,
        client: &Conn<'_>,
        execution_id: &str,
        query: SnapshotQuery,
    ) -> Result<Option<Snapshot>> {
        let template = load_template(
            self.decode,
            self.frame_column.load(Ordering::Relaxed),
            self.schema.at_least(client, DELTA_SINCE).await?,
            query,
        );
        let sql = self.schema.sql(client, &template).await?;
        let row = match query {
            SnapshotQuery::Latest => {
                client
                    .query_opt(&sql, &[(&execution_id, Type::TEXT)])
                    .await?
            }
            SnapshotQuery::At(sequence) | SnapshotQuery::Before(sequence) => {
                client
                    .query_opt(
                        &sql,
                        &[(&execution_id, Type::TEXT), (&sequence, Type::INT8)],
                    )
                    .await?
            }
        };
        row.map(|row| self.decode_row(&row)).transpose()
    }

    fn decode_row(&self, row: &Row) -> Result<Snapshot> {
        let id: i64 = column(row, 0)?;
        let execution_id: String = column(row, 1)?;
        let frame = (column(row, 6)?, column(row, 7)?);
        let state = stored_state(id, &execution_id, frame, || match self.decode {
            Decode::Server => column::<String>(row, 5),
            Decode::Client => Ok(column::<JsonbText>(row, 5)?.0),
        })?;
        Ok(Snapshot {
            id,
            execution_id,
            workflow_id: column(row, 2)?,
            sequence: column(row, 3)?,
            created_at: column::<SystemTime>(row, 4)?,
            state,
        })
    }

    /// Whether this store reads through `pool`.
    pub(crate) fn reads_through(&self, pool: &PgPool) -> bool {
        self.pool.is(pool)
    }

    /// The latest snapshot of `execution_id` and the events after its
    /// sequence, in one statement (`loom_resume`: one round trip and one
    /// MVCC snapshot, so the tail starts exactly after the snapshot's
    /// sequence, none missing or repeated, while appends run). A frame is
    /// decoded where the store's [`Decode`] says, as [`PgSnapshotStore::load`]
    /// decodes it.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::snapshot_store::PgSnapshotStore) -> pgloom::Result<()> {
    /// let resumed = store.resume("exec-1").await?;
    /// let from = resumed.snapshot.as_ref().map_or(0, |s| s.sequence);
    /// for event in &resumed.events {
    ///     assert!(event.sequence > from);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// What the server raises; a frame that does not decode
    /// ([`Error::Decode`]); a sentinel without its frame
    /// ([`Error::SentinelWithoutFrame`]).
    pub async fn resume(&self, execution_id: &str) -> Result<Resume> {
        traced(&self.db, "resume", Some(execution_id), async {
            let client = self.pooled().await?;
            self.resume_on(&client, execution_id).await
        })
        .await
    }

    /// [`PgSnapshotStore::resume`] when the extension has `loom_resume`
    /// (0.4.0 and later), `None` before it: what the generic
    /// [`crate::resume::resume`] sends when it can.
    pub(crate) async fn resume_in_one_statement(
        &self,
        execution_id: &str,
    ) -> Result<Option<Resume>> {
        traced(&self.db, "resume", Some(execution_id), async {
            let client = self.pooled().await?;
            if !self.schema.at_least(&client, RESUME_SINCE).await? {
                return Ok(None);
            }
            self.resume_on(&client, execution_id).await.map(Some)
        })
        .await
    }

    async fn resume_on(&self, client: &Conn<'_>, execution_id: &str) -> Result<Resume> {
        let metadata = self
            .schema
            .at_least(client, crate::event_store::METADATA_SINCE)
            .await?;
        let bases = self.schema.at_least(client, DELTA_SINCE).await?;
        let resume = resume_template(self.decode, metadata, bases);
        let rows = client
            .query(
                &self.schema.sql(client, &resume).await?,
                &[(&execution_id, Type::TEXT)],
            )
            .await?;
        let mut snapshot = None;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            match column::<Option<i64>>(row, 0)? {
                Some(id) => {
                    let frame = (column(row, 5)?, column(row, 9)?);
                    let state = stored_state(id, execution_id, frame, || match self.decode {
                        Decode::Server => column::<String>(row, 4),
                        Decode::Client => Ok(column::<JsonbText>(row, 4)?.0),
                    })?;
                    snapshot = Some(Snapshot {
                        id,
                        execution_id: execution_id.to_owned(),
                        workflow_id: column(row, 1)?,
                        sequence: column(row, 2)?,
                        created_at: column::<SystemTime>(row, 3)?,
                        state,
                    });
                }
                None => events.push(Event {
                    execution_id: execution_id.to_owned(),
                    sequence: column(row, 2)?,
                    kind: column(row, 6)?,
                    payload: crate::event_store::pg_payload(row, 7)?,
                    created_at: Some(column(row, 3)?),
                    metadata: crate::event_store::pg_metadata(row, 8)?,
                }),
            }
        }
        Ok(Resume::new(snapshot, events))
    }
}

/// The first version with `loom_resume`.
const RESUME_SINCE: &str = "0.4.0";

/// The statement [`PgSnapshotStore::resume`] sends, `$1` the execution.
/// The state as [`load_template`] reads it for `decode`: a frame shipped
/// as stored for the client, decoded by `loom_snapshot_state_text` for
/// the server. Before 0.11.0 (`metadata` false, as the store last saw
/// the extension) each event's metadata comes from its row whatever its
/// columns, so that a peer's update in between loses nothing (slower;
/// once the store sees 0.11.0 it reads the column).
fn resume_template(decode: Decode, metadata: bool, bases: bool) -> String {
    // loom_resume returns state_z whether or not the table has it, and
    // from 0.16.0 the keyframe a delta names (base_z).
    let base = if bases {
        "r.base_z"
    } else {
        "NULL::pg_catalog.bytea"
    };
    let (state, frame) = state_columns(decode, true, "r.", base);
    let metadata = if metadata {
        "r.metadata"
    } else {
        "CASE WHEN r.snapshot_id IS NULL
              THEN pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.->) 'metadata' END"
    };
    format!(
        "SELECT r.snapshot_id, r.workflow_id, r.sequence, r.created_at, {state}, {frame}, r.kind,
                r.payload, {metadata}, {}
         FROM @extschema@.loom_resume($1::pg_catalog.text) AS r",
        if decode == Decode::Client {
            base
        } else {
            "NULL::pg_catalog.bytea"
        }
    )
}

/// The state and frame columns a statement selects from a snapshot row
/// (its columns prefixed `row`) for `decode`: for the client, the JSONB
/// and the frame as stored; for the server, the text, a frame decoded by
/// `loom_snapshot_state_text` only where the frame column exists, with
/// `base` (a delta's keyframe, or `NULL`) where the server reads deltas.
fn state_columns(decode: Decode, frame_column: bool, row: &str, base: &str) -> (String, String) {
    let no_frame = "NULL::pg_catalog.bytea".to_owned();
    let with_base = if base.starts_with("NULL") {
        String::new()
    } else {
        format!(", {base}::pg_catalog.bytea")
    };
    match (decode, frame_column) {
        (Decode::Server, true) => (
            format!(
                "CASE WHEN {row}state_z IS NULL THEN {row}state::pg_catalog.text
                 ELSE @extschema@.loom_snapshot_state_text({row}state_z::pg_catalog.bytea{with_base}) END"
            ),
            no_frame,
        ),
        (Decode::Server, false) => (format!("{row}state::pg_catalog.text"), no_frame),
        (Decode::Client, true) => (format!("{row}state"), format!("{row}state_z")),
        (Decode::Client, false) => (format!("{row}state"), no_frame),
    }
}

/// The statement [`PgSnapshotStore::load`] sends: `$1` the execution, `$2`
/// the sequence of an `At` or `Before` query. A server decode goes through
/// `loom_snapshot_state_text` only where the frame column exists.
fn load_template(decode: Decode, frame_column: bool, bases: bool, query: SnapshotQuery) -> String {
    // A delta's keyframe, in the same statement (one MVCC snapshot), by
    // the primary key: the same execution, the sequence the delta names.
    let base = if frame_column && bases {
        "(SELECT b.state_z FROM loom.snapshots b
          WHERE b.execution_id OPERATOR(pg_catalog.=) $1::pg_catalog.text
            AND b.sequence OPERATOR(pg_catalog.=) @extschema@.loom_snapshot_base_sequence(s.state_z::pg_catalog.bytea))"
    } else {
        "NULL::pg_catalog.bytea"
    };
    let (state, frame) = state_columns(decode, frame_column, "s.", base);
    let base = if decode == Decode::Client {
        base
    } else {
        "NULL::pg_catalog.bytea"
    };
    let filter = match query {
        SnapshotQuery::Latest => "",
        SnapshotQuery::At(_) => "AND s.sequence OPERATOR(pg_catalog.=) $2::pg_catalog.int8",
        SnapshotQuery::Before(_) => "AND s.sequence OPERATOR(pg_catalog.<) $2::pg_catalog.int8",
    };
    format!(
        "SELECT s.id, s.execution_id, s.workflow_id, s.sequence, s.created_at, {state}, {frame}, {base}
         FROM loom.snapshots s WHERE s.execution_id OPERATOR(pg_catalog.=) $1::pg_catalog.text {filter}
         ORDER BY s.sequence DESC LIMIT 1"
    )
}

/// A stored row's state: its frame decoded when it has one, else its text
/// (`text` is only read then), which must not be the bare sentinel. Each
/// is validated once: the frame by decoding it, the text by the server.
fn stored_state(
    id: i64,
    execution_id: &str,
    (frame, base): (Option<&[u8]>, Option<&[u8]>),
    text: impl FnOnce() -> Result<String>,
) -> Result<JsonText> {
    if let Some(frame) = frame {
        return Ok(JsonText::from(telemetry::decode_frame(frame, base)?));
    }
    let text = text()?;
    if is_sentinel(&text) {
        return Err(Error::SentinelWithoutFrame {
            id,
            execution_id: execution_id.to_owned(),
        });
    }
    Ok(JsonText::printed_by_server(text))
}

/// The sentinel exactly as jsonb prints it back (`jsonb_out` puts a space
/// after each ':' and ','; the sentinel has one key).
const SENTINEL_AS_JSONB: &str = r#"{"__loomEnc": "loom.snapshot-frame/state_z"}"#;

fn is_sentinel(jsonb_text: &str) -> bool {
    jsonb_text == SENTINEL_AS_JSONB
}

impl SnapshotStore for PgSnapshotStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    fn as_postgres(&self) -> Option<&PgSnapshotStore> {
        Some(self)
    }

    fn snapshot_codec(&self) -> Codec {
        self.codec
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        self.save_on(self.pooled(), snapshot).await
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        self.load_on(self.pooled(), execution_id, query).await
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        self.latest_sequence_on(self.pooled(), execution_id).await
    }

    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        self.delete_snapshots_on(self.pooled(), execution_id, limit)
            .await
    }
}

/// Each operation once, on whichever connection it is given.
impl PgSnapshotStore {
    async fn save_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        snapshot: &NewSnapshot,
    ) -> Result<i64> {
        traced(
            &self.db,
            "save_snapshot",
            Some(&snapshot.execution_id),
            async {
                let client = conn.await?;
                self.reprobe_if_due(&client).await?;
                if !self.writes_frames() {
                    return self.save_jsonb(&client, snapshot).await;
                }
                if self.codec == Codec::Delta {
                    return self.save_delta(&client, snapshot).await;
                }
                let frame = frame::encode(snapshot.state.as_str(), Codec::Zstd)?;
                telemetry::frame_stored(&self.db, &frame);
                if self.schema.at_least(&client, DELTA_SINCE).await? {
                    return self.store(&client, snapshot, None, Some(&frame)).await;
                }
                let row = client
                    .query_one(
                        &self.save_sql(&client, SAVE_FRAME).await?,
                        &[
                            (&snapshot.execution_id, Type::TEXT),
                            (&snapshot.workflow_id, Type::TEXT),
                            (&snapshot.sequence, Type::INT8),
                            (&SNAPSHOT_FRAME_SENTINEL, Type::TEXT),
                            (&frame, Type::BYTEA),
                        ],
                    )
                    .await?;
                column(&row, 0)
            },
        )
        .await
    }

    async fn load_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        execution_id: &str,
        query: SnapshotQuery,
    ) -> Result<Option<Snapshot>> {
        traced(&self.db, "load_snapshot", Some(execution_id), async {
            self.load_checked(&conn.await?, execution_id, query).await
        })
        .await
    }

    async fn latest_sequence_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        execution_id: &str,
    ) -> Result<Option<i64>> {
        traced(
            &self.db,
            "latest_snapshot_sequence",
            Some(execution_id),
            async {
                let client = conn.await?;
                column(
                    &client
                        .query_one(LATEST_SEQUENCE, &[(&execution_id, Type::TEXT)])
                        .await?,
                    0,
                )
            },
        )
        .await
    }

    async fn delete_snapshots_on<'c>(
        &self,
        conn: impl Future<Output = Result<Conn<'c>>>,
        execution_id: &str,
        limit: usize,
    ) -> Result<u64> {
        traced(&self.db, "delete_snapshots", Some(execution_id), async {
            crate::event_store::check_limit(limit)?;
            // Its keyframe may be what goes: the next delta save asks.
            self.keyframes
                .lock()
                .expect("never poisoned")
                .remove(execution_id);
            crate::event_store::deleted_rows(
                &conn.await?,
                &self.schema,
                DELETE_SNAPSHOTS,
                &[
                    (&execution_id, Type::TEXT),
                    (&crate::event_store::sql_limit(limit), Type::INT4),
                ],
            )
            .await
        })
        .await
    }
}

/// A [`PgSnapshotStore`]'s operations on the caller's connection or
/// transaction ([`PgSnapshotStore::on`]).
#[derive(Clone, Copy)]
pub struct PgSnapshotStoreOn<'a> {
    store: &'a PgSnapshotStore,
    client: &'a Client,
}

impl std::fmt::Debug for PgSnapshotStoreOn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSnapshotStoreOn").finish_non_exhaustive()
    }
}

impl PgSnapshotStoreOn<'_> {
    async fn conn(&self) -> Result<Conn<'_>> {
        self.store.db.learn(self.client).await;
        Ok(Conn::Caller(self.client))
    }
}

impl SnapshotStore for PgSnapshotStoreOn<'_> {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    fn snapshot_codec(&self) -> Codec {
        self.store.codec
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        self.store.save_on(self.conn(), snapshot).await
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        self.store.load_on(self.conn(), execution_id, query).await
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        self.store
            .latest_sequence_on(self.conn(), execution_id)
            .await
    }

    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        self.store
            .delete_snapshots_on(self.conn(), execution_id, limit)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_schema::assert_resolves_nothing;

    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        for sql in [
            FRAMES_AFTER,
            PROBE,
            SAVE_FRAME,
            SAVE_JSONB_CLEARING,
            SAVE_JSONB,
            LATEST_SEQUENCE,
            STORE,
            DELETE_SNAPSHOTS,
            FRAMES_AFTER,
            FRAMES_AND_BASES_AFTER,
        ] {
            assert_resolves_nothing(sql);
        }
        for decode in [Decode::Client, Decode::Server] {
            for bases in [false, true] {
                for metadata in [false, true] {
                    assert_resolves_nothing(&resume_template(decode, metadata, bases));
                }
                for frame_column in [false, true] {
                    for query in [
                        SnapshotQuery::Latest,
                        SnapshotQuery::At(1),
                        SnapshotQuery::Before(1),
                    ] {
                        assert_resolves_nothing(&load_template(decode, frame_column, bases, query));
                    }
                }
            }
        }
    }
}

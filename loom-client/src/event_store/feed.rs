//! The change feed (docs/feed.md): every event of a database after a
//! position, in an order a reader follows without ever skipping an event
//! that commits later, and durable named consumers that resume from
//! their last acknowledgement.
//!
//! The feed is opt-in: the database's owner turns it on once
//! (`SELECT loom_feed_enable()`), and appends pay for it from then on.
//!
//! ```no_run
//! # async fn f(pool: pgloom::PgPool) -> pgloom::Result<()> {
//! use futures::StreamExt;
//! use pgloom::event_store::{FeedOptions, PgFeed};
//!
//! let feed = PgFeed::new(pool);
//! feed.create_consumer("search-index", None).await?;
//! let mut pages = Box::pin(feed.stream("search-index", FeedOptions::new()));
//! while let Some(page) = pages.next().await {
//!     let page = page?;
//!     for item in &page.events {
//!         println!("{} {} {}", item.event.execution_id, item.event.sequence, item.event.kind);
//!     }
//!     // Processed: acknowledged. After a crash the consumer resumes here.
//!     if let Some(next_after) = &page.next_after {
//!         feed.ack("search-index", next_after).await?;
//!     }
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use futures::stream::Stream;
use tokio_postgres::types::Type;

use super::watch::Wake;
use super::{pg_metadata, pg_payload, sql_limit, Event};
use crate::pg_executor::Conn;
use crate::pg_row::column;
use crate::pg_schema::SchemaCell;
use crate::{PgPool, Result};

/// The channel the feed's trigger notifies at commit when the owner
/// turned notifications on (`loom_feed_enable(notify => true)`), with an
/// empty payload. [`crate::event_store::PgNotifications`] listens to it.
pub const FEED_CHANNEL: &str = "loom_feed";

/// The key feed streams wait on in a [`Wake`]: not an execution's (those
/// are 32 hexadecimal digits).
pub(crate) const FEED_KEY: &str = "loom feed";

const READ: &str =
    "SELECT feed_position, execution_id, sequence, kind, payload, created_at, metadata
     FROM @extschema@.loom_feed_read($1::pg_catalog.text, $2::pg_catalog.int4)";
const HEAD: &str = "SELECT @extschema@.loom_feed_head()";
const CREATE: &str =
    "SELECT @extschema@.loom_feed_create_consumer($1::pg_catalog.text, $2::pg_catalog.text)";
const ACKED: &str = "SELECT position FROM loom.feed_consumers WHERE name OPERATOR(pg_catalog.=) $1::pg_catalog.text";
const DROP_CONSUMER: &str = "SELECT @extschema@.loom_feed_drop_consumer($1::pg_catalog.text)";
/// What says 42704 for a consumer this role cannot see.
const NEXT_NONE: &str = "SELECT 1 FROM @extschema@.loom_feed_next($1::pg_catalog.text, 1) LIMIT 0";
const ACK: &str = "SELECT @extschema@.loom_feed_ack($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)";

/// The first wait of a feed stream that read nothing: events of a commit
/// that woke it may wait for an older transaction to end.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// A position in the feed: opaque, and ordered as the feed is (its text,
/// 32 hexadecimal digits, sorts the same way). Keep it as text
/// ([`FeedPosition::as_str`]) and bring it back with
/// [`FeedPosition::parse`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FeedPosition(String);

/// Text that is not a feed position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a feed position: expected 32 lowercase hexadecimal digits")]
pub struct InvalidFeedPositionError;

impl FeedPosition {
    /// A position kept as text.
    ///
    /// ```
    /// use pgloom::event_store::FeedPosition;
    /// let p = FeedPosition::parse("000000000000002a0000000000000007")?;
    /// assert_eq!(p.as_str(), "000000000000002a0000000000000007");
    /// assert!(FeedPosition::parse("42").is_err());
    /// # Ok::<(), pgloom::event_store::InvalidFeedPositionError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidFeedPositionError`] for anything but 32 lowercase
    /// hexadecimal digits whose halves fit a signed 64-bit integer.
    pub fn parse(text: &str) -> std::result::Result<Self, InvalidFeedPositionError> {
        let valid = text.len() == 32
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && text.as_bytes()[0] < b'8'
            && text.as_bytes()[16] < b'8';
        if valid {
            Ok(FeedPosition(text.to_owned()))
        } else {
            Err(InvalidFeedPositionError)
        }
    }

    /// The position as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for FeedPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One event of the feed, at its position.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FeedEvent {
    /// Where it is in the feed.
    pub position: FeedPosition,
    /// The event.
    pub event: Event,
}

/// A page of the feed ([`PgFeed::read`]): its events, and where the next
/// page starts.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FeedPage {
    /// The events, in feed order. Fewer than the page's size does not
    /// mean the end: events of transactions still in progress come later.
    pub events: Vec<FeedEvent>,
    /// The last position the page covered: read on after it, and
    /// acknowledge it once the events are processed. The last event's, or
    /// the `after` given when the page is empty.
    pub next_after: Option<FeedPosition>,
}

/// How a feed stream ([`PgFeed::stream`]) reads and waits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FeedOptions {
    /// The most events a batch holds (1 to 10000).
    pub batch_size: usize,
    /// How long it waits for new events before reading again when nothing
    /// wakes it.
    pub poll_interval: Duration,
    /// What wakes it when the feed notifies (a [`crate::event_store::PgNotifications`]'s).
    pub wake: Option<Wake>,
}

impl FeedOptions {
    /// Batches of up to 500 events, polled every second.
    #[must_use]
    pub fn new() -> Self {
        FeedOptions {
            batch_size: 500,
            poll_interval: Duration::from_secs(1),
            wake: None,
        }
    }

    /// Woken by `wake` (a [`crate::event_store::PgNotifications::wake`])
    /// when the feed notifies, besides polling.
    #[must_use]
    pub fn wake(mut self, wake: &Wake) -> Self {
        self.wake = Some(wake.clone());
        self
    }

    /// How long to wait between reads when nothing wakes it.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The most events a batch holds.
    #[must_use]
    pub fn batch_size(mut self, size: usize) -> Self {
        self.batch_size = size;
        self
    }
}

impl Default for FeedOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// The change feed of a PostgreSQL database with loom 0.16.0 or later
/// (either flavour, not Citus): see docs/feed.md.
#[derive(Clone)]
pub struct PgFeed {
    pool: PgPool,
    schema: SchemaCell,
}

impl std::fmt::Debug for PgFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgFeed")
            .field("pool", &self.pool.status())
            .finish()
    }
}

fn position(text: String) -> Result<FeedPosition> {
    FeedPosition::parse(&text).map_err(|_| {
        crate::Error::Unsupported("the server returned a feed position loom cannot read")
    })
}

impl PgFeed {
    /// The feed of `pool`'s database.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        PgFeed {
            pool,
            schema: SchemaCell::new(),
        }
    }

    async fn conn(&self) -> Result<Conn<'static>> {
        self.pool.conn().await
    }

    /// The page of up to `limit` positions after `after` (`None`: from the
    /// first), in feed order: only those no transaction still in progress
    /// can come before, so reading on from [`FeedPage::next_after`] never
    /// skips an event. An event deleted since it was appended (retention)
    /// is not there.
    ///
    /// # Errors
    ///
    /// [`crate::Error::InvalidPageSize`] for a `limit` of 0 or over
    /// 10000; [`crate::Error::Postgres`] with `42501` for a role that is
    /// not a reader, and `55000` after a restore until the owner runs
    /// `loom_feed_enable()`, or for an `after` past every position the
    /// database holds.
    pub async fn read(&self, after: Option<&FeedPosition>, limit: usize) -> Result<FeedPage> {
        super::check_limit(limit)?;
        let client = self.conn().await?;
        let rows = client
            .query(
                &self.schema.sql(&client, READ).await?,
                &[
                    (&after.map(FeedPosition::as_str), Type::TEXT),
                    (&sql_limit(limit), Type::INT4),
                ],
            )
            .await?;
        let mut page = FeedPage {
            events: Vec::with_capacity(rows.len()),
            next_after: after.cloned(),
        };
        for row in &rows {
            page.events.push(FeedEvent {
                position: position(column(row, 0)?)?,
                event: Event {
                    execution_id: column(row, 1)?,
                    sequence: column(row, 2)?,
                    kind: column(row, 3)?,
                    payload: pg_payload(row, 4)?,
                    created_at: Some(column(row, 5)?),
                    metadata: pg_metadata(row, 6)?,
                },
            });
        }
        if let Some(last) = page.events.last() {
            page.next_after = Some(last.position.clone());
        }
        Ok(page)
    }

    /// The last position readable now (`None`: the feed is empty): start
    /// a consumer there to read only what comes next.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Postgres`] with `42501` for a role that is not a
    /// reader, and `55000` after a restore until the owner runs
    /// `loom_feed_enable()`.
    pub async fn head(&self) -> Result<Option<FeedPosition>> {
        let client = self.conn().await?;
        let row = client
            .query_one(&self.schema.sql(&client, HEAD).await?, &[])
            .await?;
        column::<Option<String>>(&row, 0)?.map(position).transpose()
    }

    /// Creates the consumer `name`, owned by this role, starting after
    /// `start_after` (`None`: from the first event), unless it exists.
    /// Returns its acknowledged position (`None`: the start).
    ///
    /// # Errors
    ///
    /// [`crate::Error::Postgres`] with `42501` when another role owns the
    /// name, or for a role that is not a writer.
    pub async fn create_consumer(
        &self,
        name: &str,
        start_after: Option<&FeedPosition>,
    ) -> Result<Option<FeedPosition>> {
        let client = self.conn().await?;
        let row = client
            .query_one(
                &self.schema.sql(&client, CREATE).await?,
                &[
                    (&name, Type::TEXT),
                    (&start_after.map(FeedPosition::as_str), Type::TEXT),
                ],
            )
            .await?;
        let acked: String = column(&row, 0)?;
        if acked.is_empty() {
            Ok(None)
        } else {
            position(acked).map(Some)
        }
    }

    /// The consumer's acknowledged position (`None`: the start).
    ///
    /// # Errors
    ///
    /// [`crate::Error::Postgres`] with `42704` for a consumer this role
    /// cannot see.
    pub async fn acknowledged(&self, name: &str) -> Result<Option<FeedPosition>> {
        let client = self.conn().await?;
        let row = client.query_opt(ACKED, &[(&name, Type::TEXT)]).await?;
        match row {
            None => {
                // The server's own 42704, with its message.
                client
                    .query(
                        &self.schema.sql(&client, NEXT_NONE).await?,
                        &[(&name, Type::TEXT)],
                    )
                    .await?;
                Err(crate::Error::Unsupported(
                    "the feed consumer disappeared while it was read",
                ))
            }
            Some(row) => {
                let acked: String = column(&row, 0)?;
                if acked.is_empty() {
                    Ok(None)
                } else {
                    position(acked).map(Some)
                }
            }
        }
    }

    /// Acknowledges `position` for consumer `name`: it resumes after it.
    /// Never backwards (acknowledging an older position changes nothing).
    /// Returns the acknowledged position.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Postgres`] with `42704` for a consumer this role
    /// cannot see, `42501` for a role that is not a writer.
    pub async fn ack(&self, name: &str, acked: &FeedPosition) -> Result<FeedPosition> {
        let client = self.conn().await?;
        let row = client
            .query_one(
                &self.schema.sql(&client, ACK).await?,
                &[
                    (&name, Type::TEXT),
                    (&acked.as_str(), Type::TEXT),
                    (&None::<&str>, Type::TEXT),
                ],
            )
            .await?;
        position(column(&row, 0)?)
    }

    /// Drops consumer `name` (this role's, or one it may act as). Returns
    /// whether there was one.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Postgres`] with `42501` for a role that is not a writer.
    pub async fn drop_consumer(&self, name: &str) -> Result<bool> {
        let client = self.conn().await?;
        let row = client
            .query_one(
                &self.schema.sql(&client, DROP_CONSUMER).await?,
                &[(&name, Type::TEXT)],
            )
            .await?;
        column(&row, 0)
    }

    /// Consumer `name`'s events as a stream of pages, each with at least
    /// one event, from its acknowledged position on: at least once, in
    /// feed order. The stream keeps its own place between pages;
    /// acknowledge ([`PgFeed::ack`]) each page's [`FeedPage::next_after`]
    /// once processed, and a consumer started again (after a crash)
    /// resumes after the last acknowledgement, so the events after it come
    /// again. When nothing is new it waits for a wake-up
    /// ([`FeedOptions::wake`]) or a while: 50 ms after events or a
    /// wake-up (an event becomes readable once every older transaction
    /// of the cluster has ended, which nothing announces), doubling up to
    /// [`FeedOptions::poll_interval`]. A read that fails ends the stream
    /// with its error.
    pub fn stream<'a>(
        &'a self,
        name: &'a str,
        options: FeedOptions,
    ) -> impl Stream<Item = Result<FeedPage>> + 'a {
        struct State<'a> {
            feed: &'a PgFeed,
            name: &'a str,
            options: FeedOptions,
            subscription: Option<super::watch::Subscription>,
            after: Option<Option<FeedPosition>>,
            failed: bool,
            /// How long the next empty read waits: short after events or a
            /// wake-up, doubling up to the poll interval.
            backoff: Duration,
        }
        let subscription = options
            .wake
            .as_ref()
            .map(|wake| wake.subscribe(FEED_KEY.to_owned()));
        let state = State {
            feed: self,
            name,
            options,
            subscription,
            after: None,
            failed: false,
            backoff: FIRST_BACKOFF,
        };
        futures::stream::unfold(state, |mut state| async move {
            if state.failed {
                return None;
            }
            let after = match state.after.clone() {
                Some(after) => after,
                None => match state.feed.acknowledged(state.name).await {
                    Ok(acked) => acked,
                    Err(e) => {
                        state.failed = true;
                        return Some((Err(e), state));
                    }
                },
            };
            loop {
                if let Some(subscription) = state.subscription.as_mut() {
                    subscription.seen();
                }
                match state
                    .feed
                    .read(after.as_ref(), state.options.batch_size)
                    .await
                {
                    Ok(page) if !page.events.is_empty() => {
                        state.after = Some(page.next_after.clone());
                        state.backoff = FIRST_BACKOFF;
                        return Some((Ok(page), state));
                    }
                    // Nothing readable yet. An event is readable once every
                    // older transaction of the cluster has ended, which
                    // nothing announces: a wake-up (its commit) reads at
                    // once, then again soon, backing off to the poll
                    // interval.
                    Ok(_) => {
                        state.after = Some(after.clone());
                        let wait = state.backoff.min(state.options.poll_interval);
                        let woken = match state.subscription.as_mut() {
                            Some(subscription) => subscription.wait(wait).await,
                            None => {
                                tokio::time::sleep(wait).await;
                                false
                            }
                        };
                        state.backoff = if woken { FIRST_BACKOFF } else { wait * 2 };
                    }
                    Err(e) => {
                        state.failed = true;
                        return Some((Err(e), state));
                    }
                }
            }
        })
    }
}

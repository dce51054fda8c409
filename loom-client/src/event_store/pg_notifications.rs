//! One `LISTEN` connection that wakes [`watch_events`](super::watch_events)
//! streams when a store that notifies ([`PgEventStore::notify_appends`](super::PgEventStore::notify_appends))
//! appends.
//!
//! A connection of its own, not a pooled one: deadpool drives its
//! connections' messages itself and drops notifications, and a `LISTEN`
//! on a connection a pool hands to others would outlive its user. Behind a
//! transaction-mode pooler (PgBouncer, Neon's pooler) `LISTEN` does not
//! work: point [`PgNotifications::listen`] at the server directly, or go
//! without it and let watchers poll.

use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use super::pg::NOTIFY_CHANNEL;
use super::Wake;
use crate::Result;

/// A `LISTEN` on [`NOTIFY_CHANNEL`], fanned out to every watcher as a
/// [`Wake`]. Dropping it closes the connection; watchers then poll.
///
/// ```no_run
/// # async fn f(store: &loom_client::event_store::PgEventStore) -> loom_client::Result<()> {
/// use futures::StreamExt;
/// use loom_client::event_store::{watch_events, PgNotifications, WatchOptions};
/// let notifications = PgNotifications::listen("host=db.internal dbname=app").await?;
/// let mut options = WatchOptions::new();
/// options.wake(notifications.wake());
/// let mut events = Box::pin(watch_events(store, "run-1", None, &options));
/// while let Some(event) = events.next().await {
///     let event = event?;
///     println!("{} {}", event.sequence, event.kind);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PgNotifications {
    wake: Wake,
    /// Kept: dropping the client closes the connection.
    _client: tokio_postgres::Client,
    driver: JoinHandle<()>,
}

impl PgNotifications {
    /// Opens a connection to `config` (a libpq connection string or URL,
    /// TLS as its `sslmode` says) and listens on [`NOTIFY_CHANNEL`].
    ///
    /// # Errors
    ///
    /// What connecting fails with ([`crate::Error::ConnectTimeout`] after
    /// 5 s); the server's refusal of `LISTEN` (a transaction-mode pooler).
    pub async fn listen(config: &str) -> Result<Self> {
        let (client, mut connection) = crate::pg_connect::connect(config).await?;
        let wake = Wake::new(4096);
        let sender = wake.clone();
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    if n.channel() == NOTIFY_CHANNEL {
                        sender.notify_key(n.payload().to_owned());
                    }
                }
            }
        });
        client.batch_execute("LISTEN loom_events").await?;
        Ok(PgNotifications {
            wake,
            _client: client,
            driver,
        })
    }

    /// What wakes watchers: give it to [`super::WatchOptions::wake`].
    #[must_use]
    pub fn wake(&self) -> &Wake {
        &self.wake
    }

    /// Whether the connection is still up (it ends with the server's
    /// restart, a network failure): without it watchers only poll, and a
    /// service opens a new one.
    #[must_use]
    pub fn is_listening(&self) -> bool {
        !self.driver.is_finished()
    }
}

impl Drop for PgNotifications {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

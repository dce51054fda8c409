//! One `LISTEN` connection that wakes [`watch_events`](super::watch_events)
//! streams when a store that notifies ([`PgEventStore::with_append_notifications`](super::PgEventStore::with_append_notifications))
//! appends.
//!
//! A connection of its own, not a pooled one: deadpool drives its
//! connections' messages itself and drops notifications, and a `LISTEN`
//! on a connection a pool hands to others would outlive its user. Behind a
//! transaction-mode pooler (PgBouncer, Neon's pooler) `LISTEN` does not
//! work: point [`PgNotifications::listen`] at the server directly, or go
//! without it and let watchers poll. A listener that cannot hear is refused,
//! not kept: each connection, before it is used, sends itself a
//! notification from a second, short-lived one and waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use super::feed::{FEED_CHANNEL, FEED_KEY};
use super::pg::NOTIFY_CHANNEL;
use super::Wake;
use crate::Result;

/// The first wait before connecting again after the connection ended; it
/// doubles at each failed attempt up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two attempts to connect again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often an idle `LISTEN` connection is checked with an empty query: a
/// NAT gateway or load balancer that drops an idle flow says nothing, and
/// TCP keepalive would notice only after two hours.
const HEARTBEAT: Duration = Duration::from_secs(30);
/// How long the heartbeat, and a new connection's `LISTEN`, may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// Where a new listener sends itself a notification from a second
/// connection, to know that notifications reach it.
const PROBE_CHANNEL: &str = "loom_listener_probe";
/// How long that notification may take to arrive.
const PROBE_WITHIN: Duration = Duration::from_secs(3);

/// A `LISTEN` on [`NOTIFY_CHANNEL`] that wakes each execution's watchers
/// through a [`Wake`], and heals: when its connection ends (a server
/// restart, a failover, a terminated backend, a network failure) it says
/// so through `tracing`, connects again with backoff (100 ms doubling to
/// 30 s), `LISTEN`s again, and then wakes every watcher once, so that
/// none misses an event appended while it was down. Watchers poll
/// meanwhile. Dropping it closes the connection.
///
/// Give it a direct connection to the server: a transaction-mode pooler
/// cannot carry `LISTEN` (docs/client.md#poolers). The stores may stay on
/// the pooler.
///
/// ```no_run
/// # async fn f(store: &pgloom::event_store::PgEventStore) -> pgloom::Result<()> {
/// use futures::StreamExt;
/// use pgloom::event_store::{watch_events, PgNotifications, WatchOptions};
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
    listening: Arc<AtomicBool>,
    supervisor: JoinHandle<()>,
}

/// One `LISTEN` connection: its client (dropping it closes the
/// connection) and the task that forwards its notifications, which ends
/// with the connection.
struct Listener {
    client: tokio_postgres::Client,
    driver: JoinHandle<()>,
}

impl Listener {
    /// Connects to `config`, forwards notifications to `wake`, `LISTEN`s,
    /// and proves that notifications reach it ([`Listener::probe`]).
    async fn open(config: &str, wake: &Wake) -> Result<Listener> {
        let (client, mut connection) = crate::pg_connect::connect(config).await?;
        let wake = wake.clone();
        let (probed, mut probes) = tokio::sync::mpsc::unbounded_channel::<String>();
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    if n.channel() == NOTIFY_CHANNEL {
                        wake.notify_key(n.payload());
                    } else if n.channel() == FEED_CHANNEL {
                        wake.notify_key(FEED_KEY);
                    } else if n.channel() == PROBE_CHANNEL {
                        let _ = probed.send(n.payload().to_owned());
                    }
                }
            }
        });
        let listen =
            format!("LISTEN {NOTIFY_CHANNEL}; LISTEN {FEED_CHANNEL}; LISTEN {PROBE_CHANNEL}");
        match tokio::time::timeout(ANSWER_WITHIN, client.batch_execute(&listen)).await {
            Ok(listened) => listened?,
            Err(_) => return Err(crate::Error::ConnectTimeout(ANSWER_WITHIN)),
        }
        if let Err(e) = Self::probe(config, &mut probes).await {
            // Behind a pooler the LISTENs stay on a server connection that
            // others get next: take them back before giving up.
            let _ = tokio::time::timeout(ANSWER_WITHIN, client.batch_execute("UNLISTEN *")).await;
            return Err(e);
        }
        // Other listeners' probes need not reach this one any more.
        let unlisten = format!("UNLISTEN {PROBE_CHANNEL}");
        match tokio::time::timeout(ANSWER_WITHIN, client.batch_execute(&unlisten)).await {
            Ok(unlistened) => unlistened?,
            Err(_) => return Err(crate::Error::ConnectTimeout(ANSWER_WITHIN)),
        }
        Ok(Listener { client, driver })
    }

    /// Sends [`PROBE_CHANNEL`] a notification of its own from a second
    /// connection to `config`, and waits for it to come back to `probes`.
    /// A `LISTEN` through a transaction-mode pooler is taken by a server
    /// session the pooler then hands to others: the notification reaches
    /// that session (or another client), never this listener, and nothing
    /// else would say so.
    async fn probe(
        config: &str,
        probes: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    ) -> Result<()> {
        let token = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        );
        let (sender, connection) = crate::pg_connect::connect(config).await?;
        let sender_driver = tokio::spawn(connection);
        let sent = tokio::time::timeout(
            ANSWER_WITHIN,
            sender.query_typed(
                "SELECT pg_catalog.pg_notify($1, $2)",
                &[
                    (&PROBE_CHANNEL, tokio_postgres::types::Type::TEXT),
                    (&token, tokio_postgres::types::Type::TEXT),
                ],
            ),
        )
        .await;
        drop(sender);
        sender_driver.abort();
        match sent {
            Ok(sent) => {
                sent.map_err(crate::pg_connect::from_postgres)?;
            }
            Err(_) => return Err(crate::Error::ConnectTimeout(ANSWER_WITHIN)),
        }
        let arrived = tokio::time::timeout(PROBE_WITHIN, async {
            while let Some(payload) = probes.recv().await {
                if payload == token {
                    return true;
                }
            }
            false
        })
        .await;
        match arrived {
            Ok(true) => Ok(()),
            _ => Err(crate::Error::NotificationsNotDelivered(PROBE_WITHIN)),
        }
    }

    /// Returns once the connection has ended, or has not answered an empty
    /// query within [`ANSWER_WITHIN`] (checked every [`HEARTBEAT`]).
    async fn until_lost(&mut self) {
        loop {
            let beat = std::pin::pin!(tokio::time::sleep(HEARTBEAT));
            if let futures::future::Either::Left(_) =
                futures::future::select(&mut self.driver, beat).await
            {
                return;
            }
            let answered = tokio::time::timeout(ANSWER_WITHIN, self.client.batch_execute("")).await;
            if !matches!(answered, Ok(Ok(()))) {
                self.driver.abort();
                return;
            }
        }
    }
}

impl PgNotifications {
    /// Opens a connection to `config` (a libpq connection string or URL,
    /// TLS as its `sslmode` says) and listens on [`NOTIFY_CHANNEL`]; from
    /// then on it connects again by itself whenever the connection ends.
    ///
    /// # Errors
    ///
    /// What the first connection fails with ([`crate::Error::ConnectTimeout`]
    /// after 5 s); the server's refusal of `LISTEN`;
    /// [`crate::Error::NotificationsNotDelivered`] when a notification sent
    /// to it from a second connection does not come back within 3 s (a
    /// transaction-mode pooler takes the `LISTEN` and delivers nothing). A
    /// later failure is retried, never returned.
    pub async fn listen(config: &str) -> Result<Self> {
        let wake = Wake::new();
        let first = Listener::open(config, &wake).await?;
        let listening = Arc::new(AtomicBool::new(true));
        let supervisor = tokio::spawn(supervise(
            config.to_owned(),
            first,
            wake.clone(),
            Arc::clone(&listening),
        ));
        Ok(PgNotifications {
            wake,
            listening,
            supervisor,
        })
    }

    /// What wakes watchers: give it to [`super::WatchOptions::wake`].
    #[must_use]
    pub fn wake(&self) -> &Wake {
        &self.wake
    }

    /// Whether the `LISTEN` connection is up now. While it is not, watchers
    /// poll and it is connecting again.
    #[must_use]
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Acquire) && !self.supervisor.is_finished()
    }
}

/// Keeps a `LISTEN` connection to `config` up for as long as it runs:
/// `listener` first, then a new one each time the last one's connection
/// ends or stops answering its heartbeat, with backoff; every watcher
/// woken once each is up again.
async fn supervise(config: String, mut listener: Listener, wake: Wake, listening: Arc<AtomicBool>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let up_since = tokio::time::Instant::now();
        listener.until_lost().await;
        listening.store(false, Ordering::Release);
        drop(listener);
        crate::telemetry::degraded(
            "loom: the LISTEN connection of PgNotifications ended: watchers poll until it is back; connecting again",
            None,
        );
        // A connection that stayed up a while starts the backoff over; one
        // that dies at once (a flapping network, a reaper) does not.
        if up_since.elapsed() > MAX_BACKOFF {
            backoff = FIRST_BACKOFF;
        }
        listener = loop {
            tokio::time::sleep(backoff).await;
            backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
            match Listener::open(&config, &wake).await {
                Ok(listener) => break listener,
                Err(e) => {
                    tracing::warn!(target: "pgloom::degraded", error = %e, retry_in = ?backoff, "loom: PgNotifications could not connect again");
                }
            }
        };
        listening.store(true, Ordering::Release);
        tracing::info!(target: "pgloom::degraded", "loom: PgNotifications is listening again");
        // Whatever was appended while no one listened notified no one.
        wake.notify_all();
    }
}

impl Drop for PgNotifications {
    fn drop(&mut self) {
        self.supervisor.abort();
    }
}

//! Reading a log as a stream, and waiting for what is appended to it.
//!
//! Workers that follow an execution used to poll by hand. [`read_events_stream`]
//! pages a whole log through [`EventStore::read_events_after`] without
//! holding it in memory; [`watch_events`] does the same and then waits for
//! new events: woken by a [`Wake`] (PostgreSQL's `LISTEN`, through
//! [`crate::event_store::PgNotifications`]) where the connection allows it,
//! and by its poll interval always, so a missed or impossible notification
//! (a transaction-mode pooler, an appender that does not notify) only
//! delays an event, never loses it.

use std::time::Duration;

use futures::stream::{self, Stream};
use tokio::sync::broadcast;

use super::{check_limit, Event, EventStore};
use crate::Result;

/// Every event of `execution_id` after `after` (`None`: from the first),
/// in sequence order, read `page_size` at a time: the whole log without
/// holding it in memory.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use futures::TryStreamExt;
/// use loom_client::event_store::{read_events_stream, Event, EventStore, MemoryEventStore};
/// let store = MemoryEventStore::new();
/// for n in 1..=5 {
///     store.append(&[Event::new("run-1", n, "step", serde_json::json!({}))]).await?;
/// }
/// let all: Vec<Event> = read_events_stream(&store, "run-1", None, 2).try_collect().await?;
/// assert_eq!(all.len(), 5);
/// # Ok::<(), loom_client::Error>(()) })?;
/// # Ok::<(), loom_client::Error>(())
/// ```
pub fn read_events_stream<'a, S: EventStore>(
    store: &'a S,
    execution_id: &'a str,
    after: Option<i64>,
    page_size: usize,
) -> impl Stream<Item = Result<Event>> + 'a {
    use futures::TryStreamExt as _;
    stream::try_unfold(Some(after), move |cursor| async move {
        let Some(after) = cursor else {
            return Ok::<_, crate::Error>(None);
        };
        check_limit(page_size)?;
        let page = store
            .read_events_after(execution_id, after, page_size)
            .await?;
        let next = match page.last() {
            Some(last) if page.len() >= page_size => Some(Some(last.sequence)),
            _ => None,
        };
        Ok(Some((stream::iter(page.into_iter().map(Ok)), next)))
    })
    .try_flatten()
}

/// What wakes a [`watch_events`] stream early: the executions that were
/// appended to, each as its key (the md5 of its id, in hex: what a
/// PostgreSQL notification carries, so that no id is broadcast to every
/// session that may `LISTEN`). [`crate::event_store::PgNotifications`] is one (a
/// `LISTEN` connection); a service can feed its own from any bus.
#[derive(Debug, Clone)]
pub struct Wake {
    sender: broadcast::Sender<String>,
}

impl Wake {
    /// A source of wake-ups that keeps up to `capacity` ids a slow watcher
    /// has not seen yet (a watcher that falls further behind reads its
    /// log at once, then waits again: nothing is lost).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Wake {
            sender: broadcast::channel(capacity.max(1)).0,
        }
    }

    /// Wakes the watchers of `execution_id`, as the store under any view
    /// holds it (a tenant view's `acme/run-1`, not `run-1`).
    pub fn notify(&self, execution_id: &str) {
        self.notify_key(key(execution_id));
    }

    /// Wakes the watchers of the execution whose key ([`Wake::key`]) this
    /// is: what a notification's payload names.
    pub fn notify_key(&self, key: String) {
        // No watcher: nobody to wake.
        let _ = self.sender.send(key);
    }

    /// An execution's key: the md5 of its id's UTF-8 bytes, in lowercase
    /// hex, as PostgreSQL's `md5(text)` prints it.
    ///
    /// ```
    /// assert_eq!(loom_client::event_store::Wake::key("run-1").len(), 32);
    /// ```
    #[must_use]
    pub fn key(execution_id: &str) -> String {
        key(execution_id)
    }

    fn subscribe(&self) -> broadcast::Receiver<String> {
        self.sender.subscribe()
    }
}

/// How a [`watch_events`] stream waits.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    poll_interval: Duration,
    page_size: usize,
    wake: Option<Wake>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl WatchOptions {
    /// Polls every second, reads 100 events a page, no wake-ups.
    #[must_use]
    pub fn new() -> Self {
        WatchOptions {
            poll_interval: Duration::from_secs(1),
            page_size: 100,
            wake: None,
        }
    }

    /// How long a watcher waits before it looks again without a wake-up:
    /// the longest an event goes unseen when no notification comes.
    pub fn poll_interval(&mut self, interval: Duration) -> &mut Self {
        self.poll_interval = interval;
        self
    }

    /// How many events a read takes.
    pub fn page_size(&mut self, page_size: usize) -> &mut Self {
        self.page_size = page_size;
        self
    }

    /// Wake-ups that end a wait early.
    pub fn wake(&mut self, wake: &Wake) -> &mut Self {
        self.wake = Some(wake.clone());
        self
    }
}

/// The events of `execution_id` after `after`, in sequence order, then
/// each new one as it is appended, for as long as the stream is polled: a
/// worker's loop over an execution. It reads what is there, then waits
/// for a wake-up for this execution or the poll interval, whichever comes
/// first, and reads again. An error ends nothing: it is yielded, and the
/// next poll reads again from the last event yielded.
///
/// Cancel-safe: drop the stream to stop; resume later from the last
/// sequence seen.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use futures::StreamExt;
/// use loom_client::event_store::{watch_events, Event, EventStore, MemoryEventStore, Wake, WatchOptions};
/// let store = MemoryEventStore::new();
/// let wake = Wake::new(64);
/// let mut options = WatchOptions::new();
/// options.wake(&wake);
/// let mut events = Box::pin(watch_events(&store, "run-1", None, &options));
/// store.append(&[Event::new("run-1", 1, "started", serde_json::json!({}))]).await?;
/// wake.notify("run-1");
/// assert_eq!(events.next().await.unwrap()?.sequence, 1);
/// # Ok::<(), loom_client::Error>(()) })?;
/// # Ok::<(), loom_client::Error>(())
/// ```
pub fn watch_events<'a, S: EventStore>(
    store: &'a S,
    execution_id: &'a str,
    after: Option<i64>,
    options: &WatchOptions,
) -> impl Stream<Item = Result<Event>> + 'a {
    struct State {
        after: Option<i64>,
        pending: std::vec::IntoIter<Event>,
        /// Subscribed before the first read, so that a wake-up sent between
        /// a read and the wait after it is kept, not missed.
        woken: Option<broadcast::Receiver<String>>,
        /// Whether the last read filled its page (read again at once).
        full: bool,
        /// The key a notification of this execution carries.
        wanted: Option<String>,
        first: bool,
    }
    let (poll_interval, page_size) = (options.poll_interval, options.page_size);
    // A notification names the stored id: a view's prefix and all. Shards
    // of different scopes name nothing one key could match: poll.
    let wanted = match store.id_scope() {
        crate::id_scope::IdScope::Prefix(prefix) => Some(key(&format!("{prefix}{execution_id}"))),
        _ => None,
    };
    let state = State {
        after,
        pending: Vec::new().into_iter(),
        woken: options.wake.as_ref().map(Wake::subscribe),
        full: false,
        wanted,
        first: true,
    };
    stream::unfold(state, move |mut state| async move {
        loop {
            if let Some(event) = state.pending.next() {
                state.after = Some(event.sequence);
                return Some((Ok(event), state));
            }
            if !state.first && !state.full {
                wait(&mut state.woken, state.wanted.as_deref(), poll_interval).await;
            }
            state.first = false;
            match store
                .read_events_after(execution_id, state.after, page_size)
                .await
            {
                Ok(page) => {
                    state.full = page.len() >= page_size;
                    state.pending = page.into_iter();
                }
                Err(e) => {
                    state.full = false;
                    return Some((Err(e), state));
                }
            }
        }
    })
}

/// An execution's key ([`Wake::key`]).
fn key(execution_id: &str) -> String {
    use md5::Digest as _;
    md5::Md5::digest(execution_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Waits for a wake-up naming the key `wanted`, or `poll_interval`.
async fn wait(
    woken: &mut Option<broadcast::Receiver<String>>,
    wanted: Option<&str>,
    poll_interval: Duration,
) {
    let (Some(receiver), Some(wanted)) = (woken, wanted) else {
        tokio::time::sleep(poll_interval).await;
        return;
    };
    let woken = async {
        loop {
            match receiver.recv().await {
                Ok(key) if key.as_str() == wanted => return,
                Ok(_) => {}
                // Fell behind: whatever it missed may be ours.
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                // The source is gone: poll from now on.
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    };
    let _ = tokio::time::timeout(poll_interval, woken).await;
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn a_key_is_the_md5_postgresql_prints() {
        // SELECT md5('run-1'), md5('é/ü') on a UTF-8 database.
        assert_eq!(key("run-1"), "5b7469680d9900159c653ddb9ff22ae7");
        assert_eq!(key("é/ü"), "8021eb2ff446c0a451b02ba2ff08b06b");
    }
}

//! Reading a log as a stream, and waiting for what is appended to it.
//!
//! So that a worker following an execution need not poll by hand,
//! [`read_events_stream`] pages a whole log through [`EventStore::read_events_after`] without
//! holding it in memory; [`watch_events`] does the same and then waits for
//! new events: woken by a [`Wake`] (PostgreSQL's `LISTEN`, through
//! [`crate::event_store::PgNotifications`]) where the connection allows it,
//! and by its poll interval always, so a missed or impossible notification
//! (a transaction-mode pooler, an appender that does not notify) only
//! delays an event, never loses it.

use std::time::Duration;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::stream::{self, Stream};
use tokio::sync::watch;

use super::{check_limit, Event, EventStore};
use crate::Result;

/// Every event of `execution_id` after `after` (`None`: from the first),
/// in sequence order, read `page_size` at a time: the whole log without
/// holding it in memory.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use futures::TryStreamExt;
/// use pgloom::event_store::{read_events_stream, Event, EventStore, MemoryEventStore};
/// let store = MemoryEventStore::new();
/// for n in 1..=5 {
///     store.append(&[Event::new("run-1", n, "step", serde_json::json!({}))]).await?;
/// }
/// let all: Vec<Event> = read_events_stream(&store, "run-1", None, 2).try_collect().await?;
/// assert_eq!(all.len(), 5);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
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
///
/// Keyed: a wake-up reaches the watchers of its execution alone, however
/// many others there are, and a watcher keeps one that comes while it
/// reads (it reads again at once). Clones share the watchers.
#[derive(Debug, Clone, Default)]
pub struct Wake {
    inner: Arc<WakeInner>,
}

#[derive(Debug)]
struct WakeInner {
    /// Each watched key's counter, while it has watchers.
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Bumped by [`Wake::notify_all`].
    everyone: watch::Sender<u64>,
}

impl Default for WakeInner {
    fn default() -> Self {
        WakeInner {
            keys: Mutex::new(HashMap::new()),
            everyone: watch::channel(0).0,
        }
    }
}

impl Wake {
    /// A source of wake-ups with no watchers yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes the watchers of `execution_id`, as the store under any view
    /// holds it (a tenant view's `acme/run-1`, not `run-1`).
    pub fn notify(&self, execution_id: &str) {
        self.notify_key(&key(execution_id));
    }

    /// Wakes the watchers of the execution whose key ([`Wake::key`]) this
    /// is: what a notification's payload names. Nobody watching it: a
    /// lookup, nothing more.
    pub fn notify_key(&self, key: &str) {
        if let Some(counter) = self.keys().get(key) {
            counter.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every watcher: what a source says when it may have missed
    /// wake-ups (a `LISTEN` connection back after an outage), so that each
    /// reads its log again.
    pub fn notify_all(&self) {
        self.inner.everyone.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// An execution's key: the md5 of its id's UTF-8 bytes, in lowercase
    /// hex, as PostgreSQL's `md5(text)` prints it (the id itself in a
    /// build without the `postgres` feature, which has no notifications).
    ///
    /// ```
    /// assert_eq!(pgloom::event_store::Wake::key("run-1").len(), 32);
    /// ```
    #[must_use]
    pub fn key(execution_id: &str) -> String {
        key(execution_id)
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A watcher of `key`, until it is dropped.
    pub(crate) fn subscribe(&self, key: String) -> Subscription {
        let keyed = self
            .keys()
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Subscription {
            wake: self.clone(),
            key,
            keyed,
            everyone: self.inner.everyone.subscribe(),
        }
    }
}

/// One watcher's wake-ups: its key's and everyone's.
pub(crate) struct Subscription {
    wake: Wake,
    key: String,
    keyed: watch::Receiver<u64>,
    everyone: watch::Receiver<u64>,
}

impl Subscription {
    /// Marks every wake-up so far as seen: called before a read, so that
    /// one sent during the read ends the next wait at once.
    pub(crate) fn seen(&mut self) {
        self.keyed.borrow_and_update();
        self.everyone.borrow_and_update();
    }

    /// Waits for a wake-up not yet seen, or `poll_interval`.
    /// Whether a wake-up ended it (not the interval).
    pub(crate) async fn wait(&mut self, poll_interval: Duration) -> bool {
        let keyed = std::pin::pin!(self.keyed.changed());
        let everyone = std::pin::pin!(self.everyone.changed());
        tokio::time::timeout(poll_interval, futures::future::select(keyed, everyone))
            .await
            .is_ok()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut keys = self.wake.keys();
        // This watcher's receiver goes under the lock, so that of two
        // watchers of one key dropped at once, the last sees none left.
        drop(std::mem::replace(&mut self.keyed, watch::channel(0).1));
        if keys
            .get(&self.key)
            .is_some_and(|counter| counter.receiver_count() == 0)
        {
            keys.remove(&self.key);
        }
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
/// use pgloom::event_store::{watch_events, Event, EventStore, MemoryEventStore, Wake, WatchOptions};
/// let store = MemoryEventStore::new();
/// let wake = Wake::new();
/// let mut options = WatchOptions::new();
/// options.wake(&wake);
/// let mut events = Box::pin(watch_events(&store, "run-1", None, &options));
/// store.append(&[Event::new("run-1", 1, "started", serde_json::json!({}))]).await?;
/// wake.notify("run-1");
/// assert_eq!(events.next().await.unwrap()?.sequence, 1);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
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
        woken: Option<Subscription>,
        /// Whether the last read filled its page (read again at once).
        full: bool,
        first: bool,
    }
    let (poll_interval, page_size) = (options.poll_interval, options.page_size);
    // A notification names the stored id: a view's prefix and all. Shards
    // of different scopes name nothing one key could match: poll.
    let wanted = match store.id_scope() {
        crate::id_scope::IdScope::Prefix(prefix) => Some(key(&format!("{prefix}{execution_id}"))),
        _ => None,
    };
    if options.wake.is_none() || wanted.is_none() {
        polling_once();
    }
    let state = State {
        after,
        pending: Vec::new().into_iter(),
        woken: options
            .wake
            .as_ref()
            .zip(wanted)
            .map(|(wake, key)| wake.subscribe(key)),
        full: false,
        first: true,
    };
    stream::unfold(state, move |mut state| async move {
        loop {
            if let Some(event) = state.pending.next() {
                state.after = Some(event.sequence);
                return Some((Ok(event), state));
            }
            if !state.first && !state.full {
                match &mut state.woken {
                    Some(woken) => {
                        woken.wait(poll_interval).await;
                    }
                    None => tokio::time::sleep(poll_interval).await,
                }
            }
            state.first = false;
            if let Some(woken) = &mut state.woken {
                woken.seen();
            }
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

/// An execution's key ([`Wake::key`]): the md5 PostgreSQL prints, which
/// its notifications carry; a build without PostgreSQL has no such
/// notifications to match, and keys an execution by its id.
#[cfg(feature = "postgres")]
fn key(execution_id: &str) -> String {
    use md5::Digest as _;
    md5::Md5::digest(execution_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An execution's key ([`Wake::key`]), without PostgreSQL: its id.
#[cfg(not(feature = "postgres"))]
fn key(execution_id: &str) -> String {
    execution_id.to_owned()
}

/// Says once per process, through `tracing`, that watchers poll: a
/// [`watch_events`] without a [`Wake`] (or over shards of different views,
/// which no one key names) sees a new event only at its poll interval.
fn polling_once() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        crate::telemetry::degraded(
            "loom: watch_events has no wake-up (WatchOptions::wake, e.g. PgNotifications::listen on a direct connection): watchers poll, and see a new event only at their poll interval",
            None,
        );
    });
}

#[cfg(test)]
mod tests {
    use super::{key, Wake};

    #[test]
    fn a_wake_up_reaches_its_own_execution_s_watchers_alone() {
        let wake = Wake::new();
        let mut mine = wake.subscribe(key("run-1"));
        let mut also_mine = wake.subscribe(key("run-1"));
        let mut other = wake.subscribe(key("run-2"));
        for watcher in [&mut mine, &mut also_mine, &mut other] {
            watcher.seen();
        }
        for _ in 0..100 {
            wake.notify("run-2");
        }
        assert!(!mine.keyed.has_changed().unwrap());
        assert!(other.keyed.has_changed().unwrap());
        wake.notify("run-1");
        assert!(mine.keyed.has_changed().unwrap() && also_mine.keyed.has_changed().unwrap());
        // Everyone's wake-up reaches every watcher.
        other.seen();
        wake.notify_all();
        assert!(other.everyone.has_changed().unwrap() && mine.everyone.has_changed().unwrap());
        // A key with no watchers left is forgotten.
        drop(other);
        assert!(!wake.keys().contains_key(&key("run-2")));
        drop(mine);
        assert!(wake.keys().contains_key(&key("run-1")));
        drop(also_mine);
        assert!(wake.keys().is_empty());
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_key_is_the_md5_postgresql_prints() {
        // SELECT md5('run-1'), md5('é/ü') on a UTF-8 database.
        assert_eq!(key("run-1"), "5b7469680d9900159c653ddb9ff22ae7");
        assert_eq!(key("é/ü"), "8021eb2ff446c0a451b02ba2ff08b06b");
    }
}

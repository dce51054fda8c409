//! An event store chosen by configuration, so that a service starts on
//! SQLite or one Postgres and grows to several Postgres shards by changing
//! one string, not code.

use std::str::FromStr;

use super::{Event, EventStore, MemoryEventStore, Page, ShardedEventStore};
use crate::Result;

/// Where the log lives, parsed from a string (an environment variable, a
/// config file):
///
/// | string | store |
/// |---|---|
/// | `memory:` | [`MemoryEventStore`] |
/// | `sqlite:<path>` | [`super::SqliteEventStore`] (`sqlite::memory:` for a private in-memory database) |
/// | `postgres:<conninfo or URL>` | [`super::PgEventStore`] |
/// | `citus:<conninfo or URL>` | [`super::PgEventStore::connect_citus`]: a Citus coordinator, loom's tables distributed |
/// | `postgres:<a>;postgres:<b>;postgres:<c>` | [`ShardedEventStore`] over them, in that order |
///
/// ```
/// use pgloom::event_store::StoreConfig;
/// let one: StoreConfig = "sqlite:/var/lib/app/loom.db".parse()?;
/// let three: StoreConfig = "postgres:host=a dbname=app;postgres:host=b dbname=app;postgres:host=c dbname=app".parse()?;
/// assert!(matches!(three, StoreConfig::Sharded(ref shards) if shards.len() == 3));
/// let citus: StoreConfig = "citus:host=coordinator dbname=app".parse()?;
/// assert!(matches!(citus, StoreConfig::Citus(_)));
/// assert!("citus:host=a;citus:host=b".parse::<StoreConfig>().is_err());
/// assert!("mysql:x".parse::<StoreConfig>().is_err());
/// # Ok::<(), pgloom::event_store::ParseStoreConfigError>(())
/// ```
///
/// A `;` separates shards only where a scheme follows it (`;postgres:`, or
/// any `word:`, so that a mistyped one is refused) outside a single-quoted
/// value: a password or an `options=` value may hold one
/// (`password=se;cret`, `password='a;b:c'`, or in a URL's password).
/// `Debug` names each store's kind, never its connection string: that
/// holds a password.
///
/// ```
/// use pgloom::event_store::StoreConfig;
/// let config: StoreConfig = "postgres:host=db password=se;cret dbname=app".parse()?;
/// assert_eq!(config, StoreConfig::Postgres("host=db password=se;cret dbname=app".into()));
/// assert_eq!(format!("{config:?}"), "Postgres(<connection string>)");
/// # Ok::<(), pgloom::event_store::ParseStoreConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// In memory.
    Memory,
    /// A SQLite file (or `:memory:`).
    Sqlite(String),
    /// One PostgreSQL database with the loom extension.
    Postgres(String),
    /// A Citus coordinator's database, loom's tables distributed over its
    /// workers (`loom_distribute`): one logical database, so not a shard.
    Citus(String),
    /// Several stores as one; keep their order stable (it routes ids).
    Sharded(Vec<StoreConfig>),
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreConfig::Memory => f.write_str("Memory"),
            StoreConfig::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreConfig::Postgres(_) => f.write_str("Postgres(<connection string>)"),
            StoreConfig::Citus(_) => f.write_str("Citus(<connection string>)"),
            StoreConfig::Sharded(shards) => f.debug_tuple("Sharded").field(shards).finish(),
        }
    }
}

/// Whether `rest` starts with a scheme: a letter, then letters, digits,
/// `+`, `-` or `.`, then `:` (RFC 3986's).
fn starts_with_scheme(rest: &str) -> bool {
    let rest = rest.trim_start();
    let name = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .map_or(rest, |end| &rest[..end]);
    name.starts_with(|c: char| c.is_ascii_alphabetic()) && rest[name.len()..].starts_with(':')
}

/// `config` split into its stores: at each `;` that a scheme follows,
/// except inside a quoted value. Quoting is libpq's: in a key/value
/// connection string a value is quoted only when its first character is
/// `'` (a `'` inside a value, as in `application_name=bob's`, is a
/// character like any other), and `\` escapes inside the quotes. A URI
/// (`postgres:postgresql://…`) and a SQLite path have no quoting.
fn split_stores(config: &str) -> Vec<&str> {
    /// Where the scan is in a key/value connection string.
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        /// A key, or the spaces between pairs.
        Key,
        /// Just after a key's `=` (and any spaces): a `'` here opens a quote.
        ValueStart,
        /// In an unquoted value, which a space ends; `escaped` after a `\`.
        Bare { escaped: bool },
        /// In a quoted value; `escaped` after a `\`.
        Quoted { escaped: bool },
    }
    /// Whether the store starting at `store` has a key/value connection
    /// string, the only kind with quoting.
    fn key_value(store: &str) -> bool {
        match store.trim_start().split_once(':') {
            Some(("postgres" | "citus", conninfo)) => {
                let conninfo = conninfo.trim_start();
                !(conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://"))
            }
            _ => false,
        }
    }
    let mut parts = Vec::new();
    let mut start = 0;
    let mut quoting = key_value(config);
    let mut at = At::Key;
    for (i, c) in config.char_indices() {
        if c == ';'
            && !matches!(at, At::Quoted { .. } | At::Bare { escaped: true })
            && starts_with_scheme(&config[i + 1..])
        {
            parts.push(config[start..i].trim());
            start = i + 1;
            quoting = key_value(&config[start..]);
            at = At::Key;
            continue;
        }
        if !quoting {
            continue;
        }
        at = match (at, c) {
            (At::Quoted { escaped: true }, _) => At::Quoted { escaped: false },
            (At::Quoted { .. }, '\\') => At::Quoted { escaped: true },
            (At::Quoted { .. }, '\'') => At::Key,
            (At::Quoted { .. }, _) => at,
            (At::Key, '=') => At::ValueStart,
            (At::Key, _) => At::Key,
            (At::ValueStart, '\'') => At::Quoted { escaped: false },
            (At::ValueStart, c) if c.is_whitespace() => At::ValueStart,
            (At::ValueStart | At::Bare { escaped: false }, '\\') => At::Bare { escaped: true },
            (At::Bare { escaped: false }, c) if c.is_whitespace() => At::Key,
            (At::ValueStart | At::Bare { .. }, _) => At::Bare { escaped: false },
        };
    }
    parts.push(config[start..].trim());
    parts
}

/// A store configuration that does not parse. Neither its message nor its
/// `Debug` repeats the configuration: it holds connection strings, and
/// their passwords.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid loom store configuration: {reason}")]
pub struct ParseStoreConfigError {
    reason: &'static str,
}

impl FromStr for StoreConfig {
    type Err = ParseStoreConfigError;

    fn from_str(config: &str) -> Result<Self, Self::Err> {
        let error = |reason| ParseStoreConfigError { reason };
        let parts = split_stores(config);
        if parts.len() > 1 {
            let shards = parts
                .into_iter()
                .map(str::parse)
                .collect::<Result<Vec<StoreConfig>, _>>()
                .map_err(|_| error("every shard must be a store"))?;
            if shards.iter().any(|s| matches!(s, StoreConfig::Sharded(_))) {
                return Err(error("a shard cannot itself be sharded"));
            }
            if shards.iter().any(|s| matches!(s, StoreConfig::Citus(_))) {
                return Err(error(
                    "a Citus cluster is one database that shards itself: name its coordinator alone",
                ));
            }
            return Ok(StoreConfig::Sharded(shards));
        }
        match config.trim().split_once(':') {
            Some(("memory", "")) => Ok(StoreConfig::Memory),
            Some(("sqlite", path)) if !path.is_empty() => Ok(StoreConfig::Sqlite(path.to_owned())),
            Some(("postgres", conninfo)) if !conninfo.is_empty() => {
                Ok(StoreConfig::Postgres(conninfo.to_owned()))
            }
            Some(("citus", conninfo)) if !conninfo.is_empty() => {
                Ok(StoreConfig::Citus(conninfo.to_owned()))
            }
            _ => Err(error(
                "expected memory:, sqlite:<path>, postgres:<conninfo>, citus:<conninfo>, or ';'-separated shards",
            )),
        }
    }
}

/// How a configuration's Postgres pools are built; a build without
/// Postgres has nothing to set.
#[cfg(feature = "postgres")]
type PoolOptions = crate::PgPoolOptions;
#[cfg(not(feature = "postgres"))]
type PoolOptions = ();

impl StoreConfig {
    /// Opens the store this configuration names; each Postgres database
    /// gets a pool as [`super::PgEventStore::connect`] builds it (4
    /// connections, 5 s timeouts, TLS as its `sslmode` says).
    ///
    /// ```
    /// use pgloom::event_store::StoreConfig;
    /// let store = "memory:".parse::<StoreConfig>()?.open()?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When SQLite cannot open its file, a connection string does not
    /// parse or its certificate files cannot be loaded, or the build lacks
    /// the backend's feature.
    pub fn open(&self) -> Result<ConfiguredEventStore> {
        self.open_configured(&PoolOptions::default())
    }

    /// Opens the store this configuration names, each Postgres database
    /// (each shard's, in a sharded one) with its own pool built by
    /// `options`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use pgloom::event_store::StoreConfig;
    /// use pgloom::PgPoolOptions;
    /// let config: StoreConfig = "postgres:host=db.internal dbname=app sslmode=require".parse()?;
    /// let store = config.open_with(PgPoolOptions::new().max_size(8).wait_timeout(Duration::from_secs(1)))?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`StoreConfig::open`].
    #[cfg(feature = "postgres")]
    pub fn open_with(&self, options: &crate::PgPoolOptions) -> Result<ConfiguredEventStore> {
        self.open_configured(options)
    }

    fn open_configured(&self, options: &PoolOptions) -> Result<ConfiguredEventStore> {
        Ok(match self {
            StoreConfig::Sharded(shards) => ConfiguredEventStore::Sharded(ShardedEventStore::new(
                shards
                    .iter()
                    .map(|shard| shard.open_single(options))
                    .collect::<Result<_>>()?,
            )),
            single => ConfiguredEventStore::Single(single.open_single(options)?),
        })
    }

    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    fn open_single(&self, options: &PoolOptions) -> Result<SingleStore> {
        Ok(match self {
            StoreConfig::Memory => SingleStore::Memory(MemoryEventStore::new()),
            #[cfg(feature = "sqlite")]
            StoreConfig::Sqlite(path) if path == ":memory:" => {
                SingleStore::Sqlite(super::SqliteEventStore::open_in_memory()?)
            }
            #[cfg(feature = "sqlite")]
            StoreConfig::Sqlite(path) => SingleStore::Sqlite(super::SqliteEventStore::open(path)?),
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres(conninfo) => {
                SingleStore::Postgres(super::PgEventStore::connect_with(conninfo, options)?)
            }
            #[cfg(feature = "postgres")]
            StoreConfig::Citus(conninfo) => {
                SingleStore::Postgres(super::PgEventStore::connect_citus(conninfo, options)?)
            }
            // Parsing refuses shards of shards; a missing feature lands here.
            _ => return Err(crate::Error::BackendUnavailable),
        })
    }
}

/// One backend a [`StoreConfig`] names (a shard, or the whole store).
#[derive(Debug)]
#[non_exhaustive]
pub enum SingleStore {
    /// In memory.
    Memory(MemoryEventStore),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(super::SqliteEventStore),
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(super::PgEventStore),
}

/// The store a [`StoreConfig`] opened: one type whatever the backend, so
/// the code that uses it never changes.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfiguredEventStore {
    /// One backend.
    Single(SingleStore),
    /// Several, as one.
    Sharded(ShardedEventStore<SingleStore>),
}

macro_rules! dispatch {
    ($self:ident.$method:ident($($arg:expr),*)) => {
        match $self {
            SingleStore::Memory(store) => store.$method($($arg),*).await,
            #[cfg(feature = "sqlite")]
            SingleStore::Sqlite(store) => store.$method($($arg),*).await,
            #[cfg(feature = "postgres")]
            SingleStore::Postgres(store) => store.$method($($arg),*).await,
        }
    };
}

impl EventStore for SingleStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    async fn append(&self, events: &[Event]) -> Result<()> {
        dispatch!(self.append(events))
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        dispatch!(self.read_events(execution_id))
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        dispatch!(self.list_executions_page(after, limit))
    }

    async fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        dispatch!(self.read_events_after(execution_id, after, limit))
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        dispatch!(self.delete_events(execution_id, through, limit))
    }
}

impl EventStore for ConfiguredEventStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        match self {
            ConfiguredEventStore::Single(store) => store.id_scope(),
            ConfiguredEventStore::Sharded(store) => store.id_scope(),
        }
    }

    async fn append(&self, events: &[Event]) -> Result<()> {
        match self {
            ConfiguredEventStore::Single(store) => store.append(events).await,
            ConfiguredEventStore::Sharded(store) => store.append(events).await,
        }
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        match self {
            ConfiguredEventStore::Single(store) => store.read_events(execution_id).await,
            ConfiguredEventStore::Sharded(store) => store.read_events(execution_id).await,
        }
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        match self {
            ConfiguredEventStore::Single(store) => store.list_executions_page(after, limit).await,
            ConfiguredEventStore::Sharded(store) => store.list_executions_page(after, limit).await,
        }
    }

    async fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        match self {
            ConfiguredEventStore::Single(store) => {
                store.read_events_after(execution_id, after, limit).await
            }
            ConfiguredEventStore::Sharded(store) => {
                store.read_events_after(execution_id, after, limit).await
            }
        }
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        match self {
            ConfiguredEventStore::Single(store) => {
                store.delete_events(execution_id, through, limit).await
            }
            ConfiguredEventStore::Sharded(store) => {
                store.delete_events(execution_id, through, limit).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StoreConfig;

    /// Issue 25: the error quoted the whole configuration, the connection
    /// strings' passwords with it.
    #[test]
    fn a_configuration_that_does_not_parse_is_not_repeated() {
        for bad in [
            "postgre:postgres://app:hunter2@db1/app",
            "postgres:host=a password=hunter2;mysql:hunter2",
            "citus:host=a password=hunter2;citus:host=b password=hunter2",
        ] {
            let err = bad.parse::<StoreConfig>().unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    /// Issue 35: a `;` in a password split the configuration in two.
    #[test]
    fn a_semicolon_in_a_value_stays_in_its_connection_string() {
        for one in [
            "postgres:host=db password=se;cret dbname=app",
            "postgres:host=db password='a;b:c' dbname=app",
            "postgres:host=db password='it\\'s;postgres:x' dbname=app",
            "postgres:postgresql://app:pa;ss@db/app",
            "citus:host=db options='-c search_path=a;b'",
        ] {
            let config: StoreConfig = one.parse().unwrap();
            let (StoreConfig::Postgres(conninfo) | StoreConfig::Citus(conninfo)) = &config else {
                panic!("{one}: {config:?}");
            };
            assert_eq!(conninfo, one.split_once(':').unwrap().1);
            assert!(!format!("{config:?}").contains("se;cret"));
        }
        let shards: StoreConfig = "postgres:host=a password=x;y; postgres:host=b;sqlite:/tmp/c.db"
            .parse()
            .unwrap();
        assert_eq!(
            shards,
            StoreConfig::Sharded(vec![
                StoreConfig::Postgres("host=a password=x;y".into()),
                StoreConfig::Postgres("host=b".into()),
                StoreConfig::Sqlite("/tmp/c.db".into()),
            ])
        );
        // A `'` inside a value opens no quote (libpq's rule): the `;`
        // after it still starts the next store. A URI has no quoting.
        for (config, first, second) in [
            (
                "postgres:host=a application_name=bob's;postgres:host=b",
                "host=a application_name=bob's",
                "host=b",
            ),
            (
                "postgres:postgresql://a/app?application_name='x;citus:host=b",
                "postgresql://a/app?application_name='x",
                "",
            ),
            (
                "sqlite:/tmp/bob's.db;postgres:host=b",
                "/tmp/bob's.db",
                "host=b",
            ),
        ] {
            let parsed = config.parse::<StoreConfig>();
            if second.is_empty() {
                // Citus is refused as a shard: the split was made.
                assert!(parsed.is_err(), "{config}");
                continue;
            }
            let StoreConfig::Sharded(shards) = parsed.unwrap() else {
                panic!("{config}: not split");
            };
            assert_eq!(shards.len(), 2, "{config}");
            let (StoreConfig::Postgres(a) | StoreConfig::Sqlite(a)) = &shards[0] else {
                panic!("{config}: {shards:?}");
            };
            assert_eq!(
                (a.as_str(), &shards[1]),
                (first, &StoreConfig::Postgres(second.into()))
            );
        }
        // Nor does a `'` after a second `=` inside a value (review: it
        // quoted the rest, and a sharded store silently became one).
        for config in [
            "postgres:host=a application_name=k='v;postgres:host=b",
            "postgres:host=a password=p=';postgres:host=b",
        ] {
            let parsed = config.parse::<StoreConfig>().unwrap();
            assert!(
                matches!(&parsed, StoreConfig::Sharded(shards) if shards.len() == 2),
                "{config}: {parsed:?}"
            );
        }
        // A quote opened at a value's start still guards a `;` in it, and
        // one with spaces before it too.
        assert!(matches!(
            "postgres:host=a password= 'x;postgres:y' dbname=d".parse::<StoreConfig>(),
            Ok(StoreConfig::Postgres(_))
        ));
        // A mistyped scheme after a `;` is refused, not taken into a password.
        assert!("postgres:host=a;postgre:host=b"
            .parse::<StoreConfig>()
            .is_err());
    }

    #[test]
    fn debug_shows_no_connection_string() {
        let config: StoreConfig =
            "postgres:postgresql://app:hunter2@db/app;postgres:host=b password=hunter2"
                .parse()
                .unwrap();
        let shown = format!(
            "{config:?} {:?}",
            StoreConfig::Citus("password=hunter2".into())
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(
            shown,
            "Sharded([Postgres(<connection string>), Postgres(<connection string>)]) Citus(<connection string>)"
        );
    }
}

//! Where a PostgreSQL store's statement runs: a connection of the store's
//! own pool, or the caller's connection or transaction.
//!
//! By default a store prepares nothing by name, on its pool or on the
//! caller's connection: each statement goes with its parameters' types in
//! one round trip (`query_typed`: an unnamed Parse, Bind and Execute under
//! one Sync), which the explicit casts of every loom statement make exact.
//! A named statement lives on one server connection, and a
//! transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy) hands that
//! connection to another client between two transactions: the next
//! client's `s0` collides with it (42P05), or this one's is gone (26000).
//! So do the catalog reads a store makes (the extension's schema and
//! version, whether it is distributed, the frame column, the server's
//! address): nothing named is left on a connection.
//!
//! A store asked to cache statements (`cache_statements(true)`, for a
//! direct connection or a session-mode pooler) prepares each statement
//! once per pooled connection (deadpool's statement cache) and skips the
//! server's parse on every later call.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

/// A parameter and the type its statement casts it to.
pub(crate) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// A connection a store runs its statements on. One lives on the stack
/// for each operation; boxing the pooled one would add an allocation to
/// every call to save a move of 232 bytes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Conn<'a> {
    /// One of the store's pooled connections; nothing prepared by name.
    Pooled(deadpool_postgres::Object),
    /// One of the store's pooled connections, its statements prepared
    /// once and cached on it.
    Cached(deadpool_postgres::Object),
    /// The caller's connection, or the one its transaction is open on.
    Caller(&'a Client),
}

impl std::ops::Deref for Conn<'_> {
    type Target = Client;

    fn deref(&self) -> &Client {
        match self {
            Conn::Pooled(object) | Conn::Cached(object) => object,
            Conn::Caller(client) => client,
        }
    }
}

/// The parameters' values alone, as a prepared statement takes them.
fn values<'a>(params: &'a [Param<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|(value, _)| *value).collect()
}

impl Conn<'_> {
    /// One of a store's pooled connections: `cached` when the store was
    /// asked to cache statements.
    pub(crate) fn pooled(object: deadpool_postgres::Object, cached: bool) -> Conn<'static> {
        if cached {
            Conn::Cached(object)
        } else {
            Conn::Pooled(object)
        }
    }

    /// The pooled connection, `None` for the caller's.
    pub(crate) fn pooled_object(&mut self) -> Option<&mut deadpool_postgres::Object> {
        match self {
            Conn::Pooled(object) | Conn::Cached(object) => Some(object),
            Conn::Caller(_) => None,
        }
    }

    /// The rows of `sql` with `params`.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self {
            Conn::Cached(object) => {
                let statement = object.prepare_cached(sql).await?;
                object.query(&statement, &values(params)).await
            }
            Conn::Pooled(object) => object.query_typed(sql, params).await,
            Conn::Caller(client) => client.query_typed(sql, params).await,
        }
    }

    /// The one row of `sql`, `None` without one.
    pub(crate) async fn query_opt(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        match self {
            Conn::Cached(object) => {
                let statement = object.prepare_cached(sql).await?;
                object.query_opt(&statement, &values(params)).await
            }
            Conn::Pooled(object) => object.query_typed_opt(sql, params).await,
            Conn::Caller(client) => client.query_typed_opt(sql, params).await,
        }
    }

    /// The one row of `sql`; an error without exactly one.
    pub(crate) async fn query_one(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Row, tokio_postgres::Error> {
        match self {
            Conn::Cached(object) => {
                let statement = object.prepare_cached(sql).await?;
                object.query_one(&statement, &values(params)).await
            }
            Conn::Pooled(object) => object.query_typed_one(sql, params).await,
            Conn::Caller(client) => client.query_typed_one(sql, params).await,
        }
    }
}

/// A connection loom's operations can run on, the caller's: a
/// `tokio_postgres::Client` or `Transaction`, or deadpool's pooled
/// connection or transaction. Statements run on it as they would in the
/// caller's own code: inside its transaction when one is open, committed
/// or rolled back with it.
pub trait PgConnection: Sync {
    /// The client the statements are sent on.
    fn pg_client(&self) -> &Client;
}

impl PgConnection for Client {
    fn pg_client(&self) -> &Client {
        self
    }
}

impl PgConnection for tokio_postgres::Transaction<'_> {
    fn pg_client(&self) -> &Client {
        tokio_postgres::GenericClient::client(self)
    }
}

impl PgConnection for deadpool_postgres::Object {
    fn pg_client(&self) -> &Client {
        self
    }
}

impl PgConnection for deadpool_postgres::ClientWrapper {
    fn pg_client(&self) -> &Client {
        self
    }
}

impl PgConnection for deadpool_postgres::Transaction<'_> {
    fn pg_client(&self) -> &Client {
        tokio_postgres::GenericClient::client(&**self)
    }
}

//! Where pgloom meets the libraries it runs on: the one module of its
//! public API that names their types, at the versions pgloom builds with.
//!
//! Everything else in pgloom is its own: [`crate::PgPool`] rather than
//! deadpool's pool, [`crate::error::PgError`] rather than tokio-postgres'
//! error. So a release of deadpool-postgres, tokio-postgres, rusqlite or
//! tokio is not a breaking release of pgloom, except for what this module
//! (and the conversions it lists) names: an upgrade of one of them here
//! is a minor release of pgloom while it is 0.x (see the crate's
//! [versions](crate#versions)).
//!
//! What a service reaches through it:
//! - **Its own statements, in one transaction with loom's.** A store's
//!   `on(&connection)` ([`crate::event_store::PgEventStore::on`]) takes
//!   anything that is a [`PgConnection`]: a `tokio_postgres::Client` or
//!   `Transaction`, or deadpool's pooled connection or transaction.
//! - **One pool for loom and the service.** A [`crate::PgPool`] is made
//!   from a deadpool `Pool` the service built (`PgPool::from(pool)`), and
//!   lends its own (`pool.as_ref()`), from which the service takes
//!   connections for its own queries.
//! - **The driver's error.** [`postgres_error`] is the tokio-postgres
//!   error behind a [`crate::error::PgError`];
//!   [`crate::error::DriverError::get_ref`] downcasts to rusqlite's or
//!   tokio's.
//! - **`?` in the service's code.** `From` turns tokio-postgres' and
//!   deadpool's errors (and rusqlite's, tokio's `JoinError`) into
//!   [`crate::Error`].
//!
//! ```no_run
//! # async fn f() -> pgloom::Result<()> {
//! use pgloom::event_store::{Event, EventStore, PgEventStore};
//! use pgloom::PgPool;
//!
//! let pool = PgPool::connect("host=db.internal user=app dbname=app")?;
//! let events = PgEventStore::new(pool.clone());
//! // A connection of the same pool, for the service's own table.
//! let mut conn = pool.as_ref().get().await?;
//! let tx = conn.transaction().await?;
//! tx.execute("INSERT INTO orders (run) VALUES ('run-1')", &[]).await?;
//! events
//!     .on(&tx)
//!     .append(&[Event::new("run-1", 1, "paid", serde_json::json!({}))])
//!     .await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

/// The pool crate loom's PostgreSQL stores run on, at the version loom
/// builds with; `deadpool_postgres::Pool` converts into a
/// [`crate::PgPool`].
pub use deadpool_postgres;
/// The PostgreSQL driver loom runs on, at the version loom builds with.
pub use deadpool_postgres::tokio_postgres;

pub use crate::pg_executor::PgConnection;

/// The tokio-postgres error behind a [`crate::error::PgError`]: for what
/// its methods do not carry (the error's position, its `where_`, the
/// server's file and line).
///
/// ```
/// # fn f(e: &pgloom::error::PgError) {
/// let raw = pgloom::interop::postgres_error(e);
/// if let Some(db) = raw.as_db_error() {
///     eprintln!("{:?}", db.where_());
/// }
/// # }
/// ```
#[must_use]
pub fn postgres_error(e: &crate::error::PgError) -> &tokio_postgres::Error {
    &e.0
}

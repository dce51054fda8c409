//! One SQLite connection shared by a store's calls. SQLite calls block, so
//! they run on tokio's blocking pool, one at a time.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use crate::Result;

/// A SQLite connection whose schema is in place.
#[derive(Debug, Clone)]
pub(crate) struct SqliteConnection(Arc<Mutex<Connection>>);

impl SqliteConnection {
    /// Opens `path` (`None`: a private in-memory database) and runs
    /// `schema` (idempotent `CREATE ... IF NOT EXISTS`).
    pub(crate) fn open(path: Option<&Path>, schema: &str) -> Result<Self> {
        let connection = match path {
            Some(path) => Connection::open(path)?,
            None => Connection::open_in_memory()?,
        };
        connection.execute_batch(schema)?;
        Ok(SqliteConnection(Arc::new(Mutex::new(connection))))
    }

    /// Opens `path` read-only, as it is: no schema, no writes.
    pub(crate) fn open_read_only(path: &Path) -> Result<Self> {
        let connection =
            Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        Ok(SqliteConnection(Arc::new(Mutex::new(connection))))
    }

    /// Runs `work` on the connection, off the async threads.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let connection = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            work(&mut connection.lock().expect("a SQLite call never panics"))
        })
        .await?
    }

    /// [`run`](Self::run) for work that fails only with SQLite's errors.
    pub(crate) async fn run_sql<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        self.run(move |connection| work(connection).map_err(Into::into))
            .await
    }
}

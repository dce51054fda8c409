//! One SQLite connection shared by a store's calls. SQLite calls block, so
//! they run on tokio's blocking pool, one at a time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use crate::Result;

/// A SQLite connection whose schema is in place.
#[derive(Debug, Clone)]
pub(crate) struct SqliteConnection {
    connection: Arc<Mutex<Connection>>,
    /// The file, as it resolved when opened (`None`: in memory): whether two
    /// stores share one database, and so one transaction.
    file: Option<PathBuf>,
}

impl SqliteConnection {
    /// Opens `path` (`None`: a private in-memory database) and runs
    /// `schema` (idempotent `CREATE ... IF NOT EXISTS`).
    pub(crate) fn open(path: Option<&Path>, schema: &str) -> Result<Self> {
        Ok(Self::open_upgraded(path, schema, |_| Ok(()))?.0)
    }

    /// [`SqliteConnection::open`], then `upgrade` (what a file written by
    /// an older pgloom lacks, added in place if it can be), and what
    /// it says.
    pub(crate) fn open_upgraded<T>(
        path: Option<&Path>,
        schema: &str,
        upgrade: fn(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<(Self, T)> {
        let mut connection = match path {
            Some(path) => Connection::open(path)?,
            None => Connection::open_in_memory()?,
        };
        connection.execute_batch(schema)?;
        let upgraded = upgrade(&mut connection)?;
        Ok((SqliteConnection::new(connection, path), upgraded))
    }

    /// Opens `path` read-only, as it is: no schema, no writes.
    pub(crate) fn open_read_only(path: &Path) -> Result<Self> {
        let connection =
            Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        Ok(SqliteConnection::new(connection, Some(path)))
    }

    fn new(connection: Connection, path: Option<&Path>) -> Self {
        SqliteConnection {
            connection: Arc::new(Mutex::new(connection)),
            file: path.map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())),
        }
    }

    /// The database file, `None` for a private in-memory database.
    pub(crate) fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Runs `work` on the connection, off the async threads.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let connection = Arc::clone(&self.connection);
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

//! A branch registry in SQLite: BINARY collation, so names page in code
//! point order with no conversion.

use std::path::Path;

use rusqlite::{params, OptionalExtension};

use super::{BranchRef, BranchRegistry};
use crate::event_store::{check_limit, Page};
use crate::sqlite_connection::SqliteConnection;
use crate::Result;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS loom_refs (
    name TEXT NOT NULL PRIMARY KEY,
    execution_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) WITHOUT ROWID;
";

/// A [`BranchRegistry`] in a SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteBranchRegistry {
    connection: SqliteConnection,
}

impl SqliteBranchRegistry {
    /// Opens (creating if needed) the database at `path`.
    ///
    /// # Errors
    ///
    /// When SQLite cannot open it or create the table.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(SqliteBranchRegistry {
            connection: SqliteConnection::open(Some(path.as_ref()), SCHEMA)?,
        })
    }

    /// A private in-memory database.
    ///
    /// # Errors
    ///
    /// When SQLite cannot create the table.
    pub fn open_in_memory() -> Result<Self> {
        Ok(SqliteBranchRegistry {
            connection: SqliteConnection::open(None, SCHEMA)?,
        })
    }
}

impl BranchRegistry for SqliteBranchRegistry {
    async fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
        let (name, execution_id) = (name.to_owned(), execution_id.to_owned());
        self.connection
            .run_sql(move |c| {
                c.prepare_cached(
                    "INSERT INTO loom_refs (name, execution_id, sequence) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET execution_id = excluded.execution_id,
                     sequence = excluded.sequence, updated_at = excluded.updated_at",
                )?
                .execute(params![name, execution_id, sequence])
                .map(drop)
            })
            .await
    }

    async fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
        let name = name.to_owned();
        self.connection
            .run_sql(move |c| {
                c.prepare_cached("SELECT execution_id, sequence FROM loom_refs WHERE name = ?1")?
                    .query_row(params![name], |row| {
                        Ok(BranchRef {
                            name: name.clone(),
                            execution_id: row.get(0)?,
                            sequence: row.get(1)?,
                        })
                    })
                    .optional()
            })
            .await
    }

    async fn delete_ref(&self, name: &str) -> Result<bool> {
        let name = name.to_owned();
        self.connection
            .run_sql(move |c| {
                Ok(c.prepare_cached("DELETE FROM loom_refs WHERE name = ?1")?
                    .execute(params![name])?
                    > 0)
            })
            .await
    }

    async fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
        let (name, onto) = (name.to_owned(), onto.to_owned());
        self.connection
            .run_sql(move |c| {
                let tx = c.transaction()?;
                let target: Option<(String, i64)> = tx
                    .query_row(
                        "SELECT execution_id, sequence FROM loom_refs WHERE name = ?1",
                        params![name],
                        |row| Ok((row.get(0)?, row.get(1)?)),
                    )
                    .optional()?;
                let Some((execution_id, sequence)) = target else {
                    return Ok(false);
                };
                tx.execute("DELETE FROM loom_refs WHERE name = ?1", params![name])?;
                tx.execute(
                    "INSERT INTO loom_refs (name, execution_id, sequence) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET execution_id = excluded.execution_id,
                     sequence = excluded.sequence, updated_at = excluded.updated_at",
                    params![onto, execution_id, sequence],
                )?;
                tx.commit()?;
                Ok(true)
            })
            .await
    }

    async fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        let after = after.map(str::to_owned);
        let sql_limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let names = self
            .connection
            .run_sql(move |c| {
                c.prepare_cached(
                    "SELECT name FROM loom_refs WHERE ?1 IS NULL OR name > ?1 ORDER BY name LIMIT ?2",
                )?
                .query_map(params![after, sql_limit], |row| row.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()
            })
            .await?;
        Ok(Page::from_ids(names, limit))
    }
}

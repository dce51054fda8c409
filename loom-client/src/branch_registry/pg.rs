//! A branch registry over loom's PostgreSQL extension (`loom.refs`, whose
//! `name` is `COLLATE "C"`; `loom_list_refs` states the collation itself).

use deadpool_postgres::Pool;

use super::{BranchRef, BranchRegistry};
use crate::event_store::{check_limit, Page};
use crate::pg_row::column;
use crate::Result;

/// A [`BranchRegistry`] in a PostgreSQL database with `CREATE EXTENSION loom`.
#[derive(Clone)]
pub struct PgBranchRegistry {
    pool: Pool,
}

impl std::fmt::Debug for PgBranchRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBranchRegistry")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl PgBranchRegistry {
    /// A registry over `pool` (share it with the event store of the same
    /// database: [`crate::event_store::PgEventStore::pool`]).
    #[must_use]
    pub fn new(pool: Pool) -> Self {
        PgBranchRegistry { pool }
    }
}

impl BranchRegistry for PgBranchRegistry {
    async fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
        let client = self.pool.get().await?;
        let put = client
            .prepare_cached("SELECT loom_put_ref($1, $2, $3)")
            .await?;
        client
            .execute(&put, &[&name, &execution_id, &sequence])
            .await?;
        Ok(())
    }

    async fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
        let client = self.pool.get().await?;
        let get = client
            .prepare_cached("SELECT execution_id, sequence FROM loom.refs WHERE name = $1")
            .await?;
        client
            .query_opt(&get, &[&name])
            .await?
            .map(|row| {
                Ok(BranchRef {
                    name: name.to_owned(),
                    execution_id: column(&row, 0)?,
                    sequence: column(&row, 1)?,
                })
            })
            .transpose()
    }

    async fn delete_ref(&self, name: &str) -> Result<bool> {
        let client = self.pool.get().await?;
        let delete = client.prepare_cached("SELECT loom_delete_ref($1)").await?;
        column(&client.query_one(&delete, &[&name]).await?, 0)
    }

    async fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let target = tx
            .query_opt(
                "DELETE FROM loom.refs WHERE name = $1 RETURNING execution_id, sequence",
                &[&name],
            )
            .await?;
        let Some(row) = target else {
            return Ok(false);
        };
        let (execution_id, sequence): (String, i64) = (column(&row, 0)?, column(&row, 1)?);
        tx.execute(
            "SELECT loom_put_ref($1, $2, $3)",
            &[&onto, &execution_id, &sequence],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        let page_size = crate::event_store::sql_limit(limit);
        let client = self.pool.get().await?;
        let list = client
            .prepare_cached("SELECT * FROM loom_list_refs($1, $2)")
            .await?;
        let rows = client.query(&list, &[&after, &page_size]).await?;
        Ok(Page::from_ids(
            rows.iter().map(|r| column(r, 0)).collect::<Result<_>>()?,
            limit,
        ))
    }
}

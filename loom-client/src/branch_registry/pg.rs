//! A branch registry over loom's PostgreSQL extension (`loom.refs`, whose
//! `name` is `COLLATE "C"`; `loom_list_refs` states the collation itself).
//! Every statement names loom's schema (read from the catalog) and
//! `pg_catalog` outright (`crate::pg_schema`): the session's
//! `search_path` resolves nothing.

use deadpool_postgres::Pool;

use super::{BranchRef, BranchRegistry};
use crate::event_store::{check_limit, Page};
use crate::pg_row::column;
use crate::pg_schema::SchemaCell;
use crate::Result;

const PUT: &str = "SELECT @extschema@.loom_put_ref($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.int8)";
const GET: &str = "SELECT execution_id, sequence FROM loom.refs
     WHERE name OPERATOR(pg_catalog.=) $1::pg_catalog.text";
const DELETE: &str = "SELECT @extschema@.loom_delete_ref($1::pg_catalog.text)";
/// A promotion's first half: the ref moved away, in the transaction that
/// puts it under its new name.
const TAKE: &str = "DELETE FROM loom.refs WHERE name OPERATOR(pg_catalog.=) $1::pg_catalog.text
     RETURNING execution_id, sequence";
const LIST: &str =
    "SELECT * FROM @extschema@.loom_list_refs($1::pg_catalog.text, $2::pg_catalog.int4)";

/// A [`BranchRegistry`] in a PostgreSQL database with `CREATE EXTENSION loom`,
/// in whichever schema (read from the catalog at the first call).
#[derive(Clone)]
pub struct PgBranchRegistry {
    pool: Pool,
    /// Where loom's functions are, read at the first call of one.
    schema: SchemaCell,
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
        PgBranchRegistry {
            pool,
            schema: SchemaCell::new(),
        }
    }
}

impl BranchRegistry for PgBranchRegistry {
    async fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
        let client = self.pool.get().await?;
        let put = client
            .prepare_cached(&self.schema.sql(&client, PUT).await?)
            .await?;
        client
            .execute(&put, &[&name, &execution_id, &sequence])
            .await?;
        Ok(())
    }

    async fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
        let client = self.pool.get().await?;
        let get = client.prepare_cached(GET).await?;
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
        let delete = client
            .prepare_cached(&self.schema.sql(&client, DELETE).await?)
            .await?;
        column(&client.query_one(&delete, &[&name]).await?, 0)
    }

    async fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
        let mut client = self.pool.get().await?;
        let put = self.schema.sql(&client, PUT).await?;
        let tx = client.transaction().await?;
        let target = tx.query_opt(TAKE, &[&name]).await?;
        let Some(row) = target else {
            return Ok(false);
        };
        let (execution_id, sequence): (String, i64) = (column(&row, 0)?, column(&row, 1)?);
        tx.execute(&put, &[&onto, &execution_id, &sequence]).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        let page_size = crate::event_store::sql_limit(limit);
        let client = self.pool.get().await?;
        let list = client
            .prepare_cached(&self.schema.sql(&client, LIST).await?)
            .await?;
        let rows = client.query(&list, &[&after, &page_size]).await?;
        Ok(Page::from_ids(
            rows.iter().map(|r| column(r, 0)).collect::<Result<_>>()?,
            limit,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_schema::assert_resolves_nothing;

    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        for sql in [PUT, GET, DELETE, TAKE, LIST] {
            assert_resolves_nothing(sql);
        }
    }
}

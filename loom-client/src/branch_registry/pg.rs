//! A branch registry over loom's PostgreSQL extension (`loom.refs`, whose
//! `name` is `COLLATE "C"`; `loom_list_refs` states the collation itself).
//! Every statement names loom's schema (read from the catalog) and
//! `pg_catalog` outright (`crate::pg_schema`): the session's
//! `search_path` resolves nothing.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::{BranchRef, BranchRegistry};
use crate::event_store::{check_limit, Page};
use crate::pg_executor::{Conn, PgConnection};
use crate::pg_row::column;
use crate::pg_schema::SchemaCell;
use crate::{PgPool, Result};

const PUT: &str = "SELECT @extschema@.loom_put_ref($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.int8)";
const GET: &str = "SELECT execution_id, sequence FROM loom.refs
     WHERE name OPERATOR(pg_catalog.=) $1::pg_catalog.text";
const DELETE: &str = "SELECT @extschema@.loom_delete_ref($1::pg_catalog.text)";
/// A promotion, in one statement (atomic on any connection, in a
/// transaction or not): the ref taken from its name, then put under the
/// new one; the count of refs moved, 0 or 1.
const PROMOTE: &str = "WITH taken AS (
         DELETE FROM loom.refs WHERE name OPERATOR(pg_catalog.=) $1::pg_catalog.text
         RETURNING execution_id, sequence)
     SELECT pg_catalog.count(1) FROM (
         SELECT @extschema@.loom_put_ref($2::pg_catalog.text, t.execution_id::pg_catalog.text, t.sequence::pg_catalog.int8)
         FROM taken t) moved";
const LIST: &str =
    "SELECT * FROM @extschema@.loom_list_refs($1::pg_catalog.text, $2::pg_catalog.int4)";

/// A [`BranchRegistry`] in a PostgreSQL database with `CREATE EXTENSION loom`,
/// in whichever schema (read from the catalog at the first call).
#[derive(Clone)]
pub struct PgBranchRegistry {
    pool: PgPool,
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
    pub fn new(pool: PgPool) -> Self {
        PgBranchRegistry {
            pool,
            schema: SchemaCell::new(),
        }
    }
}

impl PgBranchRegistry {
    /// A pooled connection, as the operations take it.
    async fn pooled(&self) -> Result<Conn<'static>> {
        self.pool.conn().await
    }

    /// This registry's operations on the caller's connection or
    /// transaction (a [`crate::interop::PgConnection`]: a
    /// `tokio_postgres::Client` or `Transaction`, or deadpool's pooled
    /// connection or transaction) instead of its pool:
    /// a ref moved in the same transaction as the events it points at. The
    /// view is a [`BranchRegistry`].
    ///
    /// ```no_run
    /// # async fn f(refs: &pgloom::branch_registry::PgBranchRegistry, pool: &pgloom::PgPool) -> pgloom::Result<()> {
    /// use pgloom::branch_registry::BranchRegistry;
    /// let mut conn = pool.as_ref().get().await?;
    /// let tx = conn.transaction().await?;
    /// refs.on(&tx).put_ref("main", "run-1", 12).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn on<'a>(&'a self, connection: &'a impl PgConnection) -> PgBranchRegistryOn<'a> {
        PgBranchRegistryOn {
            registry: self,
            client: connection.pg_client(),
        }
    }

    async fn put_ref_on(
        &self,
        client: Conn<'_>,
        name: &str,
        execution_id: &str,
        sequence: i64,
    ) -> Result<()> {
        client
            .query(
                &self.schema.sql(&client, PUT).await?,
                &[
                    (&name, Type::TEXT),
                    (&execution_id, Type::TEXT),
                    (&sequence, Type::INT8),
                ],
            )
            .await?;
        Ok(())
    }

    async fn get_ref_on(&self, client: Conn<'_>, name: &str) -> Result<Option<BranchRef>> {
        client
            .query_opt(GET, &[(&name, Type::TEXT)])
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

    async fn delete_ref_on(&self, client: Conn<'_>, name: &str) -> Result<bool> {
        column(
            &client
                .query_one(
                    &self.schema.sql(&client, DELETE).await?,
                    &[(&name, Type::TEXT)],
                )
                .await?,
            0,
        )
    }

    async fn promote_ref_on(&self, client: Conn<'_>, name: &str, onto: &str) -> Result<bool> {
        let moved: i64 = column(
            &client
                .query_one(
                    &self.schema.sql(&client, PROMOTE).await?,
                    &[(&name, Type::TEXT), (&onto, Type::TEXT)],
                )
                .await?,
            0,
        )?;
        Ok(moved > 0)
    }

    async fn list_refs_on(
        &self,
        client: Conn<'_>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page> {
        check_limit(limit)?;
        let page_size = crate::event_store::sql_limit(limit);
        let rows = client
            .query(
                &self.schema.sql(&client, LIST).await?,
                &[(&after, Type::TEXT), (&page_size, Type::INT4)],
            )
            .await?;
        Ok(Page::from_ids(
            rows.iter().map(|r| column(r, 0)).collect::<Result<_>>()?,
            limit,
        ))
    }
}

impl BranchRegistry for PgBranchRegistry {
    async fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
        self.put_ref_on(self.pooled().await?, name, execution_id, sequence)
            .await
    }

    async fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
        self.get_ref_on(self.pooled().await?, name).await
    }

    async fn delete_ref(&self, name: &str) -> Result<bool> {
        self.delete_ref_on(self.pooled().await?, name).await
    }

    async fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
        self.promote_ref_on(self.pooled().await?, name, onto).await
    }

    async fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        self.list_refs_on(self.pooled().await?, after, limit).await
    }
}

/// A [`PgBranchRegistry`]'s operations on the caller's connection or
/// transaction ([`PgBranchRegistry::on`]).
#[derive(Clone, Copy)]
pub struct PgBranchRegistryOn<'a> {
    registry: &'a PgBranchRegistry,
    client: &'a Client,
}

impl std::fmt::Debug for PgBranchRegistryOn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBranchRegistryOn").finish_non_exhaustive()
    }
}

impl BranchRegistry for PgBranchRegistryOn<'_> {
    async fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
        let client = Conn::Caller(self.client);
        self.registry
            .put_ref_on(client, name, execution_id, sequence)
            .await
    }

    async fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
        self.registry
            .get_ref_on(Conn::Caller(self.client), name)
            .await
    }

    async fn delete_ref(&self, name: &str) -> Result<bool> {
        self.registry
            .delete_ref_on(Conn::Caller(self.client), name)
            .await
    }

    async fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
        self.registry
            .promote_ref_on(Conn::Caller(self.client), name, onto)
            .await
    }

    async fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        self.registry
            .list_refs_on(Conn::Caller(self.client), after, limit)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_schema::assert_resolves_nothing;

    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        for sql in [PUT, GET, DELETE, PROMOTE, LIST] {
            assert_resolves_nothing(sql);
        }
    }
}

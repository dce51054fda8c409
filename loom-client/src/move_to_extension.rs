//! Moving a database from loom's SQL-only flavour to the extension
//! (docs/flavours.md#moving-a-database-to-the-extension): when its server
//! starts shipping `loom.so`, or the database leaves a managed service.
//!
//! The SQL-only flavour's objects are the database owner's; the extension
//! is created by a superuser, who must run none of that owner's code. So
//! nothing of the old install is adopted into the extension or called,
//! and nothing of it is planned or read with the superuser's rights: in
//! one transaction, holding every old table whole,
//!
//! 1. schema `loom` is renamed `loom_before_extension` (the old tables, with
//!    every row, stay there until the owner drops them), and the owner's
//!    loom routines in the functions' schema are moved into it (nothing is
//!    dropped: what depends on them keeps them);
//! 2. `CREATE EXTENSION loom` at the same version, in the same schema;
//! 3. every row is copied into the extension's tables, column by column,
//!    after the catalog has confirmed each old column has the extension's
//!    type (so no cast runs); the executions index is rebuilt by the
//!    extension's own trigger;
//! 4. each role that could write or read the old log is granted the same
//!    with `loom_grant_access`.
//!
//! Either all of it commits or nothing changed.
//!
//! The superuser never plans a statement that names an old table:
//! planning one evaluates what its owner attached to it (index
//! expressions, statistics, policies, the functions behind them). Each
//! read runs instead with the owner's rights, in PostgreSQL's
//! security-restricted sandbox (`OwnerRead`, below); docs/flavours.md says what
//! that sandbox refuses, and how the tests plant each attack.

use tokio_postgres::types::Type;
use tokio_postgres::{IsolationLevel, Transaction};

use crate::pg_row::column;
use crate::{Error, Result};

/// What a move did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Move {
    /// The version moved, the SQL-only flavour's and now the extension's.
    pub version: String,
    /// The schema of loom's functions, as before.
    pub schema: String,
    /// Rows copied, per table (`events`, `snapshots`, `refs`, `lineage`,
    /// and from 0.16.0 `claims`, `feed_state`, `feed_high_water`,
    /// `feed_consumers`).
    pub rows: Vec<(String, u64)>,
    /// Roles granted again, as `(role, "writer" | "reader")`.
    pub grants: Vec<(String, String)>,
    /// Where the old tables are, for their owner to drop once checked.
    pub kept_in: String,
}

/// Where the old tables go.
const KEPT_IN: &str = "loom_before_extension";

/// The tables moved, in the order they are copied.
const TABLES: [&str; 4] = ["events", "snapshots", "refs", "lineage"];

/// The tables 0.16.0 added (claims, the change feed's settings and
/// consumers), moved after [`TABLES`] from an install at that version or
/// later, with the two sequences whose values must only grow: a fencing
/// token issued again would let a stale worker write.
const TABLES_SINCE_0_16: [&str; 4] = ["claims", "feed_state", "feed_high_water", "feed_consumers"];
/// Each sequence, with what the moved rows took from it where that
/// matters: a token goes on above every moved one (a sequence restarted
/// by hand, or never called, reads as no value), an order within a
/// transaction above the old sequence's value only (a new transaction's
/// positions sort after every old one whatever their order).
const SEQUENCES_SINCE_0_16: [(&str, Option<&str>); 2] = [
    (
        "claims_fence_seq",
        Some("SELECT pg_catalog.max(c.fence) FROM loom.claims c"),
    ),
    ("feed_ord_seq", None),
];

/// An old sequence's last value, read from the catalog and the sequence
/// itself (no view, no code of the owner's), and `NULL` when no value
/// was ever taken.
const SEQUENCE_VALUE: &str = "SELECT pg_catalog.pg_sequence_last_value(c.oid)
     FROM pg_catalog.pg_class c
     WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('loom_before_extension.' OPERATOR(pg_catalog.||) $1::pg_catalog.text)
       AND c.relkind OPERATOR(pg_catalog.=) 'S'";

/// The SQL-only install in schema `$1` (`loom` before the move,
/// `loom_before_extension` once renamed and locked), from the catalog
/// alone: its owner must own the database, the schema and each of the six
/// tables, which must be plain tables (a view's functions would run as
/// the superuser reading it), and `sql_only`'s columns must be text and
/// name. The owner, by OID and name.
const FIND: &str = "SELECT n.nspowner, pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text
     FROM pg_catalog.pg_namespace n
     WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.text
       AND n.nspowner OPERATOR(pg_catalog.=) (SELECT d.datdba FROM pg_catalog.pg_database d
                                              WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
       AND (SELECT pg_catalog.count(c.oid) FROM pg_catalog.pg_class c
            WHERE c.relnamespace OPERATOR(pg_catalog.=) n.oid
              AND c.relname OPERATOR(pg_catalog.=) ANY ('{events,executions,snapshots,refs,lineage,sql_only}'::pg_catalog.name[])
              AND c.relkind OPERATOR(pg_catalog.=) 'r' AND c.relowner OPERATOR(pg_catalog.=) n.nspowner)
           OPERATOR(pg_catalog.=) 6
       AND (SELECT pg_catalog.array_agg(a.atttypid ORDER BY a.attnum)
            FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid
            WHERE c.relnamespace OPERATOR(pg_catalog.=) n.oid AND c.relname OPERATOR(pg_catalog.=) 'sql_only'
              AND a.attname OPERATOR(pg_catalog.=) ANY ('{version,function_schema}'::pg_catalog.name[])
              AND NOT a.attisdropped)
           OPERATOR(pg_catalog.=) ARRAY['pg_catalog.text'::pg_catalog.regtype::pg_catalog.oid,
                                        'pg_catalog.name'::pg_catalog.regtype::pg_catalog.oid]";

/// Whether schema `$1` holds the owner's (`$2`) loom routines, as the
/// functions' schema of its SQL-only install must: `loom_append_event`
/// at least. Never loom's tables' schema, nor a system one.
const FUNCTIONS_THERE: &str = "SELECT EXISTS (SELECT FROM pg_catalog.pg_proc p
         JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
         WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.text
           AND p.proname OPERATOR(pg_catalog.=) 'loom_append_event'
           AND p.proowner OPERATOR(pg_catalog.=) $2::pg_catalog.oid)
       AND $1::pg_catalog.text OPERATOR(pg_catalog.<>) ALL ('{loom,loom_before_extension,information_schema}'::pg_catalog.text[])
       AND $1::pg_catalog.text OPERATOR(pg_catalog.!~~) 'pg\\_%'";

/// Each column of `loom_before_extension.$1` whose type is not that of the
/// extension's column of the same name (or which the extension's table
/// lacks), or which is generated (18's virtual columns are computed as
/// they are read; the extension's tables have none): what would need a
/// cast, or run an expression of the owner's.
const FOREIGN_COLUMNS: &str = "SELECT o.attname::pg_catalog.text
     FROM pg_catalog.pg_attribute o
     LEFT JOIN pg_catalog.pg_attribute x
       ON x.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('loom.' OPERATOR(pg_catalog.||) $1)
      AND x.attname OPERATOR(pg_catalog.=) o.attname AND NOT x.attisdropped
     WHERE o.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('loom_before_extension.' OPERATOR(pg_catalog.||) $1)
       AND o.attnum OPERATOR(pg_catalog.>) 0 AND NOT o.attisdropped
       AND (x.atttypid IS NULL OR x.atttypid OPERATOR(pg_catalog.<>) o.atttypid
            OR x.attcollation OPERATOR(pg_catalog.<>) o.attcollation
            OR o.attgenerated OPERATOR(pg_catalog.<>) '')";

/// The old table's columns, quoted, in order; how many; then the same
/// qualified by alias `o`.
const COLUMNS: &str = "SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY a.attnum),
            pg_catalog.count(a.attnum),
            pg_catalog.string_agg('o.' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(a.attname), ', ' ORDER BY a.attnum)
     FROM pg_catalog.pg_attribute a
     WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('loom_before_extension.' OPERATOR(pg_catalog.||) $1)
       AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped";

/// The owner's routines in the functions' schema named as loom's, each
/// as its `regprocedure` (schema-qualified: only pg_catalog is searched).
/// The schema by its name as stored: a cast of it to `regnamespace` would
/// read it as an identifier, and miss `"S3Fns"`.
const OWNERS_ROUTINES: &str = "SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text
     FROM pg_catalog.pg_proc p
     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
     WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.text
       AND p.proowner OPERATOR(pg_catalog.=) $2::pg_catalog.oid
       AND p.proname OPERATOR(pg_catalog.=) ANY ($3::pg_catalog.text[]::pg_catalog.name[])";

/// Roles other than the owner with privileges on the old log: `writer`
/// where they could insert into it (the whole table, or its columns, as
/// 0.16.0 grants), else `reader`.
const OLD_GRANTEES: &str = "SELECT pg_catalog.quote_ident(r.rolname),
            CASE WHEN pg_catalog.bool_or(a.privilege_type OPERATOR(pg_catalog.=) 'INSERT')
                      OR EXISTS (SELECT FROM pg_catalog.pg_attribute t, pg_catalog.aclexplode(t.attacl) x
                                 WHERE t.attrelid OPERATOR(pg_catalog.=) 'loom_before_extension.events'::pg_catalog.regclass
                                   AND x.grantee OPERATOR(pg_catalog.=) r.oid
                                   AND x.privilege_type OPERATOR(pg_catalog.=) 'INSERT')
                 THEN 'writer' ELSE 'reader' END
     FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
     JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
     WHERE c.oid OPERATOR(pg_catalog.=) 'loom_before_extension.events'::pg_catalog.regclass
       AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
     GROUP BY r.oid, r.rolname ORDER BY r.rolname";

/// A read of one old table, run with its owner's rights in PostgreSQL's
/// security-restricted sandbox: a materialized view owned by the owner,
/// filled by `REFRESH MATERIALIZED VIEW` (which PostgreSQL runs as the
/// view's owner, as `VACUUM` runs a table owner's code: no change of role,
/// nothing queued to run later as the session's user, every setting undone
/// when it ends).
///
/// The view is created `WITH NO DATA` (parsed, never planned or run, as
/// the superuser), exists only in the move's uncommitted transaction and is
/// dropped before it commits. After the refresh, and before the superuser
/// reads it, the catalog must show nothing attached to it (no index,
/// statistics object, trigger, policy or rule beyond its own; the same
/// owner and columns): the superuser's read then plans only a scan of plain
/// rows of the extension's own column types. The class is closed where the
/// rights are, not object kind by object kind, so a kind a later
/// PostgreSQL adds is closed too.
struct OwnerRead {
    /// `loom_before_extension.loom_move_read_<table>`.
    view: String,
}

/// Whether the view `$1` is as the move made it: a materialized view
/// owned by `$2`, with `$3` columns, none generated or with a default, and
/// nothing attached (no index, statistics object, trigger, policy, or rule
/// but its own).
const VIEW_AS_MADE: &str = "SELECT c.relkind OPERATOR(pg_catalog.=) 'm' AND c.relowner OPERATOR(pg_catalog.=) $2::pg_catalog.oid
            AND NOT c.relhasindex AND NOT c.relhastriggers AND NOT c.relrowsecurity
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid)
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_statistic_ext x WHERE x.stxrelid OPERATOR(pg_catalog.=) c.oid)
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid)
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_policy p WHERE p.polrelid OPERATOR(pg_catalog.=) c.oid)
            AND (SELECT pg_catalog.count(r.oid) FROM pg_catalog.pg_rewrite r WHERE r.ev_class OPERATOR(pg_catalog.=) c.oid)
                OPERATOR(pg_catalog.=) 1
            AND (SELECT pg_catalog.count(a.attnum) FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
                   AND a.attgenerated OPERATOR(pg_catalog.=) '' AND NOT a.atthasdef)
                OPERATOR(pg_catalog.=) $3::pg_catalog.int8
            AND (SELECT pg_catalog.count(a.attnum) FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0)
                OPERATOR(pg_catalog.=) $3::pg_catalog.int8
     FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::pg_catalog.text)";

impl OwnerRead {
    /// Creates the view of `select` (`columns` of them) `WITH NO DATA`
    /// (parsed, not planned), hands it to `owner` (its OID, and its name
    /// quoted), refreshes it (the owner's sandbox), and checks the
    /// catalog: nothing attached to it meanwhile.
    async fn fill(
        tx: &Transaction<'_>,
        table: &str,
        (owner, owner_name): (u32, &str),
        columns: i64,
        select: &str,
    ) -> Result<Self> {
        let view = format!("{KEPT_IN}.loom_move_read_{table}");
        tx.batch_execute(&format!(
            "CREATE MATERIALIZED VIEW {view} AS {select} WITH NO DATA;
             ALTER MATERIALIZED VIEW {view} OWNER TO {owner_name};
             REFRESH MATERIALIZED VIEW {view}"
        ))
        .await?;
        let as_made: Option<bool> = tx
            .query_opt(VIEW_AS_MADE, &[&view, &owner, &columns])
            .await?
            .map(|row| column(&row, 0))
            .transpose()?;
        if as_made != Some(true) {
            return Err(Error::NotSqlOnly);
        }
        Ok(Self { view })
    }

    /// `FROM` the view, for the superuser's statement.
    fn from(&self) -> String {
        format!("FROM {} o", self.view)
    }

    /// Drops the view: nothing of the move is left for anyone.
    async fn drop(self, tx: &Transaction<'_>) -> Result<()> {
        tx.batch_execute(&format!("DROP MATERIALIZED VIEW {}", self.view))
            .await?;
        Ok(())
    }
}

/// Moves the database `config` names from loom's SQL-only flavour to the
/// extension, as a superuser (docs/flavours.md), waiting at most
/// `lock_timeout` for each lock (a long transaction on loom's tables
/// fails the move rather than stall every writer behind it). The
/// extension must be available on the server at the SQL-only flavour's
/// version.
///
/// ```no_run
/// # async fn run() -> pgloom::Result<()> {
/// let moved = pgloom::move_to_extension::move_to_extension(
///     "host=db user=postgres dbname=app",
///     std::time::Duration::from_secs(10),
/// )
/// .await?;
/// println!("old tables kept in schema {}", moved.kept_in);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::InvalidLockTimeout`] for 0; [`Error::NotSqlOnly`] when the
/// database has no SQL-only flavour owned by its owner (or the extension
/// already), or its record names a version that was never a SQL-only
/// release or a functions' schema without its functions;
/// [`Error::ForeignColumns`]; what the server raises (not a superuser,
/// the extension not available at that version, a lock not had in time):
/// nothing changed then.
pub async fn move_to_extension(config: &str, lock_timeout: std::time::Duration) -> Result<Move> {
    if lock_timeout.is_zero() {
        return Err(Error::InvalidLockTimeout(lock_timeout));
    }
    let lock_timeout_ms = crate::pg_connect::whole_millis(lock_timeout);
    let (mut client, connection) = crate::pg_connect::connect(config).await?;
    let driver = tokio::spawn(connection);
    // READ COMMITTED whatever the database's default: the extension's
    // trigger keeps the executions index only there.
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    let moved = move_in(&tx, lock_timeout_ms).await?;
    tx.commit().await?;
    drop(client);
    let _ = driver.await;
    Ok(moved)
}

async fn move_in(tx: &Transaction<'_>, lock_timeout_ms: u128) -> Result<Move> {
    // Only pg_catalog is searched: every name below is qualified, and the
    // routines' regprocedure text, printed and parsed again in this
    // session, names every schema but pg_catalog's.
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = 0; SET LOCAL search_path = pg_catalog, pg_temp;
         SET LOCAL row_security = off; SET LOCAL lock_timeout = {lock_timeout_ms}"
    ))
    .await?;
    if tx
        .query_typed_opt(FIND, &[(&"loom", Type::TEXT)])
        .await?
        .is_none()
    {
        return Err(Error::NotSqlOnly);
    }
    // What the owner could change while this waits for its locks, it
    // cannot once they are held: the schema is renamed first (the
    // uncommitted rename holds its catalog row against another rename, so
    // no other schema can take its place), then its six tables are locked
    // whole by the new name, and only then is everything checked and read.
    tx.execute(&format!("ALTER SCHEMA loom RENAME TO {KEPT_IN}"), &[])
        .await?;
    tx.batch_execute(&format!(
        "LOCK TABLE {KEPT_IN}.events, {KEPT_IN}.executions, {KEPT_IN}.snapshots,
                    {KEPT_IN}.refs, {KEPT_IN}.lineage, {KEPT_IN}.sql_only
         IN ACCESS EXCLUSIVE MODE"
    ))
    .await?;
    let Some(found) = tx.query_typed_opt(FIND, &[(&KEPT_IN, Type::TEXT)]).await? else {
        return Err(Error::NotSqlOnly);
    };
    let owner: u32 = column(&found, 0)?;
    let owner_name: String = column(&found, 1)?;
    let quoted_owner: String = column(
        &tx.query_one("SELECT pg_catalog.quote_ident($1)", &[&owner_name])
            .await?,
        0,
    )?;
    // A plain table of text and name columns, locked: read as its owner.
    let read = OwnerRead::fill(
        tx,
        "sql_only",
        (owner, &quoted_owner),
        2,
        &format!("SELECT o.version, o.function_schema::pg_catalog.text AS function_schema FROM ONLY {KEPT_IN}.sql_only o"),
    )
    .await?;
    let record = tx
        .query_opt(
            &format!("SELECT o.version, o.function_schema {}", read.from()),
            &[],
        )
        .await?
        .ok_or(Error::NotSqlOnly)?;
    read.drop(tx).await?;
    let version: String = column(&record, 0)?;
    let schema: String = column(&record, 1)?;
    // The record is the owner's to write: believed only where the catalog
    // agrees (a version that was a SQL-only release, a functions' schema
    // that holds its functions and is not loom's tables' or the system's).
    let functions_there = tx
        .query_typed_opt(
            FUNCTIONS_THERE,
            &[(&schema, Type::TEXT), (&owner, Type::OID)],
        )
        .await?
        .map(|row| column::<bool>(&row, 0))
        .transpose()?
        .unwrap_or(false);
    if !pgloom_core::sql::sql_only_versions().any(|v| v == version) || !functions_there {
        return Err(Error::NotSqlOnly);
    }
    let names: Vec<String> = pgloom_core::sql::routine_names();
    for row in tx
        .query_typed(
            OWNERS_ROUTINES,
            &[
                (&schema, Type::TEXT),
                (&owner, Type::OID),
                (&names, Type::TEXT_ARRAY),
            ],
        )
        .await?
    {
        let routine: String = column(&row, 0)?;
        tx.batch_execute(&format!("ALTER ROUTINE {routine} SET SCHEMA {KEPT_IN}"))
            .await?;
    }
    let quoted_schema: String = column(
        &tx.query_one("SELECT pg_catalog.quote_ident($1)", &[&schema])
            .await?,
        0,
    )?;
    let quoted_version: String = column(
        &tx.query_one("SELECT pg_catalog.quote_literal($1)", &[&version])
            .await?,
        0,
    )?;
    tx.batch_execute(&format!(
        "CREATE EXTENSION loom SCHEMA {quoted_schema} VERSION {quoted_version}"
    ))
    .await?;
    // An older version is built from 0.1.0's script and the upgrade steps,
    // which never add the snapshot frame column (ADR 0141 D5); that
    // release's own script did, and a SQL-only database always has it.
    // The extension's tables are new and empty: the lock waits are the
    // migration lock's, bounded by the transaction's lock_timeout.
    let frames: bool = column(
        &tx.query_one(crate::snapshot_store::pg::PROBE, &[]).await?,
        0,
    )?;
    if !frames {
        let ensure =
            format!("SELECT {quoted_schema}.loom_ensure_snapshot_zstd($1::pg_catalog.int4)");
        let lock_ms = i32::try_from(lock_timeout_ms).unwrap_or(i32::MAX);
        let provisioned: bool = column(&tx.query_one(&ensure, &[&lock_ms]).await?, 0)?;
        if !provisioned {
            return Err(Error::ForeignColumns {
                table: "loom.snapshots".to_owned(),
                columns: vec!["state_z".to_owned()],
            });
        }
    }
    let since_0_16 = crate::versions::at_least(&version, "0.16.0");
    if since_0_16 {
        tx.batch_execute(&format!(
            "LOCK TABLE {KEPT_IN}.claims, {KEPT_IN}.feed_state, {KEPT_IN}.feed_high_water, {KEPT_IN}.feed_consumers
             IN ACCESS EXCLUSIVE MODE"
        ))
        .await?;
    }
    let extra: &[&str] = if since_0_16 { &TABLES_SINCE_0_16 } else { &[] };
    let mut rows = Vec::new();
    for &table in TABLES.iter().chain(extra) {
        let foreign: Vec<String> = tx
            .query(FOREIGN_COLUMNS, &[&table])
            .await?
            .iter()
            .map(|row| column(row, 0))
            .collect::<Result<_>>()?;
        if !foreign.is_empty() {
            return Err(Error::ForeignColumns {
                table: format!("loom.{table}"),
                columns: foreign,
            });
        }
        let described = tx.query_one(COLUMNS, &[&table]).await?;
        let columns: String = column(&described, 0)?;
        let count: i64 = column(&described, 1)?;
        let from_old: String = column(&described, 2)?;
        let read = OwnerRead::fill(
            tx,
            table,
            (owner, &quoted_owner),
            count,
            &format!("SELECT {from_old} FROM ONLY {KEPT_IN}.{table} o"),
        )
        .await?;
        // Ids kept as they were (a snapshot's id is its cursor).
        let overriding = if table == "snapshots" {
            "OVERRIDING SYSTEM VALUE"
        } else {
            ""
        };
        let copied = tx
            .execute(
                &format!(
                    "INSERT INTO loom.{table} ({columns}) {overriding}
                     SELECT {from_old} {}",
                    read.from()
                ),
                &[],
            )
            .await?;
        read.drop(tx).await?;
        rows.push((table.to_owned(), copied));
    }
    tx.batch_execute(
        "SELECT pg_catalog.setval(pg_catalog.pg_get_serial_sequence('loom.snapshots', 'id'),
                                  coalesce((SELECT pg_catalog.max(id) FROM loom.snapshots), 0) OPERATOR(pg_catalog.+) 1, false)",
    )
    .await?;
    if since_0_16 {
        for (sequence, moved_max) in SEQUENCES_SINCE_0_16 {
            let old: Option<i64> = match tx.query_opt(SEQUENCE_VALUE, &[&sequence]).await? {
                Some(row) => column(&row, 0)?,
                None => None,
            };
            let moved: Option<i64> = match moved_max {
                Some(sql) => column(&tx.query_one(sql, &[]).await?, 0)?,
                None => None,
            };
            if let Some(last) = old.max(moved) {
                tx.execute(
                    "SELECT pg_catalog.setval(pg_catalog.to_regclass('loom.' OPERATOR(pg_catalog.||) $1::pg_catalog.text), $2::pg_catalog.int8, true)",
                    &[&sequence, &last],
                )
                .await?;
            }
        }
        // A feed that was on is on again: the move's copy of its events
        // kept their positions, and enabling it keeps new ones above. One
        // that was turned off gets its index (readers keep what it wrote)
        // and is off again.
        if let Some(row) = tx
            .query_opt("SELECT s.enabled, s.notify FROM loom.feed_state s", &[])
            .await?
        {
            let (enabled, notify): (bool, bool) = (column(&row, 0)?, column(&row, 1)?);
            tx.execute(
                &format!("SELECT {quoted_schema}.loom_feed_enable($1::pg_catalog.bool)"),
                &[&notify],
            )
            .await?;
            if !enabled {
                tx.batch_execute(&format!("SELECT {quoted_schema}.loom_feed_disable()"))
                    .await?;
            }
        }
    }
    let mut grants = Vec::new();
    for row in tx.query(OLD_GRANTEES, &[]).await? {
        let role: String = column(&row, 0)?;
        let access: String = column(&row, 1)?;
        tx.execute(
            &format!(
                "SELECT {quoted_schema}.loom_grant_access($1::pg_catalog.text::pg_catalog.regrole, $2::pg_catalog.text)"
            ),
            &[&role, &access],
        )
        .await?;
        grants.push((role, access));
    }
    Ok(Move {
        version,
        schema,
        rows,
        grants,
        kept_in: KEPT_IN.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_schema::assert_resolves_nothing;

    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        for template in [
            FIND,
            FUNCTIONS_THERE,
            FOREIGN_COLUMNS,
            COLUMNS,
            OWNERS_ROUTINES,
            OLD_GRANTEES,
            VIEW_AS_MADE,
        ] {
            assert_resolves_nothing(template);
        }
    }
}

//! `loom status`: what a PostgreSQL database's loom needs, from
//! `loom_status()` (0.7.0+; before it, the version and the update that
//! brings it).

use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;

use super::progress::Bar;
use super::{describe, is_postgres, needs_action, Failure, Target, NOT_POSTGRES, USAGE};
use crate::event_store::PgEventStore;
use crate::pg_schema::LoomSchema;
use crate::PgPool;

/// One fact of `loom_status()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fact {
    pub item: String,
    pub value: String,
    pub needs_action: bool,
    pub statement: Option<String>,
}

/// The installed and the newest available version, for a version without
/// `loom_status()`.
const VERSIONS: &str = "SELECT
        (SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'loom'),
        (SELECT default_version FROM pg_catalog.pg_available_extensions WHERE name OPERATOR(pg_catalog.=) 'loom')";
const STATUS: &str = "SELECT item, value, needs_action, statement FROM @extschema@.loom_status()";

/// `loom status`: what the database's loom needs, as text or `--json`;
/// exit 1 when something needs action.
pub(super) fn run(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    json: bool,
    verify: Option<usize>,
) -> ExitCode {
    if !is_postgres(target.db()) {
        eprintln!(
            "loom: status reads a PostgreSQL database with the loom extension: {NOT_POSTGRES}"
        );
        return ExitCode::from(USAGE);
    }
    match runtime.block_on(facts(target.db(), target.connect_timeout(), verify)) {
        Ok(facts) => {
            if json {
                println!("{}", render_json(&facts));
            } else {
                print!("{}", render_text(&facts));
            }
            needs_action(facts.iter().any(|f| f.needs_action))
        }
        Err(failure) => failure.exit(),
    }
}

/// The facts of the database `db` names, read in a read-only session. Only
/// a `loom_status()` the catalog says the extension has is called, by its
/// schema (`crate::pg_schema`): `loom status` is run as a superuser, in a
/// database whose owner may have planted one elsewhere on the
/// `search_path`, or in loom's schema under a version without it.
///
/// With `verify` (a batch size), the executions index is also checked
/// against the log, in batches with a progress line
/// ([`PgEventStore::verify_executions_index`]), and its fact says what
/// the check found: `loom_status()` alone reads catalogs and statistics.
pub(super) async fn facts(
    db: &str,
    connect_timeout: Duration,
    verify: Option<usize>,
) -> Result<Vec<Fact>, Failure> {
    let pool = super::read_only_pool(db, connect_timeout)?;
    let client = pool.object().await.map_err(|e| describe(&e))?;
    let not_installed = || {
        Failure::needs_migrate(
            "loom is not installed in this database: run loom migrate --db …".to_owned(),
        )
    };
    let schema = LoomSchema::read(&client)
        .await
        .map_err(|e| describe(&e))?
        .ok_or_else(not_installed)?;
    if !schema.has("loom_status") {
        let row = client
            .query_typed_one(VERSIONS, &[])
            .await
            .map_err(|e| describe(&e))?;
        let installed: Option<String> = row.try_get(0).map_err(|e| describe(&e))?;
        let available: Option<String> = row.try_get(1).map_err(|e| describe(&e))?;
        let installed = installed.ok_or_else(not_installed)?;
        return Ok(vec![
            Fact {
                item: "loom version".into(),
                value: installed,
                needs_action: false,
                statement: None,
            },
            Fact {
                item: "loom available version".into(),
                value: available.unwrap_or_default(),
                needs_action: true,
                statement: Some("loom migrate --db <db>: this version has no loom_status()".into()),
            },
        ]);
    }
    let status = schema.sql(STATUS).map_err(|e| describe(&e))?;
    let rows = client
        .query_typed(&status, &[])
        .await
        .map_err(|e| describe(&e))?;
    let mut facts = rows
        .iter()
        .map(|row| {
            Ok(Fact {
                item: row.try_get(0).map_err(|e| describe(&e))?,
                value: row
                    .try_get::<_, Option<String>>(1)
                    .map_err(|e| describe(&e))?
                    .unwrap_or_default(),
                needs_action: row.try_get(2).map_err(|e| describe(&e))?,
                statement: row.try_get(3).map_err(|e| describe(&e))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if let Some(batch) = verify {
        // The pool has one connection: the store takes it back.
        drop(client);
        let checked = verified_index(pool, batch).await?;
        match facts.iter_mut().find(|f| f.item == INDEX_ITEM) {
            Some(fact) => *fact = checked,
            None => facts.push(checked),
        }
    }
    Ok(facts)
}

/// The item of the executions index's fact.
const INDEX_ITEM: &str = "executions index";

/// The executions index checked against the log, `batch` ids a statement,
/// as one fact.
async fn verified_index(pool: PgPool, batch: usize) -> Result<Fact, Failure> {
    let bar = Bar::new();
    let check = PgEventStore::new(pool)
        .verify_executions_index(batch, |so_far| {
            bar.show(|| {
                format!(
                    "executions index: {} ids checked, {} missing, {} without events",
                    so_far.checked, so_far.missing, so_far.orphaned
                )
            });
        })
        .await
        .map_err(|e| match e {
            crate::Error::ExtensionMissing { .. } => Failure::needs_migrate(format!(
                "{} (--verify needs loom 0.10.0: run loom migrate)",
                describe(&e)
            )),
            _ => Failure::of(&e),
        })?;
    let in_step = check.in_step();
    Ok(Fact {
        item: INDEX_ITEM.into(),
        value: if in_step {
            format!(
                "in step with the log ({} ids checked in {} batches, longest {} ms)",
                check.checked,
                check.batches,
                check.longest_batch.as_millis()
            )
        } else {
            format!(
                "{} ids of the log missing, {} ids without events ({} ids checked)",
                check.missing, check.orphaned, check.checked
            )
        },
        needs_action: !in_step,
        statement: (!in_step).then(|| "loom repair --db <db> (online, in batches)".into()),
    })
}

/// The facts as text: one aligned line each, then what needs action and
/// the statement to run for it.
pub(super) fn render_text(facts: &[Fact]) -> String {
    let width = facts.iter().map(|f| f.item.len()).max().unwrap_or(0);
    let mut out = String::new();
    for fact in facts {
        let mark = if fact.needs_action {
            "  <- needs action"
        } else {
            ""
        };
        out.push_str(&format!("{:<width$}  {}{mark}\n", fact.item, fact.value));
    }
    let pending: Vec<&Fact> = facts.iter().filter(|f| f.needs_action).collect();
    if pending.is_empty() {
        out.push_str("\nnothing needs action\n");
    } else {
        out.push_str(&format!("\n{} item(s) need action:\n", pending.len()));
        for fact in pending {
            out.push_str(&format!(
                "  {}: {}\n",
                fact.item,
                fact.statement
                    .as_deref()
                    .unwrap_or("(see docs/operations.md)")
            ));
        }
    }
    out
}

/// The facts as one JSON object: `needs_action`, and `items` in order.
pub(super) fn render_json(facts: &[Fact]) -> String {
    let items: Vec<_> = facts
        .iter()
        .map(|f| {
            json!({
                "item": f.item,
                "value": f.value,
                "needs_action": f.needs_action,
                "statement": f.statement,
            })
        })
        .collect();
    json!({
        "needs_action": facts.iter().any(|f| f.needs_action),
        "items": items,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(item: &str, value: &str, statement: Option<&str>) -> Fact {
        Fact {
            item: item.into(),
            value: value.into(),
            needs_action: statement.is_some(),
            statement: statement.map(Into::into),
        }
    }

    #[test]
    fn text_lists_what_needs_action_with_its_statement() {
        let facts = [
            fact("loom version", "0.7.0", None),
            fact(
                "snapshot frames",
                "not provisioned",
                Some("SELECT loom_ensure_snapshot_zstd();"),
            ),
        ];
        let text = render_text(&facts);
        assert!(text.contains("loom version     0.7.0\n"), "{text}");
        assert!(text.contains("not provisioned  <- needs action"), "{text}");
        assert!(
            text.contains(
                "1 item(s) need action:\n  snapshot frames: SELECT loom_ensure_snapshot_zstd();"
            ),
            "{text}"
        );
        assert!(render_text(&facts[..1]).ends_with("nothing needs action\n"));
    }

    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        crate::pg_schema::assert_resolves_nothing(VERSIONS);
        crate::pg_schema::assert_resolves_nothing(STATUS);
    }

    #[test]
    fn json_is_one_object() {
        let facts = [fact("a", "1", None), fact("b", "2", Some("do b"))];
        let value: serde_json::Value = serde_json::from_str(&render_json(&facts)).unwrap();
        assert_eq!(value["needs_action"], true);
        assert_eq!(value["items"][1]["statement"], "do b");
        assert_eq!(value["items"][0]["statement"], serde_json::Value::Null);
    }
}

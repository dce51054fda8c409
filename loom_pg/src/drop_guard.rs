//! The extension's guard against being dropped by a database's owner
//! (issue 34, its review). On PostgreSQL 15 and later a database's owner
//! owns `public`, loom's usual schema, and `DROP SCHEMA public CASCADE`
//! drops whatever is in it, an extension a superuser created included:
//! dependents are dropped without a check of their own. The owner could
//! then create `public` again with procedures named as loom's, and a
//! superuser's documented statement or scheduled job
//! (`CALL public.loom_sweep_idle_executions(…)`, however exactly typed)
//! would run the owner's code. So while loom is installed, no role but a
//! superuser may drop loom's functions' schema or schema `loom`, directly
//! or through `DROP OWNED BY` their owner.
//!
//! At `ddl_command_start`, and in C: an event trigger dropped by the
//! command it fires for does not fire at `sql_drop` (a cascade through
//! the extension drops the trigger with it), and only the parse tree says,
//! before anything is dropped, what a `DROP SCHEMA` or `DROP OWNED` names.
//! Its ERROR ends the command before it starts.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::saved_plans::v1_function_info;

v1_function_info!(pg_finfo_loom_refuse_drops);

/// The event trigger function (`loom.loom_refuse_drops()`, on
/// `ddl_command_start` for `DROP SCHEMA` and `DROP OWNED`): an ERROR
/// (`42501`) when a role that is not superuser would drop loom's
/// functions' schema or schema `loom`.
///
/// # Safety
/// Called by PostgreSQL's fmgr with its `fcinfo`.
#[doc(hidden)]
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn loom_refuse_drops(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_EventTriggerData {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED,
                "loom_refuse_drops() runs only as an event trigger"
            );
        }
        if !pg_sys::superuser() {
            let tree = (*context.cast::<pg_sys::EventTriggerData>()).parsetree;
            if let Some(schema) = dropped_loom_schema(tree) {
                ereport!(
                    ERROR,
                    PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                    format!(
                        "only a superuser may drop schema {schema} while loom is installed: it holds loom, which a superuser created"
                    ),
                    "Dropping it would drop loom, and another schema of the same name could take its place under statements a superuser runs. Have a superuser DROP EXTENSION loom first."
                );
            }
        }
        pg_sys::Datum::from(0usize)
    }
}

/// The name of loom's schema that `tree` would drop: one a `DROP SCHEMA`
/// names, or one a `DROP OWNED BY` role owns.
///
/// # Safety
/// `tree` is the parse tree of the command an event trigger fires for.
unsafe fn dropped_loom_schema(tree: *mut pg_sys::Node) -> Option<String> {
    unsafe {
        match (*tree).type_ {
            pg_sys::NodeTag::T_DropStmt => {
                let stmt = tree.cast::<pg_sys::DropStmt>();
                if (*stmt).removeType != pg_sys::ObjectType::OBJECT_SCHEMA {
                    return None;
                }
                let names = nodes((*stmt).objects)
                    .into_iter()
                    .map(|node| {
                        CStr::from_ptr((*node.cast::<pg_sys::String>()).sval)
                            .to_string_lossy()
                            .into_owned()
                    })
                    .collect::<Vec<_>>();
                loom_schemas()
                    .into_iter()
                    .find(|(name, _)| names.contains(name))
                    .map(|(name, _)| name)
            }
            pg_sys::NodeTag::T_DropOwnedStmt => {
                let stmt = tree.cast::<pg_sys::DropOwnedStmt>();
                let roles = nodes((*stmt).roles)
                    .into_iter()
                    .map(|role| pg_sys::get_rolespec_oid(role.cast::<pg_sys::RoleSpec>(), true))
                    .collect::<Vec<_>>();
                loom_schemas()
                    .into_iter()
                    .find(|(_, owner)| roles.contains(owner))
                    .map(|(name, _)| name)
            }
            _ => None,
        }
    }
}

/// The elements of a PostgreSQL `List` of pointers.
///
/// # Safety
/// `list` is NIL or a pointer `List`.
unsafe fn nodes(list: *mut pg_sys::List) -> Vec<*mut pg_sys::Node> {
    unsafe {
        (0..pg_sys::list_length(list))
            .map(|i| pg_sys::list_nth(list, i).cast::<pg_sys::Node>())
            .collect()
    }
}

/// loom's functions' schema and schema `loom`: each name and owner.
fn loom_schemas() -> Vec<(String, pg_sys::Oid)> {
    let read: Result<Vec<(String, pg_sys::Oid)>, pgrx::spi::SpiError> = Spi::connect(|client| {
        client
            .select(
                "SELECT n.nspname::pg_catalog.text, n.nspowner FROM pg_catalog.pg_namespace n
                 WHERE n.nspname OPERATOR(pg_catalog.=) 'loom'
                    OR n.oid OPERATOR(pg_catalog.=) (SELECT e.extnamespace FROM pg_catalog.pg_extension e
                                                      WHERE e.extname OPERATOR(pg_catalog.=) 'loom')",
                None,
                &[],
            )
            .map(|rows| {
                rows.filter_map(|row| {
                    Some((
                        row.get::<String>(1).ok()??,
                        row.get::<pg_sys::Oid>(2).ok()??,
                    ))
                })
                .collect()
            })
    });
    match read {
        Ok(schemas) => schemas,
        // Unread, nothing would be guarded: the command is refused.
        Err(e) => {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("loom could not read its schemas to guard this DROP: {e}")
            );
        }
    }
}

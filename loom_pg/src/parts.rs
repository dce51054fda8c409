// @generated from pgloom_core::sql::PARTS (loom-core/src/sql.rs), the one
// list of loom's SQL in install order, by tests/install/sql_only.rs
// `the_extensions_pgrx_chain_is_generated_from_parts`: edit PARTS, then
// run that test with LOOM_BLESS=1 to write this file again.
::pgrx::extension_sql_file!(
    "../../loom-core/sql/bootstrap.sql",
    name = "bootstrap",
    bootstrap
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/order.sql",
    name = "order",
    requires = ["bootstrap"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/native/order.sql",
    name = "native_order",
    requires = ["order"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/tables.sql",
    name = "tables",
    requires = ["native_order"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/native/schema_names.sql",
    name = "native_schema_names",
    requires = ["tables"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/log_api.sql",
    name = "log_api",
    requires = ["native_schema_names"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/native/write_path.sql",
    name = "native_write_path",
    requires = ["log_api"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/collation_migration.sql",
    name = "collation_migration",
    requires = ["native_write_path"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/frames.sql",
    name = "frames",
    requires = ["collation_migration"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/native/frames.sql",
    name = "native_frames",
    requires = ["frames"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/snapshot_api.sql",
    name = "snapshot_api",
    requires = ["native_frames"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/distribute.sql",
    name = "distribute",
    requires = ["snapshot_api"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/provision.sql",
    name = "provision",
    requires = ["distribute"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/claims.sql",
    name = "claims",
    requires = ["provision"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/feed.sql",
    name = "feed",
    requires = ["claims"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/retention.sql",
    name = "retention",
    requires = ["feed"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/executions_check.sql",
    name = "executions_check",
    requires = ["retention"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/status.sql",
    name = "status",
    requires = ["executions_check"]
);
::pgrx::extension_sql_file!(
    "../../loom-core/sql/privileges.sql",
    name = "privileges",
    finalize
);

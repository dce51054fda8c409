//! The pg_tests of loom's SQL parts (`loom-core/sql/<part>.sql`), as the
//! extension installs them (`parts.rs`): one file a part, named for it, so
//! that a part's tests are found by its name. The SQL-only flavour runs the
//! same parts and is tested against real servers in `tests/install/`; the
//! helpers these share are in `test_support.rs`.

mod claims;
mod collation_migration;
mod distribute;
mod executions_check;
mod feed;
mod log_api;
mod privileges;
mod snapshot_api;
mod status;

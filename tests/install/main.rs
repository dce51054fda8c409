//! Installing and updating loom: upgrades from every released version,
//! migrate() at boot, the SQL-only flavour, pg_upgrade and the Debian package.

mod migrations;
mod packages;
mod pg_upgrade;
mod sql_only;
mod upgrade;

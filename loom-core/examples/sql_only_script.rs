//! Prints the SQL-only flavour's install script, for schema `public`
//! (`make sql-only` writes it to `target/sql-only/loom.sql`).
fn main() {
    print!("{}", pgloom_core::sql::sql_only_install_script("public"));
}

//! Which of loom's two flavours a database has: a leaf type that the
//! schema reader, `compat` and `migrate` share (public as
//! [`crate::migrate::Flavour`]).

/// Which of loom's two flavours a database has, or a migration installs
/// (docs/flavours.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flavour {
    /// The native extension, `CREATE EXTENSION loom`: C for the write path
    /// and the frame decoders, and zstd frames decoded in the server.
    Extension,
    /// The SQL-only flavour, for servers that cannot load `loom.so`
    /// (managed PostgreSQL): the same tables and SQL API in SQL and
    /// PL/pgSQL, installed by the database's owner, its version kept in
    /// `loom.sql_only`. zstd frames are written and read by the client;
    /// the server decodes `0x01` frames only.
    SqlOnly,
}

impl std::fmt::Display for Flavour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Flavour::Extension => "extension",
            Flavour::SqlOnly => "SQL-only",
        })
    }
}

//! Which versions of the `loom` extension this client works with, checked
//! where the client first reads the extension from the catalog (every
//! PostgreSQL store's first call, [`check_server`], and the end of
//! [`crate::migrate::migrate`]), so that a mismatch is one typed error
//! naming both versions instead of a failure on some later call.
//!
//! pgloom's version is its own (SemVer, as the crate root says), not the
//! extension's: the SQL function API is the contract between them, and
//! each extension release keeps the functions older clients call, so a
//! client works with every extension from
//! [`OLDEST_EXTENSION`] up to, not including, [`FIRST_UNSUPPORTED_EXTENSION`]
//! (the next major version, which may change the contract). A method that
//! needs a function added later fails with
//! [`Error::ExtensionMissing`](crate::Error::ExtensionMissing) on an older
//! one; `docs/client.md` lists each method's minimum.

pub use crate::versions::{
    supports, CLIENT_VERSION, FIRST_UNSUPPORTED_EXTENSION, OLDEST_EXTENSION,
};

/// What [`check_server`] found.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// The installed extension's version (`pg_extension.extversion`), or
    /// the SQL-only flavour's (`loom.sql_only.version`).
    pub extension_version: String,
    /// The schema its functions are in, as an identifier.
    pub schema: String,
    /// Which flavour of loom the database has: the extension, or the
    /// SQL-only flavour of managed servers, whose zstd frames the client
    /// decodes.
    pub flavour: crate::flavour::Flavour,
}

/// Reads the loom installed in the database `connection` is to (the
/// extension, or the SQL-only flavour: [`ServerInfo::flavour`]) and checks
/// that this client works with it. A store's own
/// ([`crate::event_store::PgEventStore::check_server`]) takes a connection
/// of its pool; this one takes any ([`crate::interop::PgConnection`]).
///
/// ```no_run
/// # async fn f(pool: &pgloom::PgPool) -> pgloom::Result<()> {
/// let connection = pool.as_ref().get().await?;
/// let server = pgloom::compat::check_server(&connection).await?;
/// println!(
///     "loom {} ({}) in {}",
///     server.extension_version, server.flavour, server.schema
/// );
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::IncompatibleExtension`](crate::Error::IncompatibleExtension),
/// naming both versions; [`Error::ExtensionMissing`](crate::Error::ExtensionMissing)
/// when neither flavour is installed; what the server raises.
#[cfg(feature = "postgres")]
pub async fn check_server(
    connection: &impl crate::interop::PgConnection,
) -> crate::Result<ServerInfo> {
    match crate::pg_schema::LoomSchema::read(connection.pg_client()).await? {
        Some(schema) => Ok(ServerInfo {
            extension_version: schema.version().to_owned(),
            schema: schema.quoted().to_owned(),
            flavour: schema.flavour(),
        }),
        None => Err(crate::Error::ExtensionMissing {
            function: "loom (the extension is not installed)".to_owned(),
        }),
    }
}

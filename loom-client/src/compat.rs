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

/// This client's version.
pub const CLIENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The oldest extension version this client's stores work with.
pub const OLDEST_EXTENSION: &str = "0.1.0";

/// The first extension version this client refuses: the next major.
pub const FIRST_UNSUPPORTED_EXTENSION: &str = "1.0.0";

/// A version as `major.minor.patch` numbers; `None` for anything else.
fn parse(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.split('.').map(|p| {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    });
    let parsed = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(parsed)
}

/// Whether extension `installed` is `version` or later (false for a
/// version that does not parse).
#[cfg(feature = "postgres")]
pub(crate) fn at_least(installed: &str, version: &str) -> bool {
    matches!((parse(installed), parse(version)), (Some(i), Some(v)) if i >= v)
}

/// Whether this client works with extension `version`.
///
/// ```
/// use pgloom::compat::supports;
/// assert!(supports("0.10.0"));
/// assert!(!supports("1.0.0"));
/// assert!(!supports("0.10"));
/// ```
#[must_use]
pub fn supports(version: &str) -> bool {
    let (Some(v), Some(oldest), Some(first_unsupported)) = (
        parse(version),
        parse(OLDEST_EXTENSION),
        parse(FIRST_UNSUPPORTED_EXTENSION),
    ) else {
        return false;
    };
    oldest <= v && v < first_unsupported
}

/// [`supports`], as the error a store returns.
#[cfg(feature = "postgres")]
pub(crate) fn check(version: &str) -> crate::Result<()> {
    if supports(version) {
        Ok(())
    } else {
        Err(crate::Error::IncompatibleExtension {
            installed: version.to_owned(),
            client: CLIENT_VERSION,
        })
    }
}

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
    pub flavour: crate::migrate::Flavour,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[test]
    fn orders_versions_by_number_not_text() {
        assert!(at_least("0.11.0", "0.11.0"));
        assert!(at_least("0.11.0", "0.9.0"));
        assert!(!at_least("0.10.0", "0.11.0"));
        assert!(!at_least("0.9.9", "0.11.0"));
        assert!(!at_least("v0.11.0", "0.11.0"));
    }

    #[test]
    fn the_supported_range_is_oldest_up_to_the_next_major() {
        for v in [OLDEST_EXTENSION, "0.2.0", "0.10.0", "0.10.7", "0.99.0"] {
            assert!(supports(v), "{v}");
        }
        for v in [FIRST_UNSUPPORTED_EXTENSION, "1.2.0", "0.0.9", "2.0.0"] {
            assert!(!supports(v), "{v}");
        }
    }

    #[test]
    fn a_version_that_is_not_three_numbers_is_refused() {
        for v in [
            "",
            "0.10",
            "0.10.0.1",
            "0.10.0-beta",
            "v0.10.0",
            "0..0",
            "0.1x.0",
        ] {
            assert!(!supports(v), "{v:?}");
        }
    }

    #[test]
    fn the_client_supports_the_extension_it_installs() {
        // migrate() installs and updates to this version.
        assert!(supports(pgloom_core::sql::VERSION));
    }
}

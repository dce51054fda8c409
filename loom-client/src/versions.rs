//! The version rules behind [`crate::compat`]: which extension versions
//! this client works with, and how versions compare. A leaf module: the
//! schema reader, `migrate` and `compat` all use it, and it uses none of
//! them.

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

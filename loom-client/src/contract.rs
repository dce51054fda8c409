//! Store contract versions (the ADR's "SPI": what a store implements), and
//! the compatibility check that refuses a store written against an older
//! contract (ADR 0108, "Why MAJOR").
//!
//! A 1.x event store pages in any order with an opaque cursor; the
//! sharded and tenant-scoped stores need 2.0's rules (code point order, a
//! cursor that is an id, any id), so a 1.x store silently skips and
//! repeats ids under them. It is refused instead.

use std::fmt;

/// A semantic version of a store contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContractVersion {
    /// Incompatible contract changes.
    pub major: u32,
    /// Additions.
    pub minor: u32,
    /// Fixes.
    pub patch: u32,
}

impl ContractVersion {
    /// A version.
    #[must_use]
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        ContractVersion {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The event-store contract this client implements and requires: ids page
/// in Unicode code point order, the cursor is an id (any string), the next
/// cursor is the page's last id (2.0.0, ADR 0108); 2.1.0 adds keyset tail
/// reads (`read_events_after`) and bounded deletes (`delete_events`); 2.2.0
/// events' metadata (`Event::metadata`), kept exactly and read back with
/// the event.
pub const EVENT_STORE_CONTRACT: ContractVersion = ContractVersion::new(2, 2, 0);

/// The branch-registry contract: ref names page as execution ids do.
pub const BRANCH_REGISTRY_CONTRACT: ContractVersion = ContractVersion::new(2, 0, 0);

/// A store written against a contract this client cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{contract} store implements contract {found}, this loom needs {required} (same major): a {found} store may page in another order")]
pub struct IncompatibleStoreError {
    /// "event" or "branch registry".
    pub contract: &'static str,
    /// What the store implements.
    pub found: ContractVersion,
    /// What this client needs.
    pub required: ContractVersion,
}

/// Checks that a store's contract version can be used: the same major
/// version, and at least the required minor.
///
/// # Errors
///
/// [`IncompatibleStoreError`] for any other major (a 1.x store), or an
/// older minor.
///
/// ```
/// use pgloom::contract::{check_compatibility, ContractVersion, EVENT_STORE_CONTRACT};
/// assert!(check_compatibility("event", ContractVersion::new(2, 2, 0), EVENT_STORE_CONTRACT).is_ok());
/// // 2.1.0 drops events' metadata; 2.0.0 also lacks tail reads and deletes,
/// // which retention and resume need.
/// assert!(check_compatibility("event", ContractVersion::new(2, 1, 0), EVENT_STORE_CONTRACT).is_err());
/// assert!(check_compatibility("event", ContractVersion::new(2, 0, 0), EVENT_STORE_CONTRACT).is_err());
/// assert!(check_compatibility("event", ContractVersion::new(1, 5, 0), EVENT_STORE_CONTRACT).is_err());
/// ```
pub fn check_compatibility(
    contract: &'static str,
    found: ContractVersion,
    required: ContractVersion,
) -> Result<(), IncompatibleStoreError> {
    if found.major == required.major && found.minor >= required.minor {
        Ok(())
    } else {
        Err(IncompatibleStoreError {
            contract,
            found,
            required,
        })
    }
}

//! Reading PostgreSQL rows without panicking: `tokio_postgres::Row::get`
//! panics on a column that is missing, NULL or of another type, and a row
//! is what the database holds, not what this client wrote. Every column
//! loom reads goes through [`column`], which turns that into
//! [`Error::UnreadableRow`].

use std::error::Error as StdError;

use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::Row;

use crate::{Error, Result};

/// Column `index` of `row` as a `T`, or [`Error::UnreadableRow`].
pub(crate) fn column<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T> {
    row.try_get(index).map_err(|source| Error::UnreadableRow {
        column: index,
        source: crate::error::PgError(source),
    })
}

/// A jsonb (or json) value as the server printed it, without parsing it
/// into a value: the binary jsonb format is a version byte, then the text
/// `jsonb_out` prints. Nothing here recurses or rounds, so a value nested
/// as deep as the server allows, or a number no f64 holds, reads whole.
pub(crate) struct JsonbText(pub(crate) String);

impl<'a> FromSql<'a> for JsonbText {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn StdError + Sync + Send>> {
        let text = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, text)) => text,
                _ => return Err("unsupported jsonb binary format version".into()),
            }
        } else {
            raw
        };
        Ok(JsonbText(std::str::from_utf8(text)?.to_owned()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

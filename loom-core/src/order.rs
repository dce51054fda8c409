//! The one order of execution ids and ref names (ADR 0108 D1 and its L21
//! addendum).
//!
//! Paging with an id cursor is only correct when every party that compares
//! ids uses the same order: a sharded pager that merges in one order and
//! hands the cursor to shards that seek in another skips and repeats ids.
//! loom's order is Unicode code point order, which is UTF-8 byte order, SQL
//! `COLLATE "C"` and SQLite `BINARY`.

use std::cmp::Ordering;

/// Compares two execution ids (or ref names) in Unicode code point order:
/// the reference comparator every loom store pages in.
///
/// This is UTF-8 byte order, which equals code point order, which equals SQL
/// `COLLATE "C"` on a UTF-8 database (`loom_compare_execution_ids` in SQL).
/// It is NOT the order of UTF-16 code units (JavaScript's default sort,
/// Java's `String.compareTo`): those put an astral character such as
/// U+1D11E, stored as the surrogates D834 DD1E, before U+FFFD. It is not a
/// locale's order either: it never ties two distinct ids, not even an NFC
/// "é" and its NFD decomposition.
///
/// ```
/// use pgloom_core::compare_execution_ids;
/// use std::cmp::Ordering;
///
/// // Upper case sorts before lower case, and "A1" before "a_b".
/// assert_eq!(compare_execution_ids("A1", "a_b"), Ordering::Less);
/// // U+FFFD < U+1D11E in code point order, though UTF-16 says otherwise.
/// assert_eq!(compare_execution_ids("\u{FFFD}", "\u{1D11E}"), Ordering::Less);
/// // Canonically equivalent is not equal: NFC "é" sorts after NFD "e\u{301}".
/// assert_eq!(compare_execution_ids("\u{E9}", "e\u{301}"), Ordering::Greater);
/// ```
#[must_use]
pub fn compare_execution_ids(a: &str, b: &str) -> Ordering {
    a.as_bytes().cmp(b.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sorts_the_adr_mixed_case_ids_in_byte_order() {
        let mut ids = vec!["a_b", "A1", "a-b", "B", "a1", "_x", "-y", "0"];
        ids.sort_by(|a, b| compare_execution_ids(a, b));
        assert_eq!(ids, ["-y", "0", "A1", "B", "_x", "a-b", "a1", "a_b"]);
    }

    #[test]
    fn differs_from_utf16_order_on_astral_characters() {
        let (bmp, astral) = ("\u{FFFD}", "\u{1D11E}");
        let utf16 = bmp.encode_utf16().cmp(astral.encode_utf16());
        assert_eq!(utf16, Ordering::Greater, "UTF-16 puts the astral id first");
        assert_eq!(compare_execution_ids(bmp, astral), Ordering::Less);
    }

    proptest! {
        #[test]
        fn agrees_with_char_order_and_is_a_total_order(a in "\\PC*", b in "\\PC*") {
            let by_chars = a.chars().cmp(b.chars());
            prop_assert_eq!(compare_execution_ids(&a, &b), by_chars);
            prop_assert_eq!(compare_execution_ids(&b, &a), by_chars.reverse());
            prop_assert_eq!(compare_execution_ids(&a, &b) == Ordering::Equal, a == b);
        }
    }
}

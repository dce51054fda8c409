//! loom's execution-id order in SQL (ADR 0108 D1).

use pgrx::prelude::*;
use std::cmp::Ordering;

/// -1, 0 or 1 as `a` sorts before, with or after `b` in Unicode code point
/// order (UTF-8 byte order, `COLLATE "C"`), whatever the database's or the
/// arguments' collation: the order every loom store and cursor uses.
#[pg_extern(sql = false)]
fn loom_compare_execution_ids(a: &str, b: &str) -> i32 {
    match pgloom_core::compare_execution_ids(a, b) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn compare(a: &str, b: &str) -> i32 {
        Spi::get_one_with_args::<i32>(
            "SELECT loom_compare_execution_ids($1, $2)",
            &[a.into(), b.into()],
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn orders_by_code_point_not_by_locale_or_utf16() {
        assert_eq!(compare("A1", "a_b"), -1);
        assert_eq!(compare("a_b", "a-b"), 1);
        assert_eq!(compare("same", "same"), 0);
        assert_eq!(compare("\u{FFFD}", "\u{1D11E}"), -1);
        assert_eq!(compare("\u{E9}", "e\u{301}"), 1);
        assert_eq!(compare("", "a"), -1);
    }

    #[pg_test]
    fn ignores_the_collation_of_its_arguments() {
        let ordered = Spi::get_one::<i32>(
            r#"SELECT loom_compare_execution_ids('a' COLLATE "POSIX", 'B' COLLATE "POSIX")"#,
        )
        .unwrap();
        assert_eq!(ordered, Some(1));
    }

    #[pg_test]
    fn compare_is_null_on_null_input() {
        let result = Spi::get_one::<i32>("SELECT loom_compare_execution_ids(NULL, 'a')").unwrap();
        assert_eq!(result, None);
    }

    #[pg_test]
    fn agrees_with_collate_c_on_mixed_case_ids() {
        let disagreements = Spi::get_one::<i64>(
            r#"
            WITH ids(id) AS (VALUES ('a_b'), ('A1'), ('a-b'), ('B'), ('é'), ('e' || U&'\0301'),
                                    (U&'\FFFD'), (U&'\+01D11E'), ('0'), ('_'))
            SELECT count(*) FROM ids x, ids y
            WHERE loom_compare_execution_ids(x.id, y.id)
               <> CASE WHEN x.id COLLATE "C" < y.id COLLATE "C" THEN -1
                       WHEN x.id = y.id THEN 0 ELSE 1 END
            "#,
        )
        .unwrap();
        assert_eq!(disagreements, Some(0));
    }
}

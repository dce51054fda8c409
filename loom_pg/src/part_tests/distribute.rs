//! The pg_tests of `loom-core/sql/distribute.sql`: distribution over Citus, refused where Citus is not.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_support::{column, one, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn distribution_needs_citus_and_says_so() {
        assert_eq!(
            column("SELECT distribution FROM loom_distribution()"),
            ["local"; 5]
        );
        assert_eq!(one::<bool>("SELECT loom_is_distributed()"), Some(false));
        assert_eq!(sqlstate_of("SELECT * FROM loom_distribute()"), "55000");
        assert_eq!(sqlstate_of("SELECT * FROM loom_distribute(0)"), "22023");
        assert_eq!(sqlstate_of("SELECT * FROM loom_distribute(4, 0)"), "22023");
        // Nothing changed: the triggers are still there.
        assert_eq!(
            one::<bool>("SELECT loom_executions_tracked_by_trigger()"),
            Some(true)
        );
    }
}

//! The branch-registry kit: ref names in code point order, paging, prune.

use super::{
    check_pass, expect_eq, fail, sorted, store_error, ConformanceFailure, CONFORMANCE_IDS,
    FOREIGN_CURSORS,
};
use crate::branch_registry::{prune_branch_refs, BranchRegistry};
use crate::contract::{check_compatibility, BRANCH_REGISTRY_CONTRACT};

async fn names<R: BranchRegistry>(registry: &R) -> Result<Vec<String>, ConformanceFailure> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = registry
            .list_refs(after.as_deref(), 4)
            .await
            .map_err(store_error("list refs"))?;
        all.extend(page.ids);
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => return Ok(all),
        }
    }
}

/// How many refs the prune check creates: enough that paging, deleting
/// behind the cursor and any cache upkeep all happen many times over.
pub const PRUNE_REFS: usize = 2_000;

/// Runs every branch-registry rule against an empty `registry`.
///
/// # Errors
///
/// The first rule the registry breaks.
pub async fn check_branch_registry<R: BranchRegistry>(
    registry: &R,
) -> Result<(), ConformanceFailure> {
    check_compatibility(
        "branch registry",
        registry.contract_version(),
        BRANCH_REGISTRY_CONTRACT,
    )
    .map_err(|e| fail("contract version", e.to_string()))?;
    expect_eq(
        "empty registry",
        names(registry).await?,
        Vec::<String>::new(),
    )?;
    for (i, name) in CONFORMANCE_IDS.iter().enumerate() {
        registry
            .put_ref(name, "exec", i as i64)
            .await
            .map_err(store_error("put"))?;
    }
    let expected = sorted(&CONFORMANCE_IDS);
    for page_size in [1, 3, expected.len() + 1] {
        check_pass(&expected, page_size, |after, limit| async move {
            registry.list_refs(after.as_deref(), limit).await
        })
        .await?;
    }
    for cursor in FOREIGN_CURSORS {
        let page = registry
            .list_refs(Some(cursor), 100)
            .await
            .map_err(store_error("foreign cursor"))?;
        let after: Vec<String> = expected
            .iter()
            .filter(|n| n.as_str() > cursor)
            .cloned()
            .collect();
        expect_eq("a cursor the registry never returned", page.ids, after)?;
    }
    // Moves, deletes, re-puts and promotes show in the next page at once.
    registry
        .put_ref("B", "moved", 42)
        .await
        .map_err(store_error("move"))?;
    let moved = registry.get_ref("B").await.map_err(store_error("get"))?;
    expect_eq(
        "move a ref",
        moved.map(|r| (r.execution_id, r.sequence)),
        Some(("moved".to_owned(), 42)),
    )?;
    expect_eq(
        "delete",
        registry
            .delete_ref("a_b")
            .await
            .map_err(store_error("delete"))?,
        true,
    )?;
    expect_eq(
        "delete twice",
        registry
            .delete_ref("a_b")
            .await
            .map_err(store_error("delete"))?,
        false,
    )?;
    let mut without: Vec<String> = expected.iter().filter(|n| *n != "a_b").cloned().collect();
    expect_eq(
        "a deleted name is not listed",
        names(registry).await?,
        without.clone(),
    )?;
    registry
        .put_ref("a_b", "back", 1)
        .await
        .map_err(store_error("put"))?;
    expect_eq(
        "a re-put name is listed",
        names(registry).await?,
        expected.clone(),
    )?;
    expect_eq(
        "promote",
        registry
            .promote_ref("b2", "main")
            .await
            .map_err(store_error("promote"))?,
        true,
    )?;
    expect_eq(
        "promote a missing ref",
        registry
            .promote_ref("b2", "main")
            .await
            .map_err(store_error("promote"))?,
        false,
    )?;
    without = expected.iter().filter(|n| *n != "b2").cloned().collect();
    without.push("main".to_owned());
    without.sort_by(|a, b| pgloom_core::compare_execution_ids(a, b));
    expect_eq("promote moves the name", names(registry).await?, without)?;
    let main = registry.get_ref("main").await.map_err(store_error("get"))?;
    expect_eq(
        "promote keeps the target",
        main.map(|r| (r.execution_id, r.sequence)),
        Some(("exec".to_owned(), 9)),
    )?;

    // Prune half of a large registry while paging it.
    for i in 0..PRUNE_REFS {
        registry
            .put_ref(&format!("prune/{i:05}"), "exec", 1)
            .await
            .map_err(store_error("put"))?;
    }
    let pruned = prune_branch_refs(registry, 64, |name| {
        name.strip_prefix("prune/")
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n % 2 == 0)
    })
    .await
    .map_err(store_error("prune"))?;
    expect_eq("prune deletes each match once", pruned, PRUNE_REFS / 2)?;
    let left = names(registry).await?;
    let kept: Vec<&String> = left.iter().filter(|n| n.starts_with("prune/")).collect();
    expect_eq("prune leaves every other ref", kept.len(), PRUNE_REFS / 2)?;
    if kept
        .iter()
        .any(|n| n[6..].parse::<usize>().unwrap_or(0) % 2 == 0)
    {
        return Err(fail("prune", "an even ref survived"));
    }
    Ok(())
}

//! Prints an upgrade step with its `@rerun`s written out
//! (`pgloom_core::sql::freeze`): run it on the step into the current
//! version before the parts move on to the next one
//! (docs/contributing.md), and commit its output in place of the step.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args_os()
        .nth(1)
        .ok_or("usage: freeze_step <loom-core/sql/steps/A--B.sql>")?;
    let step = std::fs::read_to_string(&path)?;
    print!("{}", pgloom_core::sql::freeze(&step)?);
    Ok(())
}

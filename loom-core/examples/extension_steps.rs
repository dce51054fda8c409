//! Writes the extension's upgrade steps from 0.12.0 on, each rendered for
//! the extension (`pgloom_core::sql::render_step`), as `loom--A--B.sql`
//! into the directory given (`make install` and `make package` run it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args_os()
        .nth(1)
        .ok_or("usage: extension_steps <directory>")?;
    for (from, to, sql) in pgloom_core::sql::STEPS {
        let rendered =
            pgloom_core::sql::render_step(sql, pgloom_core::sql::StepFlavour::Extension)?;
        let path = std::path::Path::new(&dir).join(format!("loom--{from}--{to}.sql"));
        std::fs::write(&path, rendered)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

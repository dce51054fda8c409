//! An upgrade step, written once for both flavours, rendered for one of
//! them.
//!
//! A step is SQL with three kinds of directive, each a comment, so that
//! PostgreSQL would read a rendered step the same with or without them:
//!
//! - `-- @native: why` ... `-- @end native`: what only the extension runs
//!   (C, an event trigger). The SQL-only flavour's update leaves it out.
//! - `-- @portable: why` ... `-- @end portable`: what only the SQL-only
//!   flavour runs: the PL/pgSQL body of a routine the extension has in C.
//!   The extension's step leaves it out.
//! - `-- @rerun <part>: <routine>, <routine>`: the routines' current
//!   definitions in that portable part, as `CREATE OR REPLACE`, with their
//!   `COMMENT ON`s, so a step that changes a body writes its name, not a
//!   copy of it. A routine a native part replaces with C is rerun in an
//!   `@portable` block. Only the step into [`super::VERSION`] may say it
//!   (the parts move on with the next version): [`freeze`] writes the
//!   routines out in place, and a unit test refuses a `@rerun` in any older
//!   step.
//!
//! ```
//! use pgloom_core::sql::{render_step, StepFlavour};
//! let step = "SELECT 1;\n-- @native: C\nSELECT 2;\n-- @end native\n";
//! assert_eq!(render_step(step, StepFlavour::SqlOnly).unwrap(), "SELECT 1;\n");
//! assert_eq!(render_step(step, StepFlavour::Extension).unwrap(), step);
//! ```

use super::{parts_of, Kind, SCHEMA_PLACEHOLDER};

/// Which flavour a step is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepFlavour {
    /// The extension (`ALTER EXTENSION loom UPDATE`): native blocks kept,
    /// portable blocks left out.
    Extension,
    /// The SQL-only flavour (`migrate --sql-only`): portable blocks kept,
    /// native blocks left out.
    SqlOnly,
}

/// A step that cannot be rendered: a directive that names nothing, or a
/// block left open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("upgrade step, line {line}: {problem}")]
pub struct StepError {
    /// The line of the directive (1-based).
    pub line: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// A kind of block: the line that opens it, the line that ends it, and the
/// flavour that keeps it.
#[derive(Clone, Copy)]
struct Block {
    begin: &'static str,
    end: &'static str,
    kept_by: StepFlavour,
}

const NATIVE: Block = Block {
    begin: "-- @native",
    end: "-- @end native",
    kept_by: StepFlavour::Extension,
};
const PORTABLE: Block = Block {
    begin: "-- @portable",
    end: "-- @end portable",
    kept_by: StepFlavour::SqlOnly,
};
const RERUN: &str = "-- @rerun ";

/// `step` for `flavour`: its blocks kept or left out, its `@rerun`s
/// expanded. The extension's `loom--A--B.sql` and the SQL-only update are
/// both this, of the same file.
///
/// # Errors
///
/// [`StepError`] for a block left open or nested, or a `@rerun` of a part
/// or routine that does not exist.
pub fn render_step(step: &str, flavour: StepFlavour) -> Result<String, StepError> {
    let mut out = String::new();
    let mut open: Option<(Block, usize)> = None;
    for (i, line) in step.lines().enumerate() {
        let at = i + 1;
        let error = |problem: String| StepError { line: at, problem };
        if let Some(directive) = line.strip_prefix(RERUN) {
            if open.is_some() {
                return Err(error("a @rerun inside a block".to_owned()));
            }
            out.push_str(&rerun(directive, flavour).map_err(error)?);
            continue;
        }
        // A block opens with its marker alone or followed by `: why`.
        let begins = [NATIVE, PORTABLE].into_iter().find(|block| {
            line.strip_prefix(block.begin)
                .is_some_and(|rest| rest.trim_end().is_empty() || rest.starts_with(':'))
        });
        let ends = line.starts_with("-- @end");
        if begins.is_none() && !ends && line.starts_with("-- @") {
            return Err(error(format!("unknown directive {}", line.trim_end())));
        }
        if let Some(block) = begins {
            if let Some((_, opened)) = open {
                return Err(error(format!(
                    "a block opened inside the block of line {opened}"
                )));
            }
            open = Some((block, at));
        }
        if open.is_none_or(|(block, _)| block.kept_by == flavour) {
            out.push_str(line);
            out.push('\n');
        }
        match open {
            Some((block, _)) if line.trim_end() == block.end => open = None,
            Some((block, _)) if ends => {
                return Err(error(format!(
                    "{} ends a block opened as {}",
                    line.trim_end(),
                    block.begin
                )))
            }
            None if ends => return Err(error(format!("{} ends no block", line.trim_end()))),
            _ => {}
        }
    }
    match open {
        Some((block, opened)) => Err(StepError {
            line: opened,
            problem: format!("{} is never ended", block.begin),
        }),
        None => Ok(out),
    }
}

/// `step` with each `@rerun` written out as the routines it names are now,
/// for both flavours (a routine the extension has in C in a `@portable`
/// block): what the step into a version becomes once the parts move on to
/// the next one.
///
/// # Errors
///
/// As [`render_step`].
pub fn freeze(step: &str) -> Result<String, StepError> {
    let mut out = String::new();
    for (i, line) in step.lines().enumerate() {
        match line.strip_prefix(RERUN) {
            Some(directive) => {
                out.push_str(&format!("-- (was: {})\n", line.trim_start_matches("-- ")));
                out.push_str(&rerun(directive, StepFlavour::SqlOnly).map_err(|problem| {
                    StepError {
                        line: i + 1,
                        problem,
                    }
                })?);
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(out)
}

/// The statements `part: name, name` stands for, in `flavour`.
fn rerun(directive: &str, flavour: StepFlavour) -> Result<String, String> {
    let (part_name, names) = directive
        .split_once(':')
        .ok_or_else(|| format!("@rerun {directive}: expected `<part>: <routine>, ...`"))?;
    let part = parts_of(Kind::Portable)
        .find(|part| part.name == part_name.trim())
        .ok_or_else(|| format!("@rerun names no portable part {:?}", part_name.trim()))?;
    let statements = top_level_statements(part.sql);
    let mut out = String::new();
    for name in names.split(',').map(str::trim) {
        let create = [
            format!("CREATE FUNCTION {SCHEMA_PLACEHOLDER}.{name}("),
            format!("CREATE PROCEDURE {SCHEMA_PLACEHOLDER}.{name}("),
        ];
        let comment = [
            format!("COMMENT ON FUNCTION {SCHEMA_PLACEHOLDER}.{name}("),
            format!("COMMENT ON PROCEDURE {SCHEMA_PLACEHOLDER}.{name}("),
        ];
        let mut found = false;
        for statement in &statements {
            if create.iter().any(|c| statement.starts_with(c.as_str())) {
                found = true;
                let replaced = statement.replacen("CREATE ", "CREATE OR REPLACE ", 1);
                let header = replaced.lines().next().unwrap_or_default();
                if native_restates(header) {
                    // The extension's is C: its step leaves the body out.
                    if flavour == StepFlavour::SqlOnly {
                        out.push_str(&format!(
                            "{}: {name}'s body, which the extension has in C\n{replaced}{}\n",
                            PORTABLE.begin, PORTABLE.end
                        ));
                    }
                } else {
                    out.push_str(&replaced);
                }
            } else if comment.iter().any(|c| statement.starts_with(c.as_str())) {
                // A comment a native part restates is the extension's own.
                let first = statement.lines().next().unwrap_or_default();
                if flavour == StepFlavour::SqlOnly || !native_restates(first) {
                    out.push_str(statement);
                }
            }
        }
        if !found {
            return Err(format!(
                "@rerun: part {} creates no routine {name:?}",
                part.name
            ));
        }
    }
    Ok(out)
}

/// Whether a native part has the line `line`: a `CREATE OR REPLACE`
/// header, when it replaces that routine with C; a `COMMENT ON` line, when
/// it restates that comment.
fn native_restates(line: &str) -> bool {
    parts_of(Kind::Native).any(|part| part.sql.lines().any(|l| l == line))
}

/// A part's top-level statements, each with its trailing newline: a
/// statement starts at column 0 (bodies are indented, the rule
/// `sql_only_body` already keeps) and runs to the line that ends it with
/// `;` outside any dollar-quoted body.
fn top_level_statements(sql: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut quote: Option<String> = None;
    for line in sql.lines() {
        if current.is_empty() && (line.is_empty() || line.starts_with("--")) {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        let mut rest = line;
        while let Some(start) = rest.find('$') {
            let after = &rest[start + 1..];
            let Some(len) = after.find('$') else { break };
            let tag = &rest[start..start + len + 2];
            let is_tag = tag[1..tag.len() - 1]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
            if is_tag {
                quote = match quote {
                    Some(open) if open == tag => None,
                    None => Some(tag.to_owned()),
                    other => other,
                };
                rest = &rest[start + tag.len()..];
            } else {
                rest = after;
            }
        }
        if quote.is_none() && line.trim_end().ends_with(';') {
            statements.push(std::mem::take(&mut current));
        }
    }
    statements
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::PARTS;

    #[test]
    fn blocks_go_to_their_flavour_and_a_bad_block_is_an_error() {
        let step =
            "A;\n-- @native: c\nB;\n-- @end native\n-- @portable: pl\nC;\n-- @end portable\nD;\n";
        assert_eq!(
            render_step(step, StepFlavour::Extension).unwrap(),
            "A;\n-- @native: c\nB;\n-- @end native\nD;\n"
        );
        assert_eq!(
            render_step(step, StepFlavour::SqlOnly).unwrap(),
            "A;\n-- @portable: pl\nC;\n-- @end portable\nD;\n"
        );
        for (bad, line) in [
            ("-- @native: x\nB;\n", 1),
            (
                "-- @native: x\n-- @portable: y\n-- @end portable\n-- @end native\n",
                2,
            ),
            ("-- @native: x\n-- @end portable\n", 2),
            ("A;\n-- @end native\n", 2),
            ("-- @rerun nowhere: loom_status\n", 1),
            ("-- @rerun status: loom_nothing\n", 1),
            ("-- @rerun status\n", 1),
            ("-- @natively: x\nB;\n", 1),
            ("A;\n-- @end native\n-- @native: x\nB;\n", 2),
        ] {
            let err = render_step(bad, StepFlavour::SqlOnly).unwrap_err();
            assert_eq!(err.line, line, "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_rerun_is_the_parts_routine_as_create_or_replace_with_its_comment() {
        let sql_only = render_step(
            "-- @rerun log_api: loom_append_event\n",
            StepFlavour::SqlOnly,
        )
        .unwrap();
        assert!(sql_only.contains("CREATE OR REPLACE FUNCTION @extschema@.loom_append_event("));
        assert!(sql_only.contains("COMMENT ON FUNCTION @extschema@.loom_append_event("));
        // The extension's append is C (native/write_path.sql): its step
        // leaves the PL/pgSQL body out, and keeps the comment.
        let extension = render_step(
            "-- @rerun log_api: loom_append_event\n",
            StepFlavour::Extension,
        )
        .unwrap();
        assert!(!extension.contains("CREATE OR REPLACE"), "{extension}");
        assert!(extension.contains("COMMENT ON FUNCTION @extschema@.loom_append_event("));
        // One that is PL/pgSQL in both.
        let both = render_step(
            "-- @rerun collation_migration: loom_ensure_event_metadata\n",
            StepFlavour::Extension,
        )
        .unwrap();
        assert!(
            both.starts_with("CREATE OR REPLACE FUNCTION @extschema@.loom_ensure_event_metadata(")
        );
        assert!(both.trim_end().ends_with(';'));
    }

    #[test]
    fn every_part_splits_into_whole_statements() {
        for part in PARTS {
            let statements = top_level_statements(part.sql);
            assert!(!statements.is_empty(), "{}", part.name);
            for statement in &statements {
                let first = statement.lines().next().unwrap();
                assert!(
                    !first.starts_with(' ') && !first.starts_with('$'),
                    "{}: a statement starts inside another: {first}",
                    part.name
                );
            }
            // Nothing but comments and blank lines is left between them.
            let kept: usize = statements.iter().map(|s| s.lines().count()).sum();
            let code = part
                .sql
                .lines()
                .filter(|l| !l.is_empty() && !l.starts_with("--"))
                .count();
            assert!(
                kept >= code,
                "{}: {kept} of {code} lines in statements",
                part.name
            );
        }
    }

    #[test]
    fn freezing_writes_the_routines_out_for_both_flavours() {
        let step = "-- @rerun log_api: loom_append_event\n";
        let frozen = freeze(step).unwrap();
        assert!(!frozen.contains("\n-- @rerun"));
        assert_eq!(
            render_step(&frozen, StepFlavour::SqlOnly)
                .unwrap()
                .replace("-- (was: @rerun log_api: loom_append_event)\n", ""),
            render_step(step, StepFlavour::SqlOnly).unwrap()
        );
        assert_eq!(
            render_step(&frozen, StepFlavour::Extension)
                .unwrap()
                .replace("-- (was: @rerun log_api: loom_append_event)\n", ""),
            render_step(step, StepFlavour::Extension).unwrap()
        );
    }
}

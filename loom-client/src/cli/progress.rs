//! The progress bar of the long commands (retention, repair): a spinner
//! with counts on stderr when it is a terminal, nothing otherwise (their
//! summary line, on stdout, says it all).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner with counts on stderr when it is a terminal; nothing
/// otherwise (the summary line says it all).
#[derive(Clone)]
pub(super) struct Bar(Option<ProgressBar>);

impl Bar {
    pub(super) fn new() -> Self {
        if !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Bar(Some(bar))
    }

    pub(super) fn show(&self, message: impl FnOnce() -> String) {
        if let Some(bar) = &self.0 {
            bar.set_message(message());
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

//! Progress on stderr for the commands that can run longer than a moment (`simulate`, `replay`,
//! `experiment`, `bench`, `policy bench`): a bar redrawn in place on a terminal; nothing when stderr is not a terminal
//! (log files, CI) or with `--quiet`, so output that is kept stays exactly the report.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar, or nothing.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// `total` steps of `what` (e.g. "pods"), drawn unless `quiet` or stderr is not a terminal.
    pub fn new(total: u64, what: &str, quiet: bool) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(8));
        let template = format!("[{{bar:30}}] {{human_pos}}/{{human_len}} {what}, {{elapsed}} elapsed, ~{{eta}} left");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("#>-"));
        }
        Progress(Some(bar))
    }

    /// One more step done.
    pub fn step(&self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }

    /// Run `f` (which prints to the terminal) with the bar hidden, so the two never interleave.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.0 {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// `done` steps done so far.
    pub fn at(&self, done: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(done);
        }
    }
}

impl Drop for Progress {
    /// The bar is cleared, so the report that follows starts on a clean line.
    fn drop(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish_and_clear();
        }
    }
}

//! A progress bar on a terminal (stderr); nothing otherwise.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// The invocation's progress: runs done, and the current run's jobs.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar over `runs` runs when stderr is a terminal.
    pub fn new(runs: usize) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(runs as u64);
            let style =
                ProgressStyle::with_template("{elapsed_precise} [{bar:30}] run {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        Progress { bar }
    }

    /// Says which run is going.
    pub fn start(&self, what: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(what.to_string());
        }
    }

    /// The current run's jobs done out of `total`.
    pub fn jobs(&self, what: &str, done: u64, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!("{what}: {done}/{total} jobs"));
        }
    }

    /// One run finished.
    pub fn finished(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Removes the bar.
    pub fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

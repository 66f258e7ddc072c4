//! Gated or ungated: a leaf the arguments and the plan both name.

use serde::Serialize;

/// Gated or ungated dequeue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// K advisory-lock slots per shard.
    Gated,
    /// Plain SKIP LOCKED.
    Ungated,
}

impl Mode {
    /// `gated` / `ungated`, as `SHARDQ_DEQUEUE__MODE` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Gated => "gated",
            Mode::Ungated => "ungated",
        }
    }
}

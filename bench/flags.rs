//! Command-line flags shared by the benchmark programs (`--name N`).

use anyhow::{Context, Result};

/// The whole number after `name` in `args`, or `default` when absent.
pub fn flag(args: &[String], name: &str, default: usize) -> Result<usize> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .context(format!("{name} needs a value"))?
            .parse()
            .context(format!("{name} must be a whole number")),
        None => Ok(default),
    }
}

//! `shardq bench …` and `shardq chaos …`: the benchmarks and the chaos run
//! live in the `shardq-bench` binary (crate `bench/`), which
//! `cargo build --workspace` puts next to this one; it runs in place of this
//! process, so signals and the exit status are its own.

use anyhow::{anyhow, bail, Result};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// The binary that holds the benchmarks and the chaos run.
const BENCH_BINARY: &str = "shardq-bench";

/// Replaces this process with `shardq-bench [--config FILE] [subcommand] args…`.
/// Returns only when that fails.
pub fn exec(config: Option<&Path>, subcommand: Option<&str>, args: Vec<OsString>) -> Result<()> {
    let exe = std::env::current_exe()?.with_file_name(BENCH_BINARY);
    if !exe.is_file() {
        bail!(
            "{BENCH_BINARY} is not built next to shardq (looked for {}): run \
             `cargo build --release --workspace`, or run it directly with \
             `cargo run --release --bin {BENCH_BINARY} -- …`",
            exe.display()
        );
    }
    let mut command = Command::new(&exe);
    if let Some(path) = config {
        command.arg("--config").arg(path);
    }
    let err = command.args(subcommand).args(args).exec();
    Err(anyhow!(err).context(format!("cannot run {}", exe.display())))
}

//! Where the workspace's binaries are: next to the running executable (a
//! binary in `target/<profile>/`), or one folder up (a test in
//! `target/<profile>/deps/`). A plain `cargo test` at the workspace root
//! builds every member's binaries before it runs a test.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The path of the workspace binary `name` built with the same profile as
/// the running executable.
///
/// # Errors
///
/// When it is not built, with the command that builds it.
pub fn binary(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find the running executable")?;
    let dir = me
        .parent()
        .context("the running executable has no folder")?;
    let candidates = [Some(dir), dir.parent()];
    for folder in candidates.into_iter().flatten() {
        let path = folder.join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "`{name}` is not built next to {}: run `cargo build --workspace` \
         (add --release for a release build)",
        me.display()
    )
}

/// The `shardq` binary; panics with the command that builds it when it is
/// missing (for tests).
pub fn shardq() -> PathBuf {
    binary("shardq").unwrap_or_else(|e| panic!("{e:#}"))
}

/// `shardq --config <config>`, logging warnings only and killed if dropped,
/// so that a test that fails leaves no process behind.
pub fn shardq_command(config: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(shardq());
    command
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    command
}

/// Runs `shardq --config <config> <args>` to its end: whether it exited 0,
/// and its stdout then stderr as one text.
///
/// # Panics
///
/// When the binary cannot be started.
pub async fn shardq_output(config: &Path, args: &[&str]) -> (bool, String) {
    let out = shardq_command(config)
        .args(args)
        .output()
        .await
        .expect("shardq runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

//! The `shardq` command's surface, without a database. Also makes a plain
//! `cargo test` at the workspace root build the `shardq` binary, which the
//! root package's integration tests run.

use std::process::{Command, Output};

fn shardq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardq"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run shardq")
}

#[test]
fn help_lists_the_commands() {
    let out = shardq(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for command in [
        "demo", "local", "migrate", "enqueue", "worker", "job", "status", "shards", "bench",
        "chaos",
    ] {
        assert!(text.contains(command), "`{command}` missing from:\n{text}");
    }
}

#[test]
fn chaos_runs_shardq_bench_or_says_how_to_build_it() {
    let out = shardq(&["chaos", "--help"]);
    let built = std::path::Path::new(env!("CARGO_BIN_EXE_shardq"))
        .with_file_name("shardq-bench")
        .is_file();
    if built {
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("--duration-s"));
    } else {
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("cargo build --release --workspace"));
    }
}

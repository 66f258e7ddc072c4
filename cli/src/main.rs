//! The `shardq` command.

mod args;
mod commands;
mod forward;
mod rate;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,shardq=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = args::Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => match err.downcast_ref::<commands::check::Verdict>() {
            // The report is printed; the verdict is its last line.
            Some(verdict) => {
                eprintln!("{verdict}");
                ExitCode::from(verdict.code)
            }
            None => {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            }
        },
    }
}

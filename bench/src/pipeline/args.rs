//! Flags of `shardq-bench pipeline`.

use clap::Args;
use std::path::PathBuf;

/// Flags of `shardq-bench pipeline`.
#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Jobs per ceiling run and for the pipelined worker run.
    #[arg(long, default_value_t = 200_000)]
    pub jobs: usize,
    /// Jobs for the serial baseline run (smaller: it is slow).
    #[arg(long, default_value_t = 10_000)]
    pub serial_jobs: usize,
    /// When > 0, an extra pipelined run draining this many jobs, only to
    /// report the worker's peak memory (e.g. 1000000).
    #[arg(long, default_value_t = 0)]
    pub memory_jobs: usize,
    /// After the measured runs, one more pipelined run with every statement
    /// (nested ones too) counted by pg_stat_statements: where the database
    /// time goes, per statement.
    #[arg(long)]
    pub profile: bool,
    /// Sets the job table's fillfactor before the runs (the migrations set
    /// 40): to measure another page layout side by side with the same build,
    /// e.g. 70, what migration 0010 changed.
    #[arg(long, value_parser = clap::value_parser!(u8).range(10..=100))]
    pub table_fillfactor: Option<u8>,
    /// Where the JSON results go (folders are created).
    #[arg(long, default_value = "bench/results/pipeline.json")]
    pub out: PathBuf,
}

#![doc = include_str!("../README.md")]
//!
//! ## In this documentation
//!
//! Start at [`Shardq`]: from a [`Config`] to a migrated shard set, a
//! [`Client`] that enqueues and reads jobs, and [`Worker`]s that run your
//! [`HandlerRegistry`]'s handlers. The guides named above live in the
//! repository's `docs/` folder.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod client;
pub mod config;
pub mod job;
mod map_load;
pub mod migrate;
pub mod prometheus;
pub mod router;
pub mod schedule;
mod session;
pub mod shards;
mod telemetry;
pub mod tls;
pub mod worker;

mod app;
mod debounce;
mod error_chain;
mod heartbeat;
mod job_args;
mod job_debounce;
mod job_status;
mod job_timeout;
mod lent;

// Operator tooling follows the schema and the CLI, not semver: crate-private
// for users, opened (undocumented) to this workspace's CLI, dashboard,
// benchmarks and tests by the `internal` feature, at their usual paths
// (`shardq::store::…`, `shardq::reshard::…`). The same pattern gates the
// operator items of the public modules in place (`client::CheckReport`,
// `migrate::migrate_shard`, `prometheus::backlog`, ...). Without the feature
// what only those tools call is unused, hence the `allow`s.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod reshard;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod reshard;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod shard_map;
#[cfg(not(feature = "internal"))]
#[allow(unreachable_pub)]
mod shard_map;
// The driver layer.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod store;
#[cfg(not(feature = "internal"))]
#[allow(unreachable_pub)]
mod store;

pub use app::Shardq;
pub use client::{Client, ClientError, ErrorKind, JobInfo, JobOutcome, PausedQueue, RoutedJob};
pub use config::{Config, ConfigError};
pub use error_chain::error_chain;
pub use job::{ChildPolicy, InvalidJob, JobId, JobStatus, NewJob, OnDuplicate};
pub use job_args::{ArgsError, JobArgs};
pub use migrate::MigrateError;
pub use schedule::{Missed, Schedule, ScheduleError};
pub use shards::{ShardError, ShardSet};
pub use worker::{
    ChildError, ChildHandle, ChildResult, HandlerError, HandlerRegistry, HandlerResult, JobContext,
    PermanentFailure, StepError, Worker, WorkerReport,
};

/// The PostgreSQL driver and pool whose types shardq's signatures carry
/// (`Shard::user_client`; `RoutedJob::insert` in your own transaction): use these paths, and
/// your types are always the versions shardq was built with.
#[doc(no_inline)]
pub use deadpool_postgres;
#[doc(no_inline)]
pub use tokio_postgres;

/// This library's version (`CARGO_PKG_VERSION`), e.g. for a worker's report
/// or a `--version` line.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

//! shardq: a durable job and workflow queue on sharded PostgreSQL.
//!
//! Workers rotate over the shards; on each one they take one of a few
//! advisory-lock dequeue slots and claim a batch with `FOR UPDATE SKIP LOCKED`,
//! or move on at once when no slot is free. Start at [`Shardq`]: from a
//! [`Config`] to a migrated shard set, a [`Client`] and [`Worker`]s. See
//! README.md for the guarantees and the architecture.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod job;
pub mod local;
pub mod migrate;
pub mod prometheus;
pub mod router;
pub mod schedule;
pub mod session;
pub mod shards;
pub mod store;
mod telemetry;
pub mod tls;
pub mod worker;

mod app;
mod error_chain;
mod heartbeat;
mod lent;

pub use app::Shardq;
pub use client::{Client, ClientError, JobInfo, JobOutcome, PausedQueue, RoutedJob};
pub use config::{Config, ConfigError};
pub use error_chain::error_chain;
pub use job::{InvalidJob, JobId, NewJob, OnDuplicate};
pub use migrate::MigrateError;
pub use schedule::{Missed, Schedule, ScheduleError};
pub use shards::{ShardError, ShardSet};
pub use store::{ErrorKind, JobStatus};
pub use worker::{
    HandlerError, HandlerRegistry, HandlerResult, JobContext, StepError, Worker, WorkerReport,
};

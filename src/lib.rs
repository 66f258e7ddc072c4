//! shardq: a durable job and workflow queue on sharded PostgreSQL.
//!
//! Workers rotate over the shards; on each one they take one of a few
//! advisory-lock dequeue slots and claim a batch with `FOR UPDATE SKIP LOCKED`,
//! or move on at once when no slot is free. See README.md and DESIGN notes.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod job;
pub mod local;
pub mod migrate;
pub mod router;
pub mod shards;
pub mod store;
pub mod tls;
pub mod worker;

pub use client::{Client, ClientError};
pub use config::{Config, ConfigError};
pub use job::{JobId, NewJob, OnDuplicate};
pub use worker::{HandlerRegistry, JobContext, StepError, Worker, WorkerReport};

/// Formats an error with all its causes, `outer: cause: cause`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

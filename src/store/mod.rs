//! The driver layer: every statement shardq runs, its parameters and the
//! decoding of its rows. Nothing outside `store/` touches SQL text or a
//! `tokio_postgres::Row`.
//!
//! Operations are named noun first and take the shard plus a params struct
//! or the one value they need: [`jobs::claim`], [`jobs::complete_many`],
//! [`upkeep::recover_expired`], [`steps::record`], [`queues::counts`]. Each
//! runs one statement, or one transaction, under the shard's deadline
//! (`database.statement_timeout_ms`). Failures are [`ShardError`]s; ask
//! [`ShardError::kind`] what they mean.
//!
//! This module is public for tests and tools that drive the queue step by
//! step (two claims interleaved, a completion replayed); it follows the
//! schema, not semver.
//!
//! [`ShardError`]: crate::shards::ShardError
//! [`ShardError::kind`]: crate::shards::ShardError::kind

pub mod backlog;
pub mod browse;
pub mod cancel_cascade;
pub mod cascade_debts;
pub mod cascades_owed;
pub mod check;
mod check_job_state;
pub mod children;
pub mod children_elsewhere;
pub mod deadlines;
mod error;
pub mod events;
mod exec;
pub mod failures;
pub(crate) mod floors;
pub mod horizon;
pub mod jobs;
pub mod limits;
pub mod locks;
pub mod map;
pub mod messages;
pub mod queues;
pub mod reshard;
pub mod schedules;
pub mod schema;
pub mod sql;
pub mod steps;
pub mod upkeep;
pub mod workers;

pub use crate::job_status::JobStatus;
pub use error::ErrorKind;
pub(crate) use error::MOVE_NOT_OPEN;

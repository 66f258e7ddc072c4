//! A debounce's settings ([`crate::NewJob::debounce`]): a leaf that the
//! job module re-exports; the builder and its checks are in
//! `job_debounce.rs`.

use std::time::Duration;

/// Longest debounce key, in bytes: indexed with its queue, as an ordering
/// key is (see [`crate::job::MAX_QUEUE_BYTES`]).
pub const MAX_DEBOUNCE_KEY_BYTES: usize = 1024;

/// The longest `max_wait` of a debounce: a year. The run's time is the
/// shard's clock plus it, which PostgreSQL's timestamps hold for any
/// sensible value; a longer wait is a mistake (a unit off), not a plan.
pub const MAX_DEBOUNCE_WAIT: Duration = Duration::from_secs(366 * 24 * 3600);

/// A job's debounce ([`crate::NewJob::debounce`]): enqueues of its queue
/// with the same key, while a run of it is pending, update that run
/// instead of adding one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debounce {
    /// The debounce key (per queue). It routes the job: a key's enqueues
    /// all go to one shard.
    pub key: String,
    /// The run starts this long after the last enqueue of a burst…
    pub period: Duration,
    /// …but no later than this long after its first.
    pub max_wait: Duration,
}

//! An enqueue whose ids are taken but whose rows may not all be written:
//! what a lost reply leaves the caller to send again. A leaf below the
//! error and the enqueue.

use crate::job::{JobId, NewJob};

/// An enqueue whose jobs have their ids but may not all be written: what
/// [`ClientError::OutcomeUnknown`](super::ClientError::OutcomeUnknown) carries. Pass it to
/// [`Client::enqueue_again`](super::Client::enqueue_again), as often as needed: each of its jobs is
/// written exactly once.
#[derive(Debug, Clone)]
pub struct PendingEnqueue {
    /// Jobs in the call.
    pub(super) total: usize,
    /// The epoch of the shard map the jobs were routed by: every insert is
    /// fenced by it (`shardq_check_route`).
    pub(super) epoch: i32,
    /// The jobs of each shard that has some, in input order.
    pub(super) parts: Vec<(usize, Vec<Reserved>)>,
}

/// A routed job and the id it is written under.
#[derive(Debug, Clone)]
pub(super) struct Reserved {
    /// Position in the call.
    pub(super) index: usize,
    pub(super) shard_key: i32,
    pub(super) job: NewJob,
    pub(super) id: i64,
}

impl Reserved {
    pub(super) fn job_id(&self) -> JobId {
        JobId {
            shard_key: self.shard_key,
            id: self.id,
        }
    }
}

impl PendingEnqueue {
    /// How many jobs the call enqueues.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the call enqueues no job.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

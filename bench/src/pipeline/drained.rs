//! What a statement-ceiling drain measures, whichever statements it runs
//! (shardq's in `ceiling`, the least a queue can do in `minimal`).

use std::time::Duration;

/// Jobs per claim statement (the batch at which 2 clients reached ~70k jobs/s
/// in shared/experiments/gating).
pub const BATCH: u32 = 1_000;

/// What one dequeuer loop did.
#[derive(Debug, Default)]
pub struct Drained {
    pub jobs: u64,
    pub claims: u32,
    pub claim_time: Duration,
    pub completes: u32,
    pub complete_time: Duration,
}

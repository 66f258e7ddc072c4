//! One run of a worker: what every role of it uses.

use super::permits::Permits;
use super::running::{LostClaims, RunningJobs};
use super::shard_health::ShardHealth;
use crate::shards::ShardSet;
use crate::telemetry::Stats;
use std::sync::Arc;

/// One run of a worker, as every role of it sees it: who it is on the
/// shards (`owner`), the shards, its telemetry, the jobs it holds and the
/// claims whose replies it lost. Each role's own settings and handles
/// (producers: gate and credits; completer: credits; ...) are given to it
/// alone.
pub(crate) struct WorkerRun {
    pub shards: ShardSet,
    /// Unique per worker run; written on claimed rows; fences completions.
    pub owner: Arc<str>,
    pub stats: Arc<Stats>,
    /// Every job this process holds, from its claim until its outcome is written.
    pub running: RunningJobs,
    /// Claims that may have run without their reply (producers note them,
    /// the leaser gives back what they left this process owning).
    pub lost_claims: LostClaims,
    /// Per shard: how long a claim may keep a producer, whether producers
    /// skip it, and whether the slots set its jobs aside.
    pub health: ShardHealth,
    /// Permits of the queues with a fleet-wide concurrency limit.
    pub permits: Arc<Permits>,
}

/// What a worker run knows of each shard's answers, as a handler's context
/// asks it: whether a shard does not answer at all, so that a call there
/// parks at once instead of holding its slot until the statement deadline.
#[derive(Clone)]
pub(crate) struct ShardAnswers(pub(crate) std::sync::Arc<WorkerRun>);

/// How often a call in flight to another shard looks whether that shard
/// has fallen silent meanwhile.
const SILENCE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl ShardAnswers {
    /// See [`super::shard_health::Health::silent`].
    pub(crate) fn silent(&self, shard: usize) -> bool {
        self.0.health.silent(shard)
    }

    /// How long this process has found shard `shard` not answering in
    /// time (its claims there late or failing): zero while it answers.
    pub(crate) fn unanswering_for(&self, shard: usize) -> std::time::Duration {
        self.0.health.suspect_for(shard)
    }

    /// Resolves once shard `shard` is silent (looked at every
    /// [`SILENCE_POLL`]).
    pub(crate) async fn until_silent(&self, shard: usize) {
        while !self.silent(shard) {
            tokio::time::sleep(SILENCE_POLL).await;
        }
    }
}

impl std::fmt::Debug for ShardAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardAnswers")
    }
}

//! How deep each queue is on a shard: its unfinished jobs counted by state,
//! and how long its oldest ready job has waited. The one read of queue depth:
//! the metrics exporter, `shardq status`, the dashboard and
//! `Client::depth` all go through [`read`].

use super::exec;
use super::sql;
use crate::shards::{Shard, ShardError};
use std::collections::BTreeMap;
use tokio_postgres::types::Type;

/// A queue's unfinished jobs, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StateCounts {
    /// Ready to be claimed (`queued`).
    pub queued: i64,
    /// Keyed, parked behind the running or retrying job of their key.
    pub waiting: i64,
    /// Scheduled again after a failed attempt, waiting out the backoff.
    pub retrying: i64,
    /// Scheduled for later, never attempted.
    pub delayed: i64,
    /// Workflows parked until a durable sleep ends or what they wait for
    /// (a message, a child) arrives: they hold no slot, lease or permit.
    pub parked: i64,
    /// Claimed by a worker, under a lease.
    pub running: i64,
}

impl StateCounts {
    /// The state names, in the order of [`StateCounts::counts`]: the labels
    /// of the metrics and the rows of `shardq status`.
    pub const STATES: [&'static str; 6] = [
        "queued", "waiting", "retrying", "delayed", "parked", "running",
    ];

    /// The counts, in the order of [`StateCounts::STATES`].
    pub fn counts(&self) -> [i64; 6] {
        [
            self.queued,
            self.waiting,
            self.retrying,
            self.delayed,
            self.parked,
            self.running,
        ]
    }

    /// All unfinished jobs.
    pub fn total(&self) -> i64 {
        self.counts().iter().sum()
    }

    /// Adds `other`'s counts (another shard's, say).
    pub fn add(&mut self, other: &StateCounts) {
        self.queued += other.queued;
        self.waiting += other.waiting;
        self.retrying += other.retrying;
        self.delayed += other.delayed;
        self.parked += other.parked;
        self.running += other.running;
    }

    /// The count of state `state` (one of [`StateCounts::STATES`]).
    fn slot(&mut self, state: &str) -> &mut i64 {
        match state {
            "queued" => &mut self.queued,
            "waiting" => &mut self.waiting,
            "retrying" => &mut self.retrying,
            "delayed" => &mut self.delayed,
            "parked" => &mut self.parked,
            "running" => &mut self.running,
            other => panic!("unknown backlog state `{other}` from QUEUE_BACKLOG"),
        }
    }
}

/// One queue's backlog on one shard.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueBacklog {
    /// Queue.
    pub queue: String,
    /// Its unfinished jobs by state.
    pub depth: StateCounts,
    /// Seconds since the first ready job (the first to be claimed) of the
    /// queue's longest-waiting priority and kind became due: the oldest
    /// `run_at` among those first jobs, by the shard's clock; `None` when
    /// none is ready. A job made ready again (recovered, promoted behind
    /// its key) keeps its `run_at` but takes its place at the end.
    pub oldest_ready_s: Option<f64>,
}

/// The backlog of every queue with an unfinished job on `shard` (only of
/// `queue` when given), sorted by queue, in one statement
/// ([`sql::QUEUE_BACKLOG`]) that reads only partial indexes of unfinished
/// jobs: finished rows cost it nothing.
///
/// # Errors
///
/// [`ShardError`] when the shard fails or passes its statement deadline.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn read(shard: &Shard, queue: Option<&str>) -> Result<Vec<QueueBacklog>, ShardError> {
    let rows = exec::query(shard, sql::QUEUE_BACKLOG, &[(&queue, Type::TEXT)]).await?;
    let mut out: BTreeMap<String, QueueBacklog> = BTreeMap::new();
    for r in &rows {
        let name: String = r.get("queue");
        let entry = out.entry(name.clone()).or_insert_with(|| QueueBacklog {
            queue: name,
            depth: StateCounts::default(),
            oldest_ready_s: None,
        });
        *entry.depth.slot(r.get("state")) += r.get::<_, i64>("count");
        if let Some(age) = r.get::<_, Option<f64>>("oldest_ready_s") {
            entry.oldest_ready_s = Some(age);
        }
    }
    Ok(out.into_values().collect())
}

//! What the reshard run shares between its parts: its queue, what it saw
//! ([`Summary`]) and the jobs it finds on the shards ([`Found`]). A leaf:
//! it imports nothing of the run.

use shardq::job::JobId;

/// The queue of the run.
pub const QUEUE: &str = "reshard";

/// What the run saw; printed, and judged by `verify`.
#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    pub moves: Vec<f64>,
    pub move_errors: Vec<String>,
    pub enqueued: usize,
    pub lost_replies: u64,
    /// Blackouts: a shard's insert replies all lost for longer than the
    /// client retries.
    pub blackouts: u64,
    /// Enqueues that ended `OutcomeUnknown` (each settled, or a failure).
    pub unknown_outcomes: u64,
    /// Calls of `enqueue_again` that settling took.
    pub settled_again: u64,
    /// Deduplicated jobs enqueued again while held: refused, answered
    /// with the first job's id, answered too late to judge (written as a
    /// job of its own).
    pub dedup_refused: u64,
    pub dedup_existing: u64,
    pub dedup_unjudged: u64,
    pub workers_killed: u64,
    /// Of those, old-list workers killed as a shrink began.
    pub killed_before_shrink: u64,
    pub limit_changes: u64,
    pub samples: u64,
    pub failures: Vec<String>,
    /// Jobs the shard that left held when it was emptied to join again:
    /// finished there, counted by the checks (written as their number).
    #[serde(serialize_with = "count")]
    pub archived: Vec<Found>,
    /// Seconds from the end of the fault phase until every job succeeded.
    pub drain_s: f64,
}

fn count<S: serde::Serializer>(found: &[Found], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(found.len() as u64)
}

/// One of the run's jobs found on a shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Found {
    /// Payload `u`: the job's number.
    pub u: u64,
    /// `succeeded`, another final state, or `unfinished`.
    pub status: String,
    pub dedup_id: Option<String>,
    /// The shard's name.
    pub at: String,
    #[serde(serialize_with = "as_text")]
    pub id: JobId,
}

impl Found {
    /// A row of `sql::JOBS` on shard `at`.
    pub fn from_row(row: &tokio_postgres::Row, at: &str) -> Found {
        Found {
            u: row.get::<_, Option<i64>>("u").unwrap_or(-1) as u64,
            status: row.get("status"),
            dedup_id: row.get("dedup_id"),
            at: at.to_string(),
            id: JobId {
                shard_key: row.get("shard_key"),
                id: row.get("id"),
            },
        }
    }
}

fn as_text<S: serde::Serializer>(id: &JobId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

//! Claiming a batch of ready jobs.

use super::super::{locks, sql};
use crate::config::DequeueMode;
use crate::job::{ClaimedJob, JobId};
use crate::shards::{Shard, ShardError};
use std::time::Duration;
use tokio_postgres::types::Type;

/// What a claim attempt found.
#[derive(Debug)]
pub enum Claim {
    /// Jobs claimed (at least one).
    Jobs(Vec<ClaimedJob>),
    /// Every dequeue slot was taken: try another shard.
    Busy,
    /// A slot was free but no job was ready.
    Empty,
    /// Fewer jobs than asked (these, maybe none) while grouped jobs stay
    /// ready: their groups' limits held some back, or a concurrent claim
    /// had their groups' heads. More may start soon, with no wake-up to
    /// say so.
    HeldBack(Vec<ClaimedJob>),
}

impl Claim {
    /// The jobs this claim took (none when busy or empty).
    pub fn jobs(&self) -> &[ClaimedJob] {
        match self {
            Claim::Jobs(jobs) | Claim::HeldBack(jobs) => jobs,
            Claim::Busy | Claim::Empty => &[],
        }
    }

    /// The jobs this claim took, owned.
    pub fn into_jobs(self) -> Vec<ClaimedJob> {
        match self {
            Claim::Jobs(jobs) | Claim::HeldBack(jobs) => jobs,
            Claim::Busy | Claim::Empty => Vec::new(),
        }
    }

    /// Whether ready jobs stayed behind for their groups' limits (more may
    /// start soon, with no wake-up to say so).
    pub fn held_back(&self) -> bool {
        matches!(self, Claim::HeldBack(_))
    }
}

/// `got_slot` of a claim some of whose ready jobs their groups' limits held back.
const HELD_BACK: i32 = 2;

/// One claim request.
#[derive(Debug, Clone, Copy)]
pub struct ClaimParams<'a> {
    /// Queue.
    pub queue: &'a str,
    /// Most jobs to take.
    pub limit: u32,
    /// Owner written on the rows (fences completions).
    pub owner: &'a str,
    /// Lease length.
    pub lease: Duration,
    /// Gated or not.
    pub mode: DequeueMode,
}

/// Claims up to `p.limit` ready jobs of `p.queue` on `shard`, in one round
/// trip ([`sql::JOB_CLAIM`]). The jobs' [`ClaimedJob::claim`] is 0: the
/// caller numbers its claims.
///
/// # Errors
///
/// [`ShardError`] when the shard cannot be reached or the statement fails
/// (e.g. `lock_timeout` under a table lock).
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future after the statement was sent may
/// leave claimed jobs that only lease recovery returns.
pub async fn claim(shard: &Shard, p: ClaimParams<'_>) -> Result<Claim, ShardError> {
    let slots = match p.mode {
        DequeueMode::Gated { slots } => slots as i32,
        DequeueMode::Ungated => 0,
    };
    let lease_ms = p.lease.as_millis() as i64;
    let held_until = tokio::time::Instant::now() + p.lease;
    let rows = super::super::exec::query(
        shard,
        sql::JOB_CLAIM,
        &[
            (&locks::dequeue_class(p.queue), Type::INT4),
            (&slots, Type::INT4),
            (&p.queue, Type::TEXT),
            (&(p.limit as i32), Type::INT4),
            (&p.owner, Type::TEXT),
            (&lease_ms, Type::INT8),
        ],
    )
    .await?;
    let got_slot: i32 = rows.first().map_or(0, |r| r.get("got_slot"));
    if got_slot == 0 {
        return Ok(Claim::Busy);
    }
    let jobs: Vec<ClaimedJob> = rows
        .iter()
        .filter_map(|r| {
            // The one row of an empty claim carries NULLs.
            let id: i64 = r.get::<_, Option<i64>>("id")?;
            Some(ClaimedJob {
                id: JobId {
                    shard_key: r.get("shard_key"),
                    id,
                },
                shard: shard.index,
                queue: r.get("queue"),
                handler: r.get("handler"),
                ordering_key: r.get("ordering_key"),
                payload: r.get("payload"),
                attempt: r.get("attempts"),
                fence: r.get("fence"),
                claim: 0,
                created_at: r.get("created_at"),
                held_until,
            })
        })
        .collect();
    Ok(if got_slot == HELD_BACK {
        Claim::HeldBack(jobs)
    } else if jobs.is_empty() {
        Claim::Empty
    } else {
        Claim::Jobs(jobs)
    })
}

/// Asks `shard` for a trivial answer ([`sql::SHARD_PROBE`]), through shardq's
/// pool and within the shard's statement deadline: whether it answers again
/// after a claim there got no answer in time.
///
/// # Errors
///
/// [`ShardError`] when no connection can be had or no answer comes.
///
/// # Cancel safety
///
/// Cancel safe: it changes nothing (a connection cut off mid-statement is
/// closed, not lent again).
pub async fn probe(shard: &Shard) -> Result<(), ShardError> {
    super::super::exec::query_one(shard, sql::SHARD_PROBE, &[]).await?;
    Ok(())
}

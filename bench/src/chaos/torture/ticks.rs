//! The scheduler with a clock minutes ahead: one worker of the torture fleet
//! at a time runs a per-second schedule (`missed = "skip"`) with its
//! scheduler's clock [`AHEAD`] of the system's ([`Worker::scheduler_clock_ahead`]).
//! It alone runs the schedule, so a tick it drops is dropped for good and a
//! tick it runs early or twice shows. Afterwards every tick that happened by
//! the database's clock during the run must have been enqueued exactly once.
//!
//! [`Worker::scheduler_clock_ahead`]: shardq::Worker::scheduler_clock_ahead

use super::super::sql;
use anyhow::{Context, Result};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;
use shardq::shards::Shard;
use shardq::{Client, Missed, Schedule};
use std::collections::BTreeMap;

/// The schedule's name; it also picks its home shard.
pub const NAME: &str = "torture-every-second";

/// The queue of its jobs: one no worker serves, so every tick's job stays
/// to be counted (and the drain and the other checks never see them).
pub const QUEUE: &str = "chaos-ticks";

/// How far the skewed worker's scheduler clock runs ahead: well past the
/// 60 s grace after which a late tick counts as missed, so a scheduler that
/// judged "missed" by its own clock would skip ticks that had not happened.
pub const AHEAD: TimeDelta = TimeDelta::minutes(5);

pub use super::super::names::AHEAD_ENV;

/// Tolerance at the end: ticks of the last this-long before the fleet
/// stopped are not yet expected. A tick is due when it happens; the scheduler sleeps to
/// it (plus up to 50 ms of jitter) and retries a failed pass within 5 s
/// (`RETRY_MAX` of the scheduler), so 10 s covers a retry on a loaded
/// machine. Every tick before that must be there: none of the run's faults
/// keeps the schedule's shard or its worker away for the 60 s after which a
/// late tick is skipped by design (the longest, the freeze of shard 0 and
/// the silence of shard 1, last a tenth of the fault phase; the longest stop
/// of a worker 20 s; a killed worker is replaced at once).
const END_TOLERANCE: TimeDelta = TimeDelta::seconds(10);

/// Tolerance at the start: ticks are expected from this long after the
/// fault phase's start on (the worker starts, connects, registers the
/// schedule at its latest tick so far and enqueues from the next one).
const START_TOLERANCE: TimeDelta = TimeDelta::seconds(10);

/// Evidence kept: the first this-many wrong ticks.
const EVIDENCE: usize = 5;

/// The schedule the skewed worker runs: every second, missed ticks skipped.
pub fn schedule() -> Schedule {
    Schedule::new(NAME, "* * * * * *", QUEUE, "noop")
        .expect("a valid schedule")
        .missed(Missed::Skip)
}

/// What the ticks' jobs say.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TickChecks {
    /// Ticks that happened by the database's clock during the run, less
    /// [`START_TOLERANCE`] and [`END_TOLERANCE`]: each must have its job.
    pub expected: u64,
    /// Distinct ticks enqueued.
    pub enqueued: u64,
    /// Expected ticks without a job (dropped).
    pub dropped: u64,
    /// Ticks with more than one job (run twice).
    pub doubled: u64,
    /// Ticks whose job was written before the tick's time (the database's
    /// clock at the insert).
    pub early: u64,
    /// The first wrong ticks, described.
    pub examples: Vec<String>,
}

impl TickChecks {
    /// Ticks dropped, doubled or early: must be 0.
    pub fn wrong(&self) -> u64 {
        self.dropped + self.doubled + self.early
    }
}

/// The schedule's home shard.
fn home(client: &Client) -> &Shard {
    client.shards().for_key(shardq::router::shard_key_for(NAME))
}

/// The database clock of the schedule's home shard (the start of the run).
pub async fn db_now(client: &Client) -> Result<DateTime<Utc>> {
    shardq::store::schedules::clock(home(client))
        .await
        .context("cannot read the schedule shard's clock")
}

/// Compares the ticks enqueued with those that happened by the database's
/// clock from `started` (that clock at the fault phase's start) until
/// `stopped` (that clock just before the fleet was stopped).
pub async fn check(
    client: &Client,
    started: DateTime<Utc>,
    stopped: DateTime<Utc>,
) -> Result<TickChecks> {
    let shard = home(client);
    let db = shard.client().await?;
    let rows = db
        .query(sql::TICK_JOBS, &[&QUEUE])
        .await
        .context("cannot read the ticks' jobs")?;
    let schedule = schedule();
    // Tick → (jobs, when the first was written).
    let mut jobs: BTreeMap<DateTime<Utc>, (i64, DateTime<Utc>)> = BTreeMap::new();
    let mut checks = TickChecks::default();
    for row in &rows {
        let dedup: String = row.get(0);
        let count: i64 = row.get(1);
        let written: std::time::SystemTime = row.get(2);
        let at = dedup
            .strip_prefix(&format!("{NAME}@"))
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            .map(|at| at.with_timezone(&Utc))
            .with_context(|| format!("a tick job with dedup id {dedup:?}"))?;
        anyhow::ensure!(schedule.dedup_id(at) == dedup, "tick id {dedup:?}");
        jobs.insert(at, (count, written.into()));
    }
    checks.enqueued = jobs.len() as u64;
    let wrong = |what: String, checks: &mut TickChecks| {
        if checks.examples.len() < EVIDENCE {
            checks.examples.push(what);
        }
    };
    for (at, (count, written)) in &jobs {
        if *count > 1 {
            checks.doubled += 1;
            wrong(format!("tick {at} enqueued {count} times"), &mut checks);
        }
        if at > written {
            checks.early += 1;
            wrong(
                format!("tick {at} enqueued at {written}, before it happened"),
                &mut checks,
            );
        }
    }
    // Every whole second of the run (less the tolerances) is a tick.
    let second = TimeDelta::seconds(1);
    let from = started + START_TOLERANCE;
    let mut at = from.duration_trunc(second).unwrap_or(from);
    if at < from {
        at += second;
    }
    let end = stopped - END_TOLERANCE;
    while at <= end {
        checks.expected += 1;
        if !jobs.contains_key(&at) {
            checks.dropped += 1;
            wrong(format!("tick {at} never enqueued (dropped)"), &mut checks);
        }
        at += second;
    }
    Ok(checks)
}

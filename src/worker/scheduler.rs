//! The scheduler: enqueues the ticks of periodic jobs. One loop per schedule
//! (so a shard that hangs delays only the schedules that live on it), each a
//! single `select!` over shutdown and "sleep to the next tick, then handle
//! what is due". Which ticks are due, and the missed-tick policy, are in
//! [`crate::schedule::due`]; exactly-once is the tick statement's
//! (`store::schedules::tick`). Every worker process runs every schedule;
//! the processes race for each tick and one wins.
//!
//! Time is the database's: each pass reads the shard's clock and judges
//! which ticks are due (and which were missed) by it, and the tick statement
//! refuses a tick that is not ripe by it. A worker whose own clock is off by
//! minutes then neither enqueues ticks early nor skips ticks that have not
//! happened yet; its clock only sets how long it sleeps.

use super::rotation::jitter;
use crate::schedule::due::{self, LATE_TICK_GRACE};
use crate::schedule::{Missed, Schedule};
use crate::shards::{Shard, ShardError, ShardSet};
use crate::store::schedules::{self, Tick};
use chrono::{DateTime, TimeDelta, Utc};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Added to each wake-up so that the processes of a fleet do not all hit a
/// schedule's row in the same millisecond (the losers' statements are no-ops,
/// but they queue on the row lock).
const TICK_JITTER_MAX: Duration = Duration::from_millis(50);

/// Longest sleep: a wall clock that jumps (an NTP step, a suspended host)
/// is noticed within this.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// First retry delay after a failed pass (shard down, statement deadline);
/// doubles per failure up to [`RETRY_MAX`]. A tick retried past
/// [`LATE_TICK_GRACE`] is then handled as missed.
const RETRY_MIN: Duration = Duration::from_millis(100);

/// Longest retry delay: well inside the grace, so a shard that comes back
/// gets its late ticks enqueued as on time.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// This process's clock as the scheduler reads it: the system clock, or one
/// set off by `ahead` (tests and the torture run show that a skewed clock
/// changes nothing but sleep times).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LocalClock {
    /// How far this clock runs ahead of the system clock (negative: behind).
    pub ahead: TimeDelta,
}

impl LocalClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.ahead
    }
}

/// Runs every schedule until `shutdown`; `max_attempts` is the attempt
/// limit of their jobs.
pub(crate) async fn run(
    schedules: Vec<Schedule>,
    shards: ShardSet,
    max_attempts: i32,
    clock: LocalClock,
    shutdown: CancellationToken,
) {
    let mut loops = tokio::task::JoinSet::new();
    for schedule in schedules {
        let shard = shards.for_key(schedule.shard_key()).clone();
        let one = ScheduleLoop {
            schedule,
            shard,
            shards: shards.clone(),
            max_attempts,
            clock,
            skew: TimeDelta::zero(),
            cursor: None,
            failures: 0,
        };
        loops.spawn(one.run(shutdown.clone()));
    }
    while loops.join_next().await.is_some() {}
}

/// How a pass that did not fail ended.
enum Pass {
    /// Every due tick was handled.
    Done,
    /// The tick statement found this tick not yet due by the shard's clock.
    NotYet(DateTime<Utc>),
    /// The shard no longer holds the schedule's key (`shardq reshard`).
    Moved,
}

/// One schedule's loop and its state.
struct ScheduleLoop {
    schedule: Schedule,
    /// The shard the schedule's name routes to.
    shard: Shard,
    /// Every shard, to find the schedule's shard again after a reshard.
    shards: ShardSet,
    max_attempts: i32,
    clock: LocalClock,
    /// The shard's clock minus the local one, as last read: turns a local
    /// time into the shard's for the sleep to the next tick.
    skew: TimeDelta,
    /// The latest tick this process has handled (`None` before the first pass).
    cursor: Option<DateTime<Utc>>,
    /// Failed passes in a row.
    failures: u32,
}

impl ScheduleLoop {
    async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(schedule = %self.schedule.name(), shard = %self.shard.name, "schedule started");
        loop {
            let pause = self.pause(self.clock.now() + self.skew);
            // A pass cut short by shutdown leaves each tick written or not:
            // every tick is one statement.
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = async {
                    tokio::time::sleep(pause).await;
                    self.pass().await;
                } => {}
            }
        }
    }

    /// How long to sleep before the next pass; `now` is the shard's time.
    fn pause(&self, now: DateTime<Utc>) -> Duration {
        let mut rng = rand::thread_rng();
        if self.failures > 0 {
            let doubled = RETRY_MIN.saturating_mul(1 << self.failures.min(16));
            let max = doubled.min(RETRY_MAX);
            return jitter(&mut rng, max / 2, max);
        }
        let Some(cursor) = self.cursor else {
            return Duration::ZERO;
        };
        match self.schedule.next_after(cursor) {
            Some(next) => {
                let until = (next - now).to_std().unwrap_or(Duration::ZERO);
                until.min(MAX_SLEEP) + jitter(&mut rng, Duration::ZERO, TICK_JITTER_MAX)
            }
            None => MAX_SLEEP,
        }
    }

    /// One pass, judged by the shard's clock (read first).
    async fn pass(&mut self) {
        let result = match schedules::clock(&self.shard).await {
            Ok(now) => {
                self.skew = now - self.clock.now();
                self.try_pass(now).await
            }
            Err(err) => Err(err),
        };
        match result {
            Ok(Pass::Done) => self.failures = 0,
            // Only a shard clock that stepped back between the read and the
            // tick gets here: try again after a short wait.
            Ok(Pass::NotYet(tick)) => {
                self.failures = self.failures.max(1);
                tracing::debug!(schedule = %self.schedule.name(), %tick, "tick not yet due by the shard's clock");
            }
            Ok(Pass::Moved) => self.find_shard_again().await,
            Err(err) => {
                self.failures += 1;
                tracing::warn!(
                    schedule = %self.schedule.name(),
                    error = %crate::error_chain::error_chain(&err),
                    "schedule tick failed; retrying"
                );
            }
        }
    }

    /// Handles every tick due at `now` (the shard's time) in order; the
    /// cursor moves past each one handled, so a failure retries from the
    /// first tick not handled, and a tick the statement finds not yet due
    /// stays ahead of the cursor.
    async fn try_pass(&mut self, now: DateTime<Utc>) -> Result<Pass, ShardError> {
        let cursor = match self.cursor {
            Some(cursor) => cursor,
            None => match self.first_cursor(now).await? {
                Some(cursor) => cursor,
                None => return Ok(Pass::Done),
            },
        };
        let due = due::due(&self.schedule, cursor, now, LATE_TICK_GRACE);
        if let Some(missed) = due.missed {
            let run_once = self.schedule.missed_policy() == Missed::RunOnce;
            let outcome = self.tick(missed, run_once).await?;
            if outcome.moved {
                return Ok(Pass::Moved);
            }
            if outcome.not_yet {
                return Ok(Pass::NotYet(missed));
            }
            if outcome.advanced {
                tracing::info!(
                    schedule = %self.schedule.name(),
                    last_missed = %missed,
                    policy = ?self.schedule.missed_policy(),
                    job = ?outcome.job.map(|j| j.to_string()),
                    "ticks were missed while no worker ran them"
                );
            }
            self.cursor = Some(missed);
        }
        for tick in due.on_time {
            let outcome = self.tick(tick, true).await?;
            if outcome.moved {
                return Ok(Pass::Moved);
            }
            if outcome.not_yet {
                return Ok(Pass::NotYet(tick));
            }
            if let Some(job) = outcome.job {
                tracing::debug!(schedule = %self.schedule.name(), %tick, %job, "tick enqueued");
            }
            self.cursor = Some(tick);
        }
        Ok(Pass::Done)
    }

    /// The cursor of the first pass: the recorded last tick, or, for a
    /// schedule no process has seen, its latest tick so far (recorded
    /// without a job; then the pass is over: `Ok(None)`).
    async fn first_cursor(
        &mut self,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, ShardError> {
        let start = due::first_cursor(&self.schedule, now);
        if schedules::register(&self.shard, self.schedule.name(), start).await? {
            self.cursor = Some(start);
            return Ok(None);
        }
        let last = schedules::last_tick(&self.shard, self.schedule.name()).await?;
        let cursor = last.map_or(start, |l| l.at);
        self.cursor = Some(cursor);
        Ok(Some(cursor))
    }

    /// After a tick refused as not this shard's: reloads the map and
    /// routes the schedule again, reading its last tick there afresh (the
    /// move copied it). A range still moving in refuses too: the pass is
    /// tried again after a pause.
    async fn find_shard_again(&mut self) {
        self.failures = self.failures.max(1);
        self.cursor = None;
        match self.shards.load_map().await {
            Ok(_) => {
                let shard = self.shards.for_key(self.schedule.shard_key()).clone();
                tracing::info!(
                    schedule = %self.schedule.name(), from = %self.shard.name, to = %shard.name,
                    "the schedule's shard key moved to another shard"
                );
                self.shard = shard;
            }
            Err(err) => tracing::warn!(
                schedule = %self.schedule.name(),
                error = %crate::error_chain::error_chain(&err),
                "the schedule's shard key moved; the shard map cannot be loaded"
            ),
        }
    }

    async fn tick(
        &self,
        at: DateTime<Utc>,
        enqueue: bool,
    ) -> Result<schedules::TickOutcome, ShardError> {
        let job = self.schedule.job_for(at);
        let tick = Tick {
            name: self.schedule.name(),
            at,
            shard_key: self.schedule.shard_key(),
            job: &job,
            max_attempts: self.max_attempts,
            enqueue,
        };
        schedules::tick(&self.shard, tick).await
    }
}

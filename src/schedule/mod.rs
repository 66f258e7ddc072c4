//! Periodic jobs: a cron expression in a time zone that enqueues one job per
//! tick, across the whole fleet.
//!
//! A [`Schedule`] is a checked value (its expression parsed, its zone known);
//! it comes from `[[schedules]]` in `shards.toml` or from code
//! ([`Schedule::new`], then [`crate::Worker::schedule`]). Its ticks are
//! instants (UTC), computed by `croner` in the schedule's zone: a fixed time
//! (`30 2 * * *`) that a DST change skips runs right after the gap, one that
//! it repeats runs once, at its first occurrence; an interval (`*/30 * * *
//! *`) runs in both passes of a repeated hour and skips the times a gap
//! removes (pinned in `tests.rs`). Which tick is due when, and what a worker
//! does with ticks it missed, is in `due` (operator tooling, behind the
//! `internal` feature); the worker role that enqueues them is
//! `worker::scheduler`.

#[cfg(feature = "internal")]
#[doc(hidden)]
pub mod due;
#[cfg(not(feature = "internal"))]
#[allow(dead_code, unreachable_pub)]
pub(crate) mod due;

use crate::job::{EnqueueLimits, InvalidJob, NewJob};
use crate::router;
use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use croner::Cron;
use serde_json::Value;
use std::str::FromStr;

/// What a worker does with ticks that passed while no worker ran (older than
/// a minute, `LATE_TICK_GRACE`, when it first sees them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Enqueue none of them: the schedule goes on from the next tick.
    #[default]
    Skip,
    /// Enqueue one job for the whole missed period (for its latest tick).
    RunOnce,
}

impl Missed {
    /// The policy as written in `shards.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::RunOnce => "run_once",
        }
    }
}

impl FromStr for Missed {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Missed, ScheduleError> {
        match s {
            "skip" => Ok(Missed::Skip),
            "run_once" => Ok(Missed::RunOnce),
            other => Err(ScheduleError::Missed(other.to_string())),
        }
    }
}

/// What is wrong with a schedule; says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The name is empty or holds a NUL character.
    #[error("a schedule name must be non-empty text without NUL characters")]
    Name,
    /// The cron expression does not parse.
    #[error(
        "`{expression}` is not a cron expression; write 5 fields (minute hour day-of-month \
         month day-of-week, e.g. \"0 3 * * *\"), or 6 with seconds first (\"*/10 * * * * *\")"
    )]
    Cron {
        /// The expression as given.
        expression: String,
        /// The parser's reason.
        #[source]
        source: croner::errors::CronError,
    },
    /// The cron expression parses but never fires (e.g. February 30th).
    #[error("`{0}` never matches a time; check the day-of-month and month fields")]
    Never(String),
    /// The time zone is not an IANA name.
    #[error("unknown time zone `{0}`; use an IANA name such as \"UTC\" or \"Europe/Berlin\"")]
    Timezone(String),
    /// `missed` is not one of the policies.
    #[error("unknown policy `{0}`; use \"skip\" or \"run_once\"")]
    Missed(String),
    /// The job it would enqueue is refused (empty handler, oversized payload, ...).
    #[error("its jobs would be refused")]
    Job(#[source] InvalidJob),
    /// Two schedules share a name.
    #[error("the schedule name `{0}` is used twice; give every schedule a unique name")]
    Duplicate(String),
}

impl ScheduleError {
    /// The `[[schedules]]` key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            ScheduleError::Name | ScheduleError::Duplicate(_) => "name",
            ScheduleError::Cron { .. } | ScheduleError::Never(_) => "cron",
            ScheduleError::Timezone(_) => "timezone",
            ScheduleError::Missed(_) => "missed",
            ScheduleError::Job(InvalidJob::EmptyName("queue")) => "queue",
            ScheduleError::Job(InvalidJob::NulInName("queue")) => "queue",
            ScheduleError::Job(InvalidJob::TooLong { field: "queue", .. }) => "queue",
            ScheduleError::Job(InvalidJob::TooLong {
                field: "handler", ..
            }) => "handler",
            // The tick's deduplication id is the schedule's name and the tick.
            ScheduleError::Job(InvalidJob::TooLong { .. }) => "name",
            ScheduleError::Job(InvalidJob::EmptyName(_) | InvalidJob::NulInName(_)) => "handler",
            ScheduleError::Job(_) => "payload",
        }
    }
}

/// A periodic job: every tick of `cron` (in `timezone`) enqueues one job for
/// `handler` on `queue` with `payload`, exactly once across the fleet.
#[derive(Debug, Clone)]
pub struct Schedule {
    name: String,
    expression: String,
    cron: Cron,
    timezone: Tz,
    queue: String,
    handler: String,
    payload: Value,
    missed: Missed,
}

impl Schedule {
    /// A schedule named `name` (unique: it keys the schedule's durable last
    /// tick) that runs `handler` on `queue` at every tick of `cron`, in UTC,
    /// with an empty payload, skipping missed ticks.
    ///
    /// `cron` has 5 fields (minute hour day-of-month month day-of-week), or 6
    /// with seconds first; `@daily` and the like work too.
    ///
    /// # Errors
    ///
    /// [`ScheduleError`] for an empty name, queue or handler, or an
    /// expression that does not parse or never fires.
    pub fn new(
        name: impl Into<String>,
        cron: &str,
        queue: impl Into<String>,
        handler: impl Into<String>,
    ) -> Result<Schedule, ScheduleError> {
        let name = name.into();
        if name.is_empty() || name.contains('\0') {
            return Err(ScheduleError::Name);
        }
        let parsed = Cron::from_str(cron).map_err(|source| ScheduleError::Cron {
            expression: cron.to_string(),
            source,
        })?;
        let schedule = Schedule {
            name,
            expression: cron.to_string(),
            cron: parsed,
            timezone: Tz::UTC,
            queue: queue.into(),
            handler: handler.into(),
            payload: Value::Object(Default::default()),
            missed: Missed::Skip,
        };
        if schedule.next_after(Utc::now()).is_none() {
            return Err(ScheduleError::Never(schedule.expression));
        }
        validate_names(&schedule.job_for(Utc::now()))?;
        Ok(schedule)
    }

    /// The same schedule in time zone `timezone` (an IANA name such as
    /// `"Europe/Berlin"`): its expression is read in that zone's wall clock.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Timezone`] for an unknown name.
    pub fn in_timezone(mut self, timezone: &str) -> Result<Schedule, ScheduleError> {
        self.timezone =
            Tz::from_str(timezone).map_err(|_| ScheduleError::Timezone(timezone.to_string()))?;
        Ok(self)
    }

    /// The same schedule with `payload` for its jobs.
    pub fn payload(mut self, payload: Value) -> Schedule {
        self.payload = payload;
        self
    }

    /// The same schedule with policy `missed` for ticks missed while no worker ran.
    pub fn missed(mut self, missed: Missed) -> Schedule {
        self.missed = missed;
        self
    }

    /// Checks its jobs against `limits` (payload size, NUL characters).
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Job`] saying what is wrong.
    pub fn validate(&self, limits: &EnqueueLimits) -> Result<(), ScheduleError> {
        self.job_for(Utc::now())
            .validate(limits)
            .map_err(ScheduleError::Job)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its cron expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Its time zone.
    pub fn timezone(&self) -> Tz {
        self.timezone
    }

    /// The queue its jobs go to.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The handler its jobs run.
    pub fn handler(&self) -> &str {
        &self.handler
    }

    /// Its policy for missed ticks.
    pub fn missed_policy(&self) -> Missed {
        self.missed
    }

    /// The routing key of its durable state and its jobs: the schedule's
    /// name hashed as a deduplication id is ([`router::shard_key_for`]), so
    /// every process sends a schedule's ticks to the same shard.
    pub fn shard_key(&self) -> i32 {
        router::shard_key_for(&self.name)
    }

    /// The first tick strictly after `after`, or `None` when there is none
    /// (before year 5000).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&self.timezone);
        let next = self.cron.find_next_occurrence(&local, false).ok()?;
        Some(next.with_timezone(&Utc))
    }

    /// The latest tick at or before `at`, or `None` when there is none.
    pub fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = at.with_timezone(&self.timezone);
        let previous = self.cron.find_previous_occurrence(&local, true).ok()?;
        Some(previous.with_timezone(&Utc))
    }

    /// The deduplication id of the job of tick `tick`: `name@RFC 3339 UTC`,
    /// e.g. `nightly@2026-03-29T01:30:00Z`.
    pub fn dedup_id(&self, tick: DateTime<Utc>) -> String {
        format!(
            "{}@{}",
            self.name,
            tick.to_rfc3339_opts(SecondsFormat::AutoSi, true)
        )
    }

    /// The job of tick `tick`.
    pub fn job_for(&self, tick: DateTime<Utc>) -> NewJob {
        let mut job = NewJob::new(&self.queue, &self.handler, self.payload.clone());
        job.dedup_id = Some(self.dedup_id(tick));
        job
    }
}

/// Checks what [`NewJob::validate`] checks but the limits (known only to
/// the worker or config that takes the schedule).
fn validate_names(job: &NewJob) -> Result<(), ScheduleError> {
    let unlimited = EnqueueLimits {
        max_payload_bytes: usize::MAX,
        default_max_attempts: 1,
    };
    job.validate(&unlimited).map_err(ScheduleError::Job)
}

#[cfg(test)]
mod tests;

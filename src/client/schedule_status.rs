//! What `status` reports about periodic jobs: per schedule, its durable last
//! tick (read from the shard its name routes to) and its next tick.

use crate::schedule::{Missed, Schedule};
use crate::shards::Shard;
use crate::store::schedules;
use chrono::{DateTime, SecondsFormat, Utc};

/// One schedule as `status` shows it. Times are RFC 3339 in UTC.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleStatus {
    /// Name.
    pub name: String,
    /// Cron expression.
    pub cron: String,
    /// Time zone the expression is read in.
    pub timezone: String,
    /// Queue of its jobs.
    pub queue: String,
    /// Handler of its jobs.
    pub handler: String,
    /// Policy for ticks missed while no worker ran.
    pub missed: Missed,
    /// The latest tick handled (enqueued, or recorded as missed); `None`
    /// when no worker has run the schedule yet, or the shard did not answer.
    pub last_tick: Option<String>,
    /// When that tick was handled.
    pub last_handled_at: Option<String>,
    /// The next tick the fleet will enqueue.
    pub next_tick: Option<String>,
    /// Why the last tick could not be read.
    pub error: Option<String>,
}

/// The status of `schedules` (all routed to `shard`) at `now`.
pub(super) async fn of_shard(
    shard: &Shard,
    schedules: &[&Schedule],
    now: DateTime<Utc>,
) -> Vec<ScheduleStatus> {
    if schedules.is_empty() {
        return Vec::new();
    }
    let names: Vec<&str> = schedules.iter().map(|s| s.name()).collect();
    match schedules::last_ticks(shard, &names).await {
        Ok(ticks) => schedules
            .iter()
            .map(|s| status(s, ticks.get(s.name()).copied(), now, None))
            .collect(),
        Err(e) => unknown(schedules, now, &crate::error_chain::error_chain(&e)),
    }
}

/// The status of `schedules` whose shard could not be read (`error`).
pub(super) fn unknown(
    schedules: &[&Schedule],
    now: DateTime<Utc>,
    error: &str,
) -> Vec<ScheduleStatus> {
    schedules
        .iter()
        .map(|s| status(s, None, now, Some(error.to_string())))
        .collect()
}

fn status(
    s: &Schedule,
    last: Option<schedules::LastTick>,
    now: DateTime<Utc>,
    error: Option<String>,
) -> ScheduleStatus {
    let from = last.map_or(now, |l| l.at.max(now));
    ScheduleStatus {
        name: s.name().to_string(),
        cron: s.expression().to_string(),
        timezone: s.timezone().name().to_string(),
        queue: s.queue().to_string(),
        handler: s.handler().to_string(),
        missed: s.missed_policy(),
        last_tick: last.map(|l| rfc3339(l.at)),
        last_handled_at: last.map(|l| rfc3339(l.updated_at)),
        next_tick: s.next_after(from).map(rfc3339),
        error,
    }
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

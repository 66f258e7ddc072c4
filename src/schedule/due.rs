//! Which ticks of a schedule are due: pure, with an explicit `now`, so it is
//! tested without a database or a clock.
//!
//! Each worker process keeps a cursor per schedule: the latest tick it has
//! handled (enqueued, or found enqueued by another process, or given up as
//! missed). At each pass it takes the ticks after the cursor up to `now`:
//!
//! - ticks at most [`LATE_TICK_GRACE`] old are **on time**: each is tried in
//!   order, and a failed one is retried (the cursor stays behind it) until
//!   it grows older than the grace;
//! - ticks older than that were **missed** (no worker ran, or their shard did
//!   not answer for that long): they collapse into the latest of them, which
//!   the schedule's [`Missed`](super::Missed) policy enqueues once or skips.
//!
//! Every process keeps ticks in order and the durable `last_tick` only moves
//! forward, so a tick that any process moved `last_tick` past was either
//! enqueued once or declared missed; none is enqueued twice.

use super::Schedule;
use chrono::{DateTime, TimeDelta, Utc};

/// How late a tick may still be enqueued as on time: longer than a worker
/// restart or a shard failover takes (so a deploy does not drop ticks), short
/// enough that a worker coming back after real downtime does not replay a
/// minute of a per-second schedule as if nothing happened.
pub const LATE_TICK_GRACE: TimeDelta = TimeDelta::seconds(60);

/// On-time ticks handled in one pass at most; a per-second schedule has 60
/// within the grace. Bounds the work of a pass whatever the expression.
pub const MAX_TICKS_PER_PASS: usize = 1_000;

/// The ticks one pass handles, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The latest of the ticks older than the grace that are after the cursor:
    /// enqueued once with `run_once`, only recorded with `skip`.
    pub missed: Option<DateTime<Utc>>,
    /// Ticks after the cursor (and after `missed`) up to `now`, each enqueued.
    pub on_time: Vec<DateTime<Utc>>,
}

impl Due {
    /// Whether nothing is due.
    pub fn is_empty(&self) -> bool {
        self.missed.is_none() && self.on_time.is_empty()
    }
}

/// The ticks of `schedule` after `cursor` up to `now`, split by `grace`.
pub fn due(
    schedule: &Schedule,
    cursor: DateTime<Utc>,
    now: DateTime<Utc>,
    grace: TimeDelta,
) -> Due {
    let missed = schedule
        .latest_at_or_before(now - grace)
        .filter(|tick| *tick > cursor);
    let mut from = missed.unwrap_or(cursor);
    let mut on_time = Vec::new();
    while on_time.len() < MAX_TICKS_PER_PASS {
        match schedule.next_after(from) {
            Some(tick) if tick <= now => {
                on_time.push(tick);
                from = tick;
            }
            _ => break,
        }
    }
    Due { missed, on_time }
}

/// Where a schedule that no process has seen before starts: its latest tick
/// at or before `now` (or `now`), recorded without a job, so a new schedule
/// enqueues its first job at its first tick after it was configured, not a
/// backlog of earlier ones.
pub fn first_cursor(schedule: &Schedule, now: DateTime<Utc>) -> DateTime<Utc> {
    schedule.latest_at_or_before(now).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 6, 1, h, m, s).unwrap()
    }

    fn every_minute() -> Schedule {
        Schedule::new("m", "* * * * *", "q", "noop").unwrap()
    }

    #[test]
    fn a_worker_on_time_gets_each_tick_once_in_order() {
        let s = every_minute();
        let due = due(&s, at(10, 0, 0), at(10, 1, 50), LATE_TICK_GRACE);
        assert_eq!(due.missed, None);
        assert_eq!(due.on_time, vec![at(10, 1, 0)]);
        assert!(super::due(&s, at(10, 1, 0), at(10, 1, 50), LATE_TICK_GRACE).is_empty());
        let two = super::due(&s, at(10, 0, 0), at(10, 2, 0), TimeDelta::seconds(90));
        assert_eq!(two.on_time, vec![at(10, 1, 0), at(10, 2, 0)]);
    }

    #[test]
    fn ticks_older_than_the_grace_collapse_into_the_latest_missed_one() {
        let s = every_minute();
        // Down from 10:00 to 11:00:30: 10:01 .. 10:59 are missed (older than
        // 60 s), 11:00 is on time.
        let due = due(&s, at(10, 0, 0), at(11, 0, 30), LATE_TICK_GRACE);
        assert_eq!(due.missed, Some(at(10, 59, 0)));
        assert_eq!(due.on_time, vec![at(11, 0, 0)]);
    }

    #[test]
    fn a_retried_tick_stays_on_time_until_it_is_older_than_the_grace() {
        let s = every_minute();
        let retry = due(&s, at(10, 0, 0), at(10, 1, 59), LATE_TICK_GRACE);
        assert_eq!(retry.missed, None);
        assert_eq!(retry.on_time, vec![at(10, 1, 0)]);
        let late = due(&s, at(10, 0, 0), at(10, 2, 1), LATE_TICK_GRACE);
        assert_eq!(late.missed, Some(at(10, 1, 0)));
        assert_eq!(late.on_time, vec![at(10, 2, 0)]);
    }

    #[test]
    fn a_pass_is_bounded() {
        let s = Schedule::new("s", "* * * * * *", "q", "noop").unwrap();
        let due = due(&s, at(10, 0, 0), at(12, 0, 0), TimeDelta::days(1));
        assert_eq!(due.on_time.len(), MAX_TICKS_PER_PASS);
        assert_eq!(due.on_time[0], at(10, 0, 1));
    }

    #[test]
    fn a_new_schedule_starts_at_its_latest_tick_so_nothing_before_is_enqueued() {
        let s = every_minute();
        assert_eq!(first_cursor(&s, at(10, 0, 30)), at(10, 0, 0));
        assert_eq!(first_cursor(&s, at(10, 1, 0)), at(10, 1, 0));
    }
}

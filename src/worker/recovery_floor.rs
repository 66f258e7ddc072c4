//! Where a shard's next lease recovery pass starts looking.
//!
//! While a long transaction holds the xmin horizon, the lease index keeps
//! an entry, expired, for the running version of every job finished since;
//! a pass that starts at the oldest lease walks them all, every second,
//! and the shard spends its CPU on that walk. So a pass starts a margin
//! before the previous caught-up pass (`MARGIN`: a lease written by a
//! transaction still open then, and visible only later, is at most that
//! far behind), and never after a lease it found and had to leave (a busy
//! key). Every `FULL_EVERY` one pass looks at all of them again, for what
//! the bound cannot see: a lease behind it whose row was locked by a write
//! that then rolled back.

use std::time::{Duration, Instant, SystemTime};

/// How far before the previous caught-up pass the next one starts.
pub(crate) const MARGIN: Duration = Duration::from_secs(10);

/// How often a pass looks at every expired lease.
pub(crate) const FULL_EVERY: Duration = Duration::from_secs(300);

/// One shard's recovery start, kept by this process's maintenance loop.
#[derive(Debug)]
pub(crate) struct RecoveryFloor {
    since: Option<SystemTime>,
    last_full: Option<Instant>,
}

impl RecoveryFloor {
    pub(crate) fn new() -> Self {
        RecoveryFloor {
            since: None,
            last_full: None,
        }
    }

    /// Where the next pass starts (`None`: at the oldest lease), as of `now`.
    pub(crate) fn since(&self, now: Instant) -> Option<SystemTime> {
        match self.last_full {
            Some(full) if now.duration_since(full) < FULL_EVERY => self.since,
            _ => None,
        }
    }

    /// Takes in a pass that started at `since` (what [`Self::since`] said)
    /// and ended as `pass` says, at `now`.
    pub(crate) fn passed(
        &mut self,
        since: Option<SystemTime>,
        at: Option<SystemTime>,
        caught_up: bool,
        oldest_left: Option<SystemTime>,
        now: Instant,
    ) {
        let Some(at) = at else {
            return; // another process did the pass: nothing was looked at
        };
        if !caught_up {
            return; // more past `since`: the next pass starts there again
        }
        let next = at.checked_sub(MARGIN).unwrap_or(at);
        self.since = Some(oldest_left.map_or(next, |left| left.min(next)));
        if since.is_none() {
            self.last_full = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    #[test]
    fn the_first_pass_looks_at_every_lease_then_a_margin_before_the_last() {
        let start = Instant::now();
        let mut floor = RecoveryFloor::new();
        assert_eq!(floor.since(start), None);
        floor.passed(None, Some(t(100)), true, None, start);
        assert_eq!(floor.since(start), Some(t(90)));
        floor.passed(Some(t(90)), Some(t(101)), true, None, start);
        assert_eq!(floor.since(start), Some(t(91)));
    }

    #[test]
    fn a_pass_that_did_not_catch_up_or_ran_elsewhere_keeps_the_start() {
        let start = Instant::now();
        let mut floor = RecoveryFloor::new();
        floor.passed(None, Some(t(100)), true, None, start);
        floor.passed(Some(t(90)), Some(t(200)), false, None, start);
        assert_eq!(floor.since(start), Some(t(90)), "more to do past 90");
        floor.passed(Some(t(90)), None, true, None, start);
        assert_eq!(floor.since(start), Some(t(90)), "another process passed");
        // Not caught up on the first pass: still a full one next.
        let mut fresh = RecoveryFloor::new();
        fresh.passed(None, Some(t(100)), false, None, start);
        assert_eq!(fresh.since(start), None);
    }

    #[test]
    fn a_lease_left_behind_holds_the_start_and_a_full_pass_comes_back() {
        let start = Instant::now();
        let mut floor = RecoveryFloor::new();
        floor.passed(None, Some(t(100)), true, Some(t(20)), start);
        assert_eq!(floor.since(start), Some(t(20)), "the busy key's lease");
        assert_eq!(floor.since(start + FULL_EVERY), None, "then all again");
    }
}

//! Where a shard's next lease recovery pass starts looking.
//!
//! While a long transaction holds the xmin horizon, the lease index keeps
//! an entry, expired, for the running version of every job finished since;
//! a pass that starts at the oldest lease walks them all, and the shard
//! spends its CPU (and its buffer cache) on that walk. So a pass looks back
//! only a little before the previous caught-up pass (its transaction's
//! start), and never after a lease it found and had to leave (a busy key).
//!
//! What a short look can miss is a lease that expired before the previous
//! pass but became visible after it: written (`now()` + the lease, `now()`
//! its transaction's start) by a transaction that ran longer than the lease
//! and committed after that pass looked. So three looks, each less often:
//! - a short one (`SHORT_BACK`) every pass;
//! - a wide one (`WIDE_BACK` before the previous caught-up wide pass)
//!   every `WIDE_EVERY`: a writer that ran up to `WIDE_BACK` longer than
//!   its lease is found within about `WIDE_EVERY` and a pass, where the
//!   margin looked at every pass found it within a pass (measured under a
//!   held horizon, 10,000 jobs/s: that walked 9,400 heap pages a pass);
//! - a full one every `FULL_EVERY`, for what no bound sees: a longer
//!   writer, or an expired lease behind the start whose row was locked
//!   (by a write, committed or rolled back, that left the lease as it was)
//!   each time a pass looked at it.

use std::time::{Duration, Instant, SystemTime};

/// How far before the previous caught-up pass a short look starts.
pub(crate) const SHORT_BACK: Duration = Duration::from_secs(1);

/// How far before the previous caught-up wide pass a wide look starts.
pub(crate) const WIDE_BACK: Duration = Duration::from_secs(10);

/// How often a pass looks back from the wide start.
pub(crate) const WIDE_EVERY: Duration = Duration::from_secs(20);

/// How often a pass looks at every expired lease.
pub(crate) const FULL_EVERY: Duration = Duration::from_secs(300);

/// Where one pass looks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Look {
    /// The earliest lease expiry the pass looks at (`None`: every one).
    pub(crate) from: Option<SystemTime>,
    /// A wide or full look: its end moves the wide start too.
    moves_wide: bool,
}

/// One shard's recovery starts, kept by this process's maintenance loop.
#[derive(Debug)]
pub(crate) struct RecoveryFloor {
    short_from: Option<SystemTime>,
    wide_from: Option<SystemTime>,
    last_wide: Option<Instant>,
    last_full: Option<Instant>,
}

impl RecoveryFloor {
    pub(crate) fn new() -> Self {
        RecoveryFloor {
            short_from: None,
            wide_from: None,
            last_wide: None,
            last_full: None,
        }
    }

    /// Where the next pass looks from, as of `now`.
    pub(crate) fn look(&self, now: Instant) -> Look {
        let due =
            |last: Option<Instant>, every| last.is_none_or(|t| now.duration_since(t) >= every);
        if due(self.last_full, FULL_EVERY) {
            Look {
                from: None,
                moves_wide: true,
            }
        } else if due(self.last_wide, WIDE_EVERY) {
            Look {
                from: self.wide_from,
                moves_wide: true,
            }
        } else {
            Look {
                from: self.short_from,
                moves_wide: false,
            }
        }
    }

    /// Takes in a pass that looked as `look` said, at `now`: `at`, the
    /// database's time of the pass (`None`: another process had it);
    /// `caught_up`, whether it found fewer expired leases than its limit;
    /// `oldest_left`, the earliest one it found and had to leave.
    pub(crate) fn passed(
        &mut self,
        look: Look,
        at: Option<SystemTime>,
        caught_up: bool,
        oldest_left: Option<SystemTime>,
        now: Instant,
    ) {
        let Some(at) = at else {
            return; // another process did the pass: nothing was looked at
        };
        if !caught_up {
            return; // more past the start: the next pass of the kind starts there again
        }
        let back = |by: Duration| {
            let next = at.checked_sub(by).unwrap_or(at);
            oldest_left.map_or(next, |left| left.min(next))
        };
        self.short_from = Some(back(SHORT_BACK));
        // A short pass leaves the wide start alone: it looked at nothing
        // before its own start, which is after the wide one.
        if look.moves_wide {
            self.wide_from = Some(back(WIDE_BACK));
            self.last_wide = Some(now);
            if look.from.is_none() {
                self.last_full = Some(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_full_look_first_then_short_ones_and_a_wide_one_each_wide_period() {
        let start = Instant::now();
        let mut floor = RecoveryFloor::new();
        let full = floor.look(start);
        assert_eq!(full.from, None);
        floor.passed(full, Some(t(100)), true, None, start);

        let short = floor.look(start + secs(1));
        assert_eq!(short.from, Some(t(99)), "SHORT_BACK before the last pass");
        floor.passed(short, Some(t(101)), true, None, start + secs(1));
        assert_eq!(floor.look(start + secs(2)).from, Some(t(100)));

        let wide = floor.look(start + WIDE_EVERY);
        assert_eq!(
            wide.from,
            Some(t(90)),
            "WIDE_BACK before the last wide pass"
        );
        floor.passed(wide, Some(t(120)), true, None, start + WIDE_EVERY);
        assert_eq!(floor.look(start + WIDE_EVERY + secs(1)).from, Some(t(119)));
        assert_eq!(floor.look(start + WIDE_EVERY * 2).from, Some(t(110)));
        assert_eq!(floor.look(start + FULL_EVERY).from, None, "then all again");
    }

    #[test]
    fn a_pass_that_did_not_catch_up_or_ran_elsewhere_keeps_its_start() {
        let start = Instant::now();
        let mut floor = RecoveryFloor::new();
        floor.passed(floor.look(start), Some(t(100)), true, None, start);
        let short = floor.look(start + secs(1));
        floor.passed(short, Some(t(200)), false, None, start + secs(1));
        assert_eq!(
            floor.look(start + secs(2)).from,
            Some(t(99)),
            "more past 99"
        );
        floor.passed(short, None, true, None, start + secs(2));
        assert_eq!(
            floor.look(start + secs(3)).from,
            Some(t(99)),
            "another process passed"
        );

        let wide = floor.look(start + WIDE_EVERY);
        assert_eq!(wide.from, Some(t(90)));
        floor.passed(wide, Some(t(300)), false, None, start + WIDE_EVERY);
        assert_eq!(
            floor.look(start + WIDE_EVERY + secs(1)).from,
            Some(t(90)),
            "a wide pass that did not catch up is wide again"
        );
        // Not caught up on the first pass: still a full one next.
        let mut fresh = RecoveryFloor::new();
        fresh.passed(fresh.look(start), Some(t(100)), false, None, start);
        assert_eq!(fresh.look(start).from, None);
    }

    #[test]
    fn a_lease_left_behind_holds_both_starts_and_a_full_pass_comes_back() {
        let start = Instant::now();
        let mut floor = RecoveryFloor::new();
        floor.passed(floor.look(start), Some(t(100)), true, Some(t(20)), start);
        assert_eq!(
            floor.look(start + secs(1)).from,
            Some(t(20)),
            "the busy key's lease"
        );
        assert_eq!(floor.look(start + WIDE_EVERY).from, Some(t(20)));
        assert_eq!(floor.look(start + FULL_EVERY).from, None, "then all again");

        // A lease a short pass leaves holds the short start; the wide one
        // is before it already.
        let mut floor = RecoveryFloor::new();
        floor.passed(floor.look(start), Some(t(100)), true, None, start);
        let short = floor.look(start + secs(1));
        floor.passed(short, Some(t(101)), true, Some(t(99)), start + secs(1));
        assert_eq!(floor.look(start + secs(2)).from, Some(t(99)));
        assert_eq!(floor.look(start + WIDE_EVERY).from, Some(t(90)));
    }
}

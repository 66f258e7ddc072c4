//! Where a shard's next lease recovery pass starts looking: at the lease
//! floor, or (a full pass) at the oldest lease.
//!
//! While a long transaction holds the xmin horizon, the lease index keeps
//! an entry, expired, for the running version of every job finished since;
//! a pass that starts at the oldest lease walks them all, every second,
//! and the shard spends its CPU on that walk. So a pass starts at the
//! shard's lease floor, which upkeep moves (by any process:
//! `store::upkeep::move_lease_floor`). Every `FULL_EVERY` one pass looks
//! at all of them again, for what the floor's argument leaves out (a
//! database clock stepped back by more than a lease; a lease written
//! below the floor by something other than shardq's claims and
//! extensions).

use crate::store::upkeep::{RecoveryPass, RecoveryStart};
use std::time::{Duration, Instant};

/// How often a pass looks at every expired lease.
pub(crate) const FULL_EVERY: Duration = Duration::from_secs(300);

/// When this process last looked at every expired lease of one shard.
#[derive(Debug)]
pub(crate) struct FullRecovery {
    last_full: Option<Instant>,
}

impl FullRecovery {
    pub(crate) fn new() -> Self {
        FullRecovery { last_full: None }
    }

    /// Where the next pass starts, as of `now`: at the oldest lease on
    /// this process's first pass and every [`FULL_EVERY`], else at the
    /// shard's lease floor.
    pub(crate) fn start(&self, now: Instant) -> RecoveryStart {
        match self.last_full {
            Some(full) if now.duration_since(full) < FULL_EVERY => RecoveryStart::LeaseFloor,
            _ => RecoveryStart::Oldest,
        }
    }

    /// Takes in a pass that started at `start` (what [`Self::start`] said)
    /// and ended as `pass` says, at `now`.
    pub(crate) fn passed(&mut self, start: RecoveryStart, pass: &RecoveryPass, now: Instant) {
        // Another process had the lock (nothing was looked at), or more
        // were left than one pass takes: the next pass is full again.
        if start == RecoveryStart::Oldest && pass.at.is_some() && pass.caught_up {
            self.last_full = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn pass(at: bool, caught_up: bool) -> RecoveryPass {
        RecoveryPass {
            at: at.then(SystemTime::now),
            caught_up,
            ..RecoveryPass::default()
        }
    }

    #[test]
    fn the_first_pass_looks_at_every_lease_then_from_the_floor() {
        let start = Instant::now();
        let mut full = FullRecovery::new();
        assert_eq!(full.start(start), RecoveryStart::Oldest);
        full.passed(RecoveryStart::Oldest, &pass(true, true), start);
        assert_eq!(full.start(start), RecoveryStart::LeaseFloor);
        full.passed(RecoveryStart::LeaseFloor, &pass(true, true), start);
        assert_eq!(full.start(start), RecoveryStart::LeaseFloor);
    }

    #[test]
    fn a_full_pass_that_did_not_catch_up_or_ran_elsewhere_comes_again() {
        let start = Instant::now();
        let mut full = FullRecovery::new();
        full.passed(RecoveryStart::Oldest, &pass(true, false), start);
        assert_eq!(full.start(start), RecoveryStart::Oldest, "more to do");
        full.passed(RecoveryStart::Oldest, &pass(false, true), start);
        assert_eq!(
            full.start(start),
            RecoveryStart::Oldest,
            "another process passed"
        );
    }

    #[test]
    fn a_full_pass_comes_back_every_full_every() {
        let start = Instant::now();
        let mut full = FullRecovery::new();
        full.passed(RecoveryStart::Oldest, &pass(true, true), start);
        assert_eq!(
            full.start(start + FULL_EVERY / 2),
            RecoveryStart::LeaseFloor
        );
        assert_eq!(full.start(start + FULL_EVERY), RecoveryStart::Oldest);
    }
}

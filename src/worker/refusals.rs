//! A producer's gate refusals in a row: once every target was refused, it
//! waits until the earliest of them reopens, or claims from a suspect shard
//! that still answers (late), since skipping it can help nothing then.
//!
//! Pure state, tested without a database.

use std::time::Instant;

/// What a producer does after a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRefusal {
    /// Visits the next target.
    GoOn,
    /// Every target was refused: waits until then.
    WaitUntil(Instant),
    /// Every target was refused, this one only for its shard being suspect
    /// while it still answers: claims there (see `shard_health`).
    LastResort(usize),
}

/// Refusals in a row.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    count: usize,
    reopens: Option<Instant>,
    /// A target refused in this row only for its shard being suspect while
    /// that shard still answers.
    last_resort: Option<usize>,
}

impl Refusals {
    /// A target was refused until `until`; of `targets` targets.
    /// `last_resort`: it was that target, refused only for its shard being
    /// suspect while that shard still answers. Starts over once all were
    /// refused in a row.
    pub(crate) fn refused(
        &mut self,
        until: Instant,
        targets: usize,
        last_resort: Option<usize>,
    ) -> AfterRefusal {
        self.count += 1;
        let earliest = self.reopens.map_or(until, |r| r.min(until));
        self.reopens = Some(earliest);
        self.last_resort = self.last_resort.or(last_resort);
        if self.count < targets {
            return AfterRefusal::GoOn;
        }
        let last_resort = self.last_resort;
        *self = Refusals::default();
        last_resort.map_or(AfterRefusal::WaitUntil(earliest), AfterRefusal::LastResort)
    }

    /// A target let the producer in.
    pub(crate) fn entered(&mut self) {
        *self = Refusals::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waits_only_once_every_target_was_refused_until_the_earliest_reopens() {
        let now = Instant::now();
        let at = |ms| now + Duration::from_millis(ms);
        let mut r = Refusals::default();
        assert_eq!(r.refused(at(30), 3, None), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(10), 3, None), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(20), 3, None), AfterRefusal::WaitUntil(at(10)));
        // Starts over after a wait.
        assert_eq!(r.refused(at(50), 3, None), AfterRefusal::GoOn);
        // An entered target breaks the streak.
        r.entered();
        assert_eq!(r.refused(at(40), 3, None), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(60), 3, None), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(70), 3, None), AfterRefusal::WaitUntil(at(40)));
    }

    #[test]
    fn a_slow_shards_target_is_claimed_only_once_every_other_target_was_refused() {
        let now = Instant::now();
        let at = |ms| now + Duration::from_millis(ms);
        let mut r = Refusals::default();
        // Target 2's shard answers late; the others are refused too.
        assert_eq!(r.refused(at(30), 3, Some(2)), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(10), 3, None), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(20), 3, None), AfterRefusal::LastResort(2));
        // A target that lets the producer in: skipping the slow one helps.
        assert_eq!(r.refused(at(30), 3, Some(2)), AfterRefusal::GoOn);
        r.entered();
        assert_eq!(r.refused(at(30), 3, None), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(30), 3, None), AfterRefusal::GoOn);
        assert_eq!(r.refused(at(30), 3, None), AfterRefusal::WaitUntil(at(30)));
        // The only target.
        assert_eq!(r.refused(at(30), 1, Some(0)), AfterRefusal::LastResort(0));
    }
}

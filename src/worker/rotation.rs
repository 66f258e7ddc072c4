//! Which target (shard × queue) a producer visits next.
//!
//! Pure bookkeeping with explicit `now`, so it is tested without a database:
//! the order (round robin from a random start) and the backoff of a failing
//! target (exponential, jittered). What the producers learn about busy and
//! empty targets is shared by the whole process in `local_gate`.

use crate::config::Backoff;
use rand::Rng;
use std::time::{Duration, Instant};

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try target `i`.
    Visit(usize),
    /// Every target is skipped until then.
    WaitUntil(Instant),
}

#[derive(Debug, Clone, Default)]
struct TargetState {
    skip_until: Option<Instant>,
    failures: u32,
}

/// Rotation state of one producer over its targets (shard × queue).
#[derive(Debug)]
pub(crate) struct Rotation {
    targets: Vec<TargetState>,
    cursor: usize,
    unhealthy: Backoff,
}

impl Rotation {
    /// A rotation over `count` targets starting at `start`; a failing target
    /// is skipped within `unhealthy` (`dequeue.unhealthy_backoff`).
    pub(crate) fn new(count: usize, start: usize, unhealthy: Backoff) -> Self {
        Rotation {
            targets: vec![TargetState::default(); count],
            cursor: start % count.max(1),
            unhealthy,
        }
    }

    /// The next target to visit, or when one becomes available.
    pub(crate) fn next(&mut self, now: Instant) -> Next {
        let n = self.targets.len();
        for step in 0..n {
            let i = (self.cursor + step) % n;
            if self.available(i, now) {
                self.cursor = (i + 1) % n;
                return Next::Visit(i);
            }
        }
        let earliest = self
            .targets
            .iter()
            .filter_map(|t| t.skip_until)
            .min()
            .unwrap_or(now);
        Next::WaitUntil(earliest)
    }

    fn available(&self, i: usize, now: Instant) -> bool {
        self.targets[i].skip_until.is_none_or(|t| t <= now)
    }

    /// Target `i` gave jobs.
    pub(crate) fn claimed(&mut self, i: usize) {
        self.targets[i] = TargetState::default();
    }

    /// Target `i` failed; returns how long it is skipped.
    pub(crate) fn failed<R: Rng>(&mut self, i: usize, now: Instant, rng: &mut R) -> Duration {
        let t = &mut self.targets[i];
        t.failures = t.failures.saturating_add(1);
        let exp = self
            .unhealthy
            .min
            .saturating_mul(1u32 << (t.failures - 1).min(16));
        let delay = jitter(
            rng,
            exp.min(self.unhealthy.max) / 2,
            exp.min(self.unhealthy.max),
        );
        t.skip_until = Some(now + delay);
        delay
    }
}

/// A uniformly random duration in `[min, max]`, so processes do not synchronise.
pub(crate) fn jitter<R: Rng>(rng: &mut R, min: Duration, max: Duration) -> Duration {
    if max <= min {
        return min;
    }
    rng.gen_range(min..=max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhealthy() -> Backoff {
        Backoff {
            min: Duration::from_millis(100),
            max: Duration::from_millis(1000),
        }
    }

    #[test]
    fn visits_round_robin_from_start() {
        let mut r = Rotation::new(3, 1, unhealthy());
        let now = Instant::now();
        let seq: Vec<_> = (0..4).map(|_| r.next(now)).collect();
        assert_eq!(
            seq,
            vec![
                Next::Visit(1),
                Next::Visit(2),
                Next::Visit(0),
                Next::Visit(1)
            ]
        );
    }

    #[test]
    fn one_failing_target_does_not_idle_the_others() {
        let mut rng = rand::thread_rng();
        let mut r = Rotation::new(3, 0, unhealthy());
        let now = Instant::now();
        r.failed(0, now, &mut rng);
        for _ in 0..6 {
            assert_ne!(r.next(now), Next::Visit(0));
        }
        r.failed(1, now, &mut rng);
        r.failed(2, now, &mut rng);
        match r.next(now) {
            Next::WaitUntil(t) => {
                assert!(
                    t >= now + Duration::from_millis(50) && t <= now + Duration::from_millis(100)
                )
            }
            other => panic!("expected to idle, got {other:?}"),
        }
        assert!(matches!(
            r.next(now + Duration::from_millis(101)),
            Next::Visit(_)
        ));
    }

    #[test]
    fn failures_back_off_exponentially_up_to_max() {
        let mut rng = rand::thread_rng();
        let mut r = Rotation::new(1, 0, unhealthy());
        let now = Instant::now();
        let delays: Vec<_> = (0..6).map(|_| r.failed(0, now, &mut rng)).collect();
        assert!(delays[0] <= Duration::from_millis(100));
        assert!(delays[3] >= Duration::from_millis(400));
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(1000)));
        r.claimed(0);
        assert!(r.failed(0, now, &mut rng) <= Duration::from_millis(100));
    }
}

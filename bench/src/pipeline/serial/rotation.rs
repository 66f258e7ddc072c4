//! Which target (shard × queue) a serial loop visits next, and how long it
//! pauses: the serial baseline's own copy of the rotation the library's
//! worker used before its producers shared busy and empty answers in a
//! process-wide gate (kept here, unchanged, so the baseline stays the same).
//!
//! Pure bookkeeping with explicit `now`, so it is tested without a database.
//! A busy target is skipped at once; an empty one is skipped for a jittered
//! while; a failing one with exponential backoff. A loop idles only when
//! every target is skipped, and pauses (adaptively) only after every available
//! target answered busy in a row.

use rand::Rng;
use shardq::config::{Backoff, DequeueConfig};
use std::time::{Duration, Instant};

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
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
pub struct Rotation {
    targets: Vec<TargetState>,
    cursor: usize,
    busy_streak: usize,
    busy_pause: Duration,
    empty: Backoff,
    busy: Backoff,
    unhealthy: Backoff,
}

impl Rotation {
    /// A rotation over `count` targets starting at `start`.
    pub fn new(count: usize, start: usize, cfg: &DequeueConfig) -> Self {
        Rotation {
            targets: vec![TargetState::default(); count],
            cursor: start % count.max(1),
            busy_streak: 0,
            busy_pause: cfg.busy_backoff.min,
            empty: cfg.empty_backoff,
            busy: cfg.busy_backoff,
            unhealthy: cfg.unhealthy_backoff,
        }
    }

    /// The next target to visit, or when one becomes available.
    pub fn next(&mut self, now: Instant) -> Next {
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
    pub fn claimed(&mut self, i: usize) {
        self.targets[i] = TargetState::default();
        self.busy_streak = 0;
        self.busy_pause = self.busy.min;
    }

    /// Target `i` had a free slot but no ready job.
    pub fn empty<R: Rng>(&mut self, i: usize, now: Instant, rng: &mut R) {
        self.targets[i].failures = 0;
        self.targets[i].skip_until = Some(now + jitter(rng, self.empty.min, self.empty.max));
    }

    /// Target `i` failed; returns how long it is skipped.
    pub fn failed<R: Rng>(&mut self, i: usize, now: Instant, rng: &mut R) -> Duration {
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

    /// Target `i` answered busy. Returns a pause when every available target
    /// has answered busy in a row; the pause doubles while that repeats.
    pub fn busy<R: Rng>(&mut self, _i: usize, now: Instant, rng: &mut R) -> Option<Duration> {
        self.busy_streak += 1;
        let available = (0..self.targets.len())
            .filter(|&i| self.available(i, now))
            .count();
        if self.busy_streak < available.max(1) {
            return None;
        }
        self.busy_streak = 0;
        let pause = jitter(rng, self.busy_pause / 2, self.busy_pause);
        self.busy_pause = (self.busy_pause * 2).min(self.busy.max);
        Some(pause)
    }
}

/// A uniformly random duration in `[min, max]`, so processes do not synchronise.
pub fn jitter<R: Rng>(rng: &mut R, min: Duration, max: Duration) -> Duration {
    if max <= min {
        return min;
    }
    rng.gen_range(min..=max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DequeueConfig {
        let b = |min, max| Backoff {
            min: Duration::from_millis(min),
            max: Duration::from_millis(max),
        };
        DequeueConfig {
            mode: shardq::config::DequeueMode::Gated { slots: 2 },
            adaptive_slots: None,
            batch_size: 10,
            empty_backoff: b(50, 100),
            idle_poll: b(1500, 3000),
            wake_cooldown: Duration::ZERO,
            claim_budget_max: Duration::from_millis(250),
            busy_backoff: b(2, 16),
            unhealthy_backoff: b(100, 1000),
        }
    }

    #[test]
    fn visits_round_robin_from_start() {
        let mut r = Rotation::new(3, 1, &cfg());
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
    fn one_empty_shard_does_not_idle_the_others() {
        let mut rng = rand::thread_rng();
        let mut r = Rotation::new(3, 0, &cfg());
        let now = Instant::now();
        r.empty(0, now, &mut rng);
        for _ in 0..6 {
            assert_ne!(r.next(now), Next::Visit(0));
            assert!(matches!(r.next(now), Next::Visit(_)));
        }
        r.empty(1, now, &mut rng);
        r.empty(2, now, &mut rng);
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
        let mut r = Rotation::new(1, 0, &cfg());
        let now = Instant::now();
        let delays: Vec<_> = (0..6).map(|_| r.failed(0, now, &mut rng)).collect();
        assert!(delays[0] <= Duration::from_millis(100));
        assert!(delays[3] >= Duration::from_millis(400));
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(1000)));
        r.claimed(0);
        assert!(r.failed(0, now, &mut rng) <= Duration::from_millis(100));
    }

    #[test]
    fn busy_pauses_only_after_every_shard_was_busy_and_grows() {
        let mut rng = rand::thread_rng();
        let mut r = Rotation::new(3, 0, &cfg());
        let now = Instant::now();
        assert_eq!(r.busy(0, now, &mut rng), None);
        assert_eq!(r.busy(1, now, &mut rng), None);
        let first = r.busy(2, now, &mut rng).expect("all three busy");
        assert!(first <= Duration::from_millis(2));
        let mut last = first;
        for _ in 0..5 {
            r.busy(0, now, &mut rng);
            r.busy(1, now, &mut rng);
            last = r.busy(2, now, &mut rng).unwrap();
        }
        assert!(last >= Duration::from_millis(8) && last <= Duration::from_millis(16));
        r.claimed(0);
        r.busy(0, now, &mut rng);
        r.busy(1, now, &mut rng);
        assert!(r.busy(2, now, &mut rng).unwrap() <= Duration::from_millis(2));
    }
}

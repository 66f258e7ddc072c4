//! What the producers of one process share about each target (shard × queue).
//!
//! A shard admits at most K claims at once per queue (its advisory-lock
//! slots), and every busy or empty answer is a round trip that burns the CPU
//! the slot holders need: a gate whose misses retry at once spends the
//! shard's CPU on misses instead of claims. So the producers of one process
//! share, per target:
//!
//! - K permits (gated mode): more than K attempts from one process could only
//!   come back busy. K moves with what the target shows (`slot_control`):
//!   up while attempts miss at a steady cost, down when claims slow down;
//! - the busy backoff (gated mode): after a busy answer the whole process
//!   leaves the target alone for a jittered pause that doubles while it stays
//!   busy and resets when the target gives jobs. The first pause is at least
//!   half of what this process's claims there take: the slots are held by
//!   claims as long as those, so a retry sooner could only miss again;
//! - the empty skip (both modes): after an empty answer the whole process
//!   leaves the target alone for a jittered `dequeue.empty_backoff`.
//!
//! A producer refused here moves on to the next target without a round trip.
//! The database therefore sees, per target, at most K attempts at once and
//! about one miss per pause from each process, however many producers it runs
//! (the Windmill puller's coalescing, applied per shard). Ungated mode keeps
//! only the empty skip: it is the plain SKIP LOCKED baseline.

use super::rotation::jitter;
use super::slot_control::{Attempt, SlotControl};
use crate::config::Backoff;
use rand::Rng;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The shared state of every target.
pub(crate) struct LocalGate {
    targets: Vec<Arc<Target>>,
    freed: Arc<Notify>,
    busy: Backoff,
    empty: Backoff,
    /// Least time between a claim that found the target caught up and the
    /// next one a wake-up lets in (`dequeue.wake_cooldown_ms`).
    wake_cooldown: Duration,
}

struct Target {
    /// K and the attempts in flight, in gated mode; none in ungated mode.
    slots: Option<Mutex<Slots>>,
    skip: Mutex<SkipState>,
}

struct Slots {
    in_flight: u32,
    control: SlotControl,
}

struct SkipState {
    /// Left alone until then (busy or empty lately).
    until: Option<Instant>,
    /// Whether `until` is an empty skip (which a wake-up ends).
    empty: bool,
    /// When a claim here last found the target caught up (empty, or fewer
    /// jobs than asked).
    caught_up_at: Option<Instant>,
    /// The next busy pause.
    busy_pause: Duration,
    /// What this process's claims here took lately (a moving average), once
    /// one gave jobs.
    claim_time: Option<Duration>,
}

impl SkipState {
    /// The pause after a busy answer now: the doubling pause, and at least
    /// half a claim's time, within `busy`.
    fn next_busy_pause(&self, busy: Backoff) -> Duration {
        let half_claim = self.claim_time.map_or(Duration::ZERO, |t| t / 2);
        self.busy_pause.max(half_claim).clamp(busy.min, busy.max)
    }

    /// A claim here took `took`: weighs it in at a quarter.
    fn claim_took(&mut self, took: Duration) {
        self.claim_time = Some(match self.claim_time {
            Some(average) => (average * 3 + took) / 4,
            None => took,
        });
    }
}

/// Why the gate refused a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// K attempts of this process are in flight there.
    Full,
    /// The target answered busy or empty lately; left alone until then.
    SkipUntil(Instant),
}

/// A claim attempt in flight on one target. Returns its permit on drop.
pub(crate) struct Entered {
    target: Arc<Target>,
    /// K when it entered (gated mode): the slots its claim tries.
    slots: Option<u32>,
    freed: Arc<Notify>,
    busy: Backoff,
    empty: Backoff,
}

impl LocalGate {
    /// State for `targets` targets: permits each as `slots` says (`None`:
    /// ungated, no permits), busy pauses within `busy`, empty skips within
    /// `empty`.
    pub(crate) fn new(
        targets: usize,
        slots: Option<SlotControl>,
        busy: Backoff,
        empty: Backoff,
    ) -> Self {
        let targets = (0..targets)
            .map(|_| {
                Arc::new(Target {
                    slots: slots.clone().map(|control| {
                        Mutex::new(Slots {
                            in_flight: 0,
                            control,
                        })
                    }),
                    skip: Mutex::new(SkipState {
                        until: None,
                        empty: false,
                        caught_up_at: None,
                        busy_pause: busy.min,
                        claim_time: None,
                    }),
                })
            })
            .collect();
        LocalGate {
            targets,
            freed: Arc::new(Notify::new()),
            busy,
            empty,
            wake_cooldown: Duration::ZERO,
        }
    }

    /// After a claim found a target caught up, a wake-up lets the next claim
    /// in no sooner than `cooldown` later: each notification wakes a
    /// producer in every process, and all but one find nothing, so under a
    /// steady offer answering every one kept the servers' CPU busy.
    pub(crate) fn with_wake_cooldown(mut self, cooldown: Duration) -> Self {
        self.wake_cooldown = cooldown;
        self
    }

    /// Enters target `i` for one claim attempt, unless the gate refuses it.
    pub(crate) fn try_enter(&self, i: usize, now: Instant) -> Result<Entered, Refused> {
        let target = &self.targets[i];
        if let Some(until) = target.skip.lock().expect("gate state").until {
            if now < until {
                return Err(Refused::SkipUntil(until));
            }
        }
        let slots = match &target.slots {
            Some(slots) => {
                let mut slots = slots.lock().expect("gate slots");
                let k = slots.control.slots();
                if slots.in_flight >= k {
                    return Err(Refused::Full);
                }
                slots.in_flight += 1;
                Some(k)
            }
            None => None,
        };
        Ok(Entered {
            target: target.clone(),
            slots,
            freed: self.freed.clone(),
            busy: self.busy,
            empty: self.empty,
        })
    }

    /// Ends the empty skip of target `i` (jobs were announced there); a busy
    /// pause stays.
    pub(crate) fn wake(&self, i: usize) {
        let mut state = self.targets[i].skip.lock().expect("gate state");
        if state.empty {
            let now = Instant::now();
            state.until = state
                .caught_up_at
                .map(|at| at + self.wake_cooldown)
                .filter(|&open| open > now);
            state.empty = false;
        }
    }

    /// Waits until a permit is returned or `until`, whichever is first (a
    /// return between the refusal and this wait is missed; `until` caps that).
    pub(crate) async fn wait(&self, until: Instant) {
        let _ = tokio::time::timeout_at(until.into(), self.freed.notified()).await;
    }
}

impl Entered {
    /// The dequeue slots this attempt's claim tries (gated mode).
    pub(crate) fn slots(&self) -> Option<u32> {
        self.slots
    }

    /// K of this target now (gated mode), after what this attempt taught.
    pub(crate) fn slots_now(&self) -> Option<u32> {
        let slots = self.target.slots.as_ref()?;
        Some(slots.lock().expect("gate slots").control.slots())
    }

    fn record(&self, attempt: Attempt) {
        if let Some(slots) = &self.target.slots {
            slots.lock().expect("gate slots").control.record(attempt);
        }
    }

    /// The target answered busy: the process leaves it alone for a pause
    /// that doubles while this repeats.
    pub(crate) fn busy<R: Rng>(&self, now: Instant, rng: &mut R) {
        self.record(Attempt::Busy);
        let mut state = self.target.skip.lock().expect("gate state");
        let base = state.next_busy_pause(self.busy);
        let pause = jitter(rng, base / 2, base);
        state.until = Some(now + pause);
        state.empty = false;
        state.busy_pause = (base * 2).min(self.busy.max);
    }

    /// The target had a free slot but no ready job: the process leaves it
    /// alone for a jittered empty skip.
    pub(crate) fn empty<R: Rng>(&self, now: Instant, rng: &mut R) {
        self.empty_for(now, rng, self.empty);
    }

    /// [`Entered::empty`] with a skip within `skip` (longer while wake-ups
    /// are heard from the shard).
    pub(crate) fn empty_for<R: Rng>(&self, now: Instant, rng: &mut R, skip: Backoff) {
        let mut state = self.target.skip.lock().expect("gate state");
        state.until = Some(now + jitter(rng, skip.min, skip.max));
        state.empty = true;
        state.caught_up_at = Some(now);
        state.busy_pause = self.busy.min;
    }

    /// The target gave `rows` jobs in one statement of `took`: open to
    /// every producer, no pause.
    pub(crate) fn claimed(&self, rows: usize, took: Duration) {
        self.record(Attempt::Claimed {
            rows: rows.min(u32::MAX as usize) as u32,
            micros: took.as_micros().min(u128::from(u64::MAX)) as u64,
        });
        let mut state = self.target.skip.lock().expect("gate state");
        state.until = None;
        state.empty = false;
        state.busy_pause = self.busy.min;
        state.claim_took(took);
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(slots) = &self.target.slots {
            slots.lock().expect("gate slots").in_flight -= 1;
            self.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn backoff(min: u64, max: u64) -> Backoff {
        Backoff {
            min: ms(min),
            max: ms(max),
        }
    }

    fn gate(targets: usize, slots: Option<u32>) -> LocalGate {
        let fixed = slots.map(|k| SlotControl::new(k, None, 500));
        LocalGate::new(targets, fixed, backoff(4, 16), backoff(50, 100))
    }

    fn skipped_for(gate: &LocalGate, i: usize, now: Instant) -> Duration {
        match gate.try_enter(i, now) {
            Err(Refused::SkipUntil(until)) => until - now,
            other => panic!("expected a skip, got {:?}", other.err()),
        }
    }

    #[test]
    fn a_wake_up_soon_after_a_caught_up_claim_waits_out_the_cooldown() {
        let mut rng = rand::thread_rng();
        let gate = gate(1, None).with_wake_cooldown(ms(50));
        let now = Instant::now();
        gate.try_enter(0, now)
            .unwrap()
            .empty_for(now, &mut rng, backoff(60_000, 60_000));
        gate.wake(0);
        let left = skipped_for(&gate, 0, now);
        assert!(left > ms(0) && left <= ms(50), "{left:?}");
        assert!(gate.try_enter(0, now + ms(50)).is_ok());

        // After a quiet spell a wake-up opens the target at once.
        let long_ago = now - ms(1000);
        gate.try_enter(0, now + ms(50)).unwrap().empty_for(
            long_ago,
            &mut rng,
            backoff(60_000, 60_000),
        );
        gate.wake(0);
        assert!(gate.try_enter(0, now + ms(50)).is_ok());
    }

    #[test]
    fn admits_k_per_target_then_refuses_until_one_returns() {
        let gate = gate(2, Some(2));
        let now = Instant::now();
        let a = gate.try_enter(0, now).expect("first");
        let _b = gate.try_enter(0, now).expect("second");
        assert_eq!(gate.try_enter(0, now).err(), Some(Refused::Full));
        assert!(
            gate.try_enter(1, now).is_ok(),
            "targets have their own permits"
        );
        drop(a);
        assert!(gate.try_enter(0, now).is_ok());
    }

    #[test]
    fn busy_closes_the_target_for_every_producer_with_growing_pauses() {
        let mut rng = rand::thread_rng();
        let gate = gate(2, Some(2));
        let now = Instant::now();
        let mut pauses = Vec::new();
        for round in 0..4 {
            // Rounds 20 ms apart: each starts after the previous pause (<= 16 ms).
            let t = now + ms(20 * round);
            gate.try_enter(0, t).expect("open").busy(t, &mut rng);
            pauses.push(skipped_for(&gate, 0, t));
            assert!(gate.try_enter(1, t).is_ok(), "other targets stay open");
        }
        assert!(pauses[0] <= ms(4));
        assert!(pauses[3] >= ms(8) && pauses[3] <= ms(16), "{pauses:?}");
        let t = now + ms(100);
        gate.try_enter(0, t).unwrap().claimed(500, ms(5));
        gate.try_enter(0, t).unwrap().busy(t, &mut rng);
        assert!(
            skipped_for(&gate, 0, t) <= ms(4),
            "a claim resets the pause"
        );
    }

    #[test]
    fn after_slow_claims_the_first_busy_pause_is_half_a_claim() {
        let mut rng = rand::thread_rng();
        let gate = LocalGate::new(
            2,
            Some(SlotControl::new(2, None, 500)),
            backoff(1, 40),
            backoff(50, 100),
        );
        let now = Instant::now();
        gate.try_enter(1, now).unwrap().busy(now, &mut rng);
        assert!(
            skipped_for(&gate, 1, now) <= ms(1),
            "no claim seen: the minimum"
        );
        for _ in 0..3 {
            gate.try_enter(0, now).unwrap().claimed(500, ms(24));
        }
        gate.try_enter(0, now).unwrap().busy(now, &mut rng);
        let first = skipped_for(&gate, 0, now);
        assert!(first >= ms(6) && first <= ms(12), "{first:?}");
        let t = now + ms(20);
        gate.try_enter(0, t).unwrap().busy(t, &mut rng);
        let second = skipped_for(&gate, 0, t);
        assert!(
            second >= ms(12) && second <= ms(24),
            "doubles from there: {second:?}"
        );
    }

    #[test]
    fn empty_skips_the_target_in_both_modes() {
        let mut rng = rand::thread_rng();
        for slots in [Some(2), None] {
            let gate = gate(2, slots);
            let now = Instant::now();
            gate.try_enter(0, now).unwrap().empty(now, &mut rng);
            let skip = skipped_for(&gate, 0, now);
            assert!(skip >= ms(50) && skip <= ms(100), "{skip:?}");
            assert!(gate.try_enter(0, now + ms(101)).is_ok());
            assert!(gate.try_enter(1, now).is_ok());
        }
    }

    #[test]
    fn an_adaptive_k_admits_more_once_misses_grew_it() {
        let bounds = crate::config::SlotBounds { min: 1, max: 4 };
        let adaptive = SlotControl::new(2, Some(bounds), 500);
        let gate = LocalGate::new(1, Some(adaptive), backoff(0, 0), backoff(50, 100));
        let now = Instant::now();
        let a = gate.try_enter(0, now).unwrap();
        let b = gate.try_enter(0, now).unwrap();
        assert_eq!(a.slots(), Some(2));
        assert_eq!(gate.try_enter(0, now).err(), Some(Refused::Full));
        // A window of full claims at a steady cost, half of them misses.
        let mut rng = rand::thread_rng();
        for _ in 0..6 {
            a.claimed(500, ms(5));
            a.busy(now, &mut rng);
        }
        let c = gate.try_enter(0, now).expect("K is 3 now");
        assert_eq!(c.slots(), Some(3), "its claim tries three slots");
        assert_eq!(gate.try_enter(0, now).err(), Some(Refused::Full));
        drop((a, b, c));
    }

    #[test]
    fn ungated_has_no_permit_limit() {
        let gate = gate(1, None);
        let now = Instant::now();
        let held: Vec<_> = (0..100).map(|_| gate.try_enter(0, now)).collect();
        assert!(held.iter().all(|h| h.is_ok()));
    }

    #[tokio::test]
    async fn a_returned_permit_wakes_a_waiter() {
        let gate = Arc::new(gate(1, Some(1)));
        let held = gate.try_enter(0, Instant::now()).unwrap();
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                gate.wait(started + Duration::from_secs(30)).await;
                started.elapsed()
            })
        };
        tokio::time::sleep(ms(20)).await;
        drop(held);
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    }
}

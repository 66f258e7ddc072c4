//! Adaptive dequeue slots: how many claims (K) one process lets run at once
//! on one target (shard × queue), and so how many advisory-lock slots its
//! claim statements try.
//!
//! A fixed K is wrong both ways (README, "Adaptive K"): where few claimers
//! meet on a shard, K = 2 turns most attempts into lock misses (85-93% in
//! the sweep) and leaves executors idle, so gated lost to plain SKIP LOCKED;
//! where many meet, a large K lets the SKIP LOCKED spiral back in (every
//! claimer steps over the rows the others locked, so a claim's time per row
//! grows with the claimers). So K moves, additive increase / multiplicative
//! decrease, on what this process sees of the target, window by window:
//!
//! - **Contended**: the time per claimed row is more than [`CONTENDED`]
//!   times the best this target showed lately: halve K. The best is
//!   forgotten slowly ([`BASELINE_DRIFT`] per window), so a shard that got
//!   slower for good does not keep K at its floor.
//! - **Missing**: more than [`MISSES_TO_GROW`] of the attempts were lock
//!   misses while claims were no slower than [`UNCONTENDED`] times the
//!   best: one more slot.
//!
//! Only windows whose claims came back full decide: the small claims of a
//! nearly empty queue cost more per row whatever K is.
//!
//! Pure bookkeeping with no clock, so it is tested without a database.

pub(crate) use crate::config::SlotBounds;

/// Attempts (claims and misses) per decision: enough that one slow
/// statement does not halve K, few enough to react within a second or so.
const WINDOW: u32 = 12;
/// Time per row above this many times the best seen: the shard is contended.
/// (On a shared machine a window is often twice as slow as the best for
/// want of CPU alone; the spiral costs tens of times more per row.)
const CONTENDED: f64 = 3.0;
/// Time per row at most this many times the best: more claimers are cheap
/// (kept well below [`CONTENDED`], so K does not climb into the spiral
/// and fall back every few windows).
const UNCONTENDED: f64 = 1.5;
/// Share of lock misses above which a slot is added (when uncontended).
const MISSES_TO_GROW: f64 = 0.3;
/// A claim counts as full with at least this share of its batch: a queue
/// that is nearly empty gains nothing from more claimers.
const FULL_BATCH: f64 = 0.5;
/// The best time per row is raised by this factor every window, so it
/// follows a shard that became slower for good.
const BASELINE_DRIFT: f64 = 1.02;
/// Weight of the newest window in the smoothed time per row: one noisy
/// window on a shared machine moves it only half way.
const SMOOTHING: f64 = 0.5;

/// What one claim attempt found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Attempt {
    /// `rows` jobs claimed in `micros` µs of statement time.
    Claimed { rows: u32, micros: u64 },
    /// Every slot it tried was taken.
    Busy,
}

/// K of one target in one process.
#[derive(Debug, Clone)]
pub(crate) struct SlotControl {
    k: u32,
    bounds: Option<SlotBounds>,
    batch: u32,
    best_us_per_row: Option<f64>,
    /// Time per row, smoothed over windows since K last moved.
    us_per_row: Option<f64>,
    window: Window,
}

#[derive(Debug, Clone, Default)]
struct Window {
    claims: u32,
    busy: u32,
    rows: u64,
    micros: u64,
}

impl SlotControl {
    /// Starts at `initial` slots; fixed when `bounds` is `None`, else moving
    /// within them. `batch` is the claim's batch size.
    pub(crate) fn new(initial: u32, bounds: Option<SlotBounds>, batch: u32) -> Self {
        let k = match bounds {
            Some(b) => initial.clamp(b.min.max(1), b.max.max(1)),
            None => initial.max(1),
        };
        SlotControl {
            k,
            bounds,
            batch: batch.max(1),
            best_us_per_row: None,
            us_per_row: None,
            window: Window::default(),
        }
    }

    /// The slots a claim tries now.
    pub(crate) fn slots(&self) -> u32 {
        self.k
    }

    /// Records one attempt; at the end of a window, moves K. An empty claim
    /// says nothing about contention and is not recorded.
    pub(crate) fn record(&mut self, attempt: Attempt) {
        let Some(bounds) = self.bounds else { return };
        match attempt {
            Attempt::Claimed { rows, micros } => {
                self.window.claims += 1;
                self.window.rows += u64::from(rows);
                self.window.micros += micros;
            }
            Attempt::Busy => self.window.busy += 1,
        }
        if self.window.claims + self.window.busy >= WINDOW {
            let window = std::mem::take(&mut self.window);
            self.decide(window, bounds);
        }
    }

    fn decide(&mut self, w: Window, bounds: SlotBounds) {
        let before = self.k;
        if w.rows == 0 {
            // Only misses: nothing measured, so no slower; more slots help.
            self.k = (self.k + 1).min(bounds.max);
        } else {
            let now = w.micros as f64 / w.rows as f64;
            let cost = self.us_per_row.map_or(now, |c| c + SMOOTHING * (now - c));
            self.us_per_row = Some(cost);
            let best = self
                .best_us_per_row
                .map_or(cost, |b| (b * BASELINE_DRIFT).min(cost));
            self.best_us_per_row = Some(best);
            let misses = f64::from(w.busy) / f64::from(w.claims + w.busy);
            let per_claim = w.rows as f64 / f64::from(w.claims.max(1));
            let full = per_claim >= FULL_BATCH * f64::from(self.batch);
            if !full {
                // A nearly empty queue: its small claims cost more per row
                // whatever K is, so they say nothing about contention.
            } else if cost > CONTENDED * best {
                self.k = (self.k / 2).max(bounds.min.max(1));
            } else if misses > MISSES_TO_GROW && cost <= UNCONTENDED * best {
                self.k = (self.k + 1).min(bounds.max);
            }
        }
        if self.k != before {
            // A new K starts its own measurement.
            self.us_per_row = None;
            tracing::debug!(from = before, to = self.k, "dequeue slots moved");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: SlotBounds = SlotBounds { min: 1, max: 8 };

    fn claimed(rows: u32, us_per_row: u64) -> Attempt {
        Attempt::Claimed {
            rows,
            micros: u64::from(rows) * us_per_row,
        }
    }

    /// One window of `claims` full claims at `us_per_row` and `busy` misses.
    fn window(c: &mut SlotControl, claims: u32, busy: u32, us_per_row: u64) {
        assert_eq!(claims + busy, WINDOW);
        for _ in 0..claims {
            c.record(claimed(500, us_per_row));
        }
        for _ in 0..busy {
            c.record(Attempt::Busy);
        }
    }

    #[test]
    fn misses_at_a_steady_cost_add_slots_up_to_the_max() {
        let mut c = SlotControl::new(2, Some(BOUNDS), 500);
        let mut seen = vec![c.slots()];
        for _ in 0..10 {
            window(&mut c, 6, 6, 10);
            seen.push(c.slots());
        }
        assert_eq!(seen, vec![2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8]);
    }

    #[test]
    fn a_claim_three_times_as_slow_per_row_halves_k_down_to_the_min() {
        let mut c = SlotControl::new(8, Some(BOUNDS), 500);
        window(&mut c, 12, 0, 10);
        assert_eq!(c.slots(), 8, "no misses: K stays");
        window(&mut c, 8, 4, 70);
        assert_eq!(c.slots(), 4);
        window(&mut c, 8, 4, 40);
        assert_eq!(c.slots(), 2);
        window(&mut c, 8, 4, 40);
        window(&mut c, 8, 4, 40);
        assert_eq!(c.slots(), 1, "never below the min");
    }

    #[test]
    fn between_the_thresholds_k_holds() {
        let mut c = SlotControl::new(4, Some(BOUNDS), 500);
        window(&mut c, 6, 6, 10);
        assert_eq!(c.slots(), 5);
        // 2.5x the best: too slow to grow, not slow enough to shrink.
        window(&mut c, 6, 6, 25);
        window(&mut c, 6, 6, 25);
        assert_eq!(c.slots(), 5);
    }

    #[test]
    fn small_claims_do_not_grow_k() {
        let mut c = SlotControl::new(2, Some(BOUNDS), 500);
        for _ in 0..6 {
            c.record(claimed(20, 10));
        }
        for _ in 0..6 {
            c.record(Attempt::Busy);
        }
        assert_eq!(c.slots(), 2, "a nearly empty queue needs no more claimers");
    }

    #[test]
    fn the_best_cost_is_forgotten_slowly() {
        let mut c = SlotControl::new(2, Some(BOUNDS), 500);
        window(&mut c, 12, 0, 10);
        window(&mut c, 6, 6, 10);
        assert_eq!(c.slots(), 3);
        // The shard got 1.9x slower for good: K holds while the best drifts
        // up, then growth resumes once the new cost is within 1.5x of it.
        let grew_after = (0..40).find(|_| {
            window(&mut c, 6, 6, 19);
            c.slots() > 3
        });
        let rounds = grew_after.expect("growth resumes");
        assert!(rounds >= 5, "not at once: {rounds}");
    }

    #[test]
    fn fixed_k_never_moves() {
        let mut c = SlotControl::new(2, None, 500);
        for _ in 0..5 {
            window(&mut c, 6, 6, 10);
        }
        window(&mut c, 12, 0, 100);
        assert_eq!(c.slots(), 2);
    }

    #[test]
    fn only_misses_add_a_slot() {
        let mut c = SlotControl::new(2, Some(BOUNDS), 500);
        window(&mut c, 12, 0, 10);
        window(&mut c, 0, 12, 10);
        assert_eq!(c.slots(), 3);
    }
}

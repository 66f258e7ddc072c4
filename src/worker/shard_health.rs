//! What one process knows about each shard's answers: how long a claim
//! there may keep a producer, whether the shard is skipped, and whether it
//! is sick, so that the executor slots set its buffered jobs aside.
//!
//! A producer never waits on one shard for longer than that shard's
//! [`Health::budget`]: a few times its recent answer time, within
//! [`BUDGET_MIN`] and `dequeue.claim_budget_max_ms`. A claim that is not answered within it
//! (or that fails for a reason that is the shard's, not the target's) makes
//! the shard *suspect* for the whole process: every producer skips it, and one
//! probe, alone in flight and detached from the producers, asks it every
//! [`PROBE_INTERVAL`] whether it answers again; an answer within the budget
//! makes it healthy. The claim that ran out of budget is not dropped (a
//! claim that committed would strand its jobs as running): the producer
//! leaves it to a task of its own and moves on. The process's next claim
//! after that answer goes to the shard first ([`ShardHealth::take_recovered`]).
//!
//! A suspect shard that still answers, only late (its late replies come),
//! is skipped only where skipping helps: a producer that finds no other
//! target to claim from claims there anyway, one such claim at a time per
//! process ([`Health::take_last_resort`]). Its claims are slow, not lost,
//! and it may be the only shard with work: a long transaction holding its
//! xmin horizon slows every claim there while probes, which touch no
//! table, answer at once. A shard whose late claims fail or never answer
//! gets no such claim: only its probe.
//!
//! A shard is *sick* while it is suspect or its completion writes fail (the
//! completer says so): the executor slots then run its buffered jobs only
//! when they have nothing else to run (see `set_aside`).
//!
//! Pure state with an explicit `now`, so it is tested without a database.

use crate::config::Backoff;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest budget (a bound of `dequeue.claim_budget_max_ms`, so the config's).
pub(crate) use crate::config::CLAIM_BUDGET_MIN as BUDGET_MIN;

/// Longest budget by default (`dequeue.claim_budget_max_ms`): one wait this
/// long costs the healthy shards little even with a small buffer (200 jobs
/// on 16 slots of 10 ms jobs last ~125 ms), and it is paid once per
/// episode, since the shard is then skipped. A shard that answers slower
/// than the ceiling is skipped while it does, except as a last resort.
#[cfg(test)]
pub(crate) const BUDGET_MAX: Duration = Duration::from_millis(250);

/// Budget in multiples of the shard's typical answer time: room for the
/// usual spread of a claim's time, not for a stall.
const BUDGET_FACTOR: u32 = 4;

/// Pause between probes of a suspect shard (jittered): frequent enough that
/// a shard is used again well within 2 s of its recovery, rare enough that a
/// sick server sees one statement per process every few hundred ms.
pub(crate) const PROBE_INTERVAL: Backoff = Backoff {
    min: Duration::from_millis(200),
    max: Duration::from_millis(400),
};

/// How often a producer whose every target is skipped (their shards
/// suspect) looks again: half the probe interval, so a shard a probe found
/// well again is used within that.
pub(crate) const SUSPECT_RECHECK: Duration = Duration::from_millis(100);

/// How long a shard must have been suspect, with no answer since, to be
/// judged silent ([`Health::silent`]): longer than a claim late by a
/// stall or a slow moment, shorter than any statement deadline.
pub(crate) const SILENT_AFTER: Duration = Duration::from_secs(1);

/// Longest a probe waits for its answer: a probe sent into a silent or
/// frozen server must end soon, so that the next one sees the recovery
/// (within 2 s of it, with [`PROBE_INTERVAL`]).
pub(crate) const PROBE_DEADLINE: Duration = Duration::from_secs(1);

/// A falling answer time counts this fraction per sample (a rising one half):
/// the typical time follows a high percentile of the recent answers, so one
/// fast answer does not shrink the budget below the usual spread.
const DECAY_DIVISOR: u32 = 16;

/// Whether a shard is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Producers claim there.
    Healthy,
    /// Skipped by every producer since then, until a probe answers in time.
    Suspect { since: Instant },
}

/// One shard's answer times and state.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    /// A high percentile of the recent answer times (none answered yet).
    typical: Option<Duration>,
    state: State,
    /// The budget's ceiling (`dequeue.claim_budget_max_ms`).
    max: Duration,
    /// A probe found it well again and no claim has been sent there since.
    recovered: bool,
    /// Suspect, and a claim past its budget was answered since (late):
    /// the shard answers, slowly.
    answering: bool,
    /// A last-resort claim was sent there and has not ended yet.
    last_resort_in_flight: bool,
}

impl Health {
    /// Healthy and not yet heard from, with budgets up to `max`.
    pub(crate) fn new(max: Duration) -> Self {
        Health {
            typical: None,
            state: State::Healthy,
            max: max.max(BUDGET_MIN),
            recovered: false,
            answering: false,
            last_resort_in_flight: false,
        }
    }

    /// The budget's ceiling.
    pub(crate) fn max(&self) -> Duration {
        self.max
    }

    /// How long a claim here may keep a producer: [`BUDGET_FACTOR`] times
    /// the typical answer, within [`BUDGET_MIN`] and the ceiling; the
    /// ceiling before the first answer (its connection is still to be made).
    pub(crate) fn budget(&self) -> Duration {
        self.typical.map_or(self.max, |t| {
            (t * BUDGET_FACTOR).clamp(BUDGET_MIN, self.max)
        })
    }

    /// Whether producers claim here.
    pub(crate) fn usable(&self) -> bool {
        self.state == State::Healthy
    }

    /// The shard answered after `took` (a claim, in time or late, or a
    /// probe): weighs it into the typical time. Times past the ceiling
    /// count as that: beyond it the budget is capped anyway, and a reply
    /// after a freeze says nothing about how fast the shard answers.
    pub(crate) fn answered(&mut self, took: Duration) {
        let took = took.min(self.max);
        self.typical = Some(match self.typical {
            None => took,
            Some(t) if took > t => t + (took - t) / 2,
            Some(t) => t - (t - took) / DECAY_DIVISOR,
        });
    }

    /// A claim ran out of its budget, or failed for a reason that is the
    /// shard's. Returns whether the shard just became suspect (then one
    /// probe must be started; it was healthy until now).
    pub(crate) fn suspect(&mut self, now: Instant) -> bool {
        match self.state {
            State::Healthy => {
                self.state = State::Suspect { since: now };
                self.recovered = false;
                self.answering = false;
                true
            }
            State::Suspect { .. } => false,
        }
    }

    /// A probe ended: answered after `took`, or not at all (`None`: an
    /// error, or nothing within [`PROBE_DEADLINE`]). Returns whether the
    /// shard is healthy again: it answered within the budget it had.
    pub(crate) fn probed(&mut self, took: Option<Duration>) -> bool {
        let Some(took) = took else {
            return false;
        };
        let in_time = took <= self.budget();
        self.answered(took);
        // Late or not, it answered: not silent.
        self.answering = true;
        if in_time {
            self.state = State::Healthy;
            self.recovered = true;
        }
        in_time
    }

    /// A claim past its budget was answered after `took`: the shard still
    /// answers, however slowly.
    pub(crate) fn answered_late(&mut self, took: Duration) {
        self.answered(took);
        self.answering = true;
    }

    /// A claim past its budget failed, or got no answer by its deadline:
    /// as far as this process knows, the shard stopped answering.
    pub(crate) fn late_failed(&mut self) {
        self.answering = false;
    }

    /// How long the shard has been suspect at `now`: zero while healthy.
    pub(crate) fn suspect_for(&self, now: Instant) -> Duration {
        match self.state {
            State::Suspect { since } => now.saturating_duration_since(since),
            State::Healthy => Duration::ZERO,
        }
    }

    /// Whether the shard has been suspect for [`SILENT_AFTER`] or more at
    /// `now` and nothing has answered since, neither a late claim nor a
    /// probe: as far as this process knows, it does not answer at all. A
    /// claim late by a moment is not enough: a call to a silent shard is
    /// not made, and one in flight is given up.
    pub(crate) fn silent(&self, now: Instant) -> bool {
        !self.usable() && !self.answering && self.suspect_for(now) >= SILENT_AFTER
    }

    /// Whether a producer that found no other target to claim from may
    /// claim here: the shard is suspect, still answers (late), and no
    /// other such claim of this process is in flight there.
    pub(crate) fn last_resort(&self) -> bool {
        !self.usable() && self.answering && !self.last_resort_in_flight
    }

    /// Takes the one last-resort claim of this process here, if
    /// [`Health::last_resort`] allows it; [`Health::last_resort_ended`]
    /// gives it back.
    pub(crate) fn take_last_resort(&mut self) -> bool {
        let allowed = self.last_resort();
        self.last_resort_in_flight |= allowed;
        allowed
    }

    /// The last-resort claim taken was not sent after all.
    pub(crate) fn untake_last_resort(&mut self) {
        self.last_resort_in_flight = false;
    }

    /// The last-resort claim ended: answered after `took` (in time or
    /// late), or not at all (`None`). An answer within the budget makes the
    /// shard healthy again, as a probe's would.
    pub(crate) fn last_resort_ended(&mut self, took: Option<Duration>) {
        self.last_resort_in_flight = false;
        let Some(took) = took else {
            self.late_failed();
            return;
        };
        if took <= self.budget() {
            self.answered(took);
            self.state = State::Healthy;
        } else {
            self.answered_late(took);
        }
    }

    /// Whether a probe found the shard well again and no claim was sent
    /// there since; clears it (the priority is for one claim).
    fn take_recovered(&mut self) -> bool {
        std::mem::take(&mut self.recovered) && self.usable()
    }
}

/// The [`Health`] of every shard of one process.
#[derive(Debug)]
pub(crate) struct ShardHealth {
    shards: Vec<Mutex<Health>>,
    /// Per shard: its last completion write failed (set and cleared by the
    /// completer; cleared too by a probe answered in time).
    writes_failing: Vec<AtomicBool>,
}

impl ShardHealth {
    /// For `shards` shards, each healthy and not yet heard from, with
    /// budgets up to `max`.
    pub(crate) fn new(shards: usize, max: Duration) -> Self {
        ShardHealth {
            shards: (0..shards).map(|_| Mutex::new(Health::new(max))).collect(),
            writes_failing: (0..shards).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// How long a probe waits for its answer: [`PROBE_DEADLINE`], or twice
    /// the ceiling where that is longer (a far shard's answer must fit).
    pub(crate) fn probe_deadline(&self) -> Duration {
        let max = self
            .shards
            .first()
            .map_or(BUDGET_MIN, |h| h.lock().expect("shard health").max());
        PROBE_DEADLINE.max(max * 2)
    }

    /// Runs `f` on shard `shard`'s health.
    pub(crate) fn with<T>(&self, shard: usize, f: impl FnOnce(&mut Health) -> T) -> T {
        f(&mut self.shards[shard].lock().expect("shard health"))
    }

    /// See [`Health::budget`].
    pub(crate) fn budget(&self, shard: usize) -> Duration {
        self.with(shard, |h| h.budget())
    }

    /// See [`Health::usable`].
    pub(crate) fn usable(&self, shard: usize) -> bool {
        self.with(shard, |h| h.usable())
    }

    /// See [`Health::suspect_for`], now.
    pub(crate) fn suspect_for(&self, shard: usize) -> Duration {
        self.with(shard, |h| h.suspect_for(Instant::now()))
    }

    /// See [`Health::silent`], now.
    pub(crate) fn silent(&self, shard: usize) -> bool {
        self.with(shard, |h| h.silent(Instant::now()))
    }

    /// See [`Health::last_resort`].
    pub(crate) fn last_resort(&self, shard: usize) -> bool {
        self.with(shard, |h| h.last_resort())
    }

    /// A probe of suspect shard `shard` ended (see [`Health::probed`]);
    /// returns whether it is healthy again. An answer in time also ends
    /// its failing writes: the completer's next try is on its way, and the
    /// slots need not set the shard's jobs aside until that retry's pause
    /// (up to 2 s) is over.
    pub(crate) fn probed(&self, shard: usize, took: Option<Duration>) -> bool {
        let well = self.with(shard, |h| h.probed(took));
        if well {
            self.writes_succeeded(shard);
        }
        well
    }

    /// A shard a probe found well again that no claim has been sent to
    /// since, if any; the priority is for one claim (the caller's).
    pub(crate) fn take_recovered(&self) -> Option<usize> {
        (0..self.shards.len()).find(|&shard| self.with(shard, Health::take_recovered))
    }

    /// A completion write on shard `shard` failed (it is retried).
    pub(crate) fn write_failed(&self, shard: usize) {
        self.writes_failing[shard].store(true, Ordering::Relaxed);
    }

    /// A completion write on shard `shard` was answered.
    pub(crate) fn writes_succeeded(&self, shard: usize) {
        self.writes_failing[shard].store(false, Ordering::Relaxed);
    }

    /// Whether shard `shard` is sick: suspect, or its completion writes
    /// fail. The executor slots set its jobs aside meanwhile.
    pub(crate) fn sick(&self, shard: usize) -> bool {
        self.writes_failing[shard].load(Ordering::Relaxed) || !self.usable(shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_budget_is_the_longest_before_any_answer_then_follows_the_answers_within_bounds() {
        let mut h = Health::new(BUDGET_MAX);
        assert_eq!(h.budget(), BUDGET_MAX);
        h.answered(5 * MS);
        assert_eq!(h.budget(), BUDGET_MIN, "4 × 5 ms is below the floor");
        for _ in 0..10 {
            h.answered(40 * MS);
        }
        let b = h.budget();
        assert!(b > 150 * MS && b <= 160 * MS, "about 4 × 40 ms: {b:?}");
        h.answered(Duration::from_secs(8));
        assert_eq!(h.budget(), BUDGET_MAX, "capped");
    }

    #[test]
    fn the_typical_time_rises_fast_and_falls_slowly() {
        let mut h = Health::new(BUDGET_MAX);
        h.answered(10 * MS);
        h.answered(90 * MS);
        // Half of the rise at once.
        assert_eq!(h.typical, Some(50 * MS));
        h.answered(10 * MS);
        // A sixteenth of the fall.
        assert_eq!(h.typical, Some(50 * MS - 40 * MS / 16));
    }

    #[test]
    fn a_late_answer_counts_at_most_as_the_longest_budget() {
        let mut h = Health::new(BUDGET_MAX);
        h.answered(Duration::from_secs(12));
        assert_eq!(h.typical, Some(BUDGET_MAX));
    }

    #[test]
    fn a_shard_becomes_suspect_once_and_only_a_probe_in_time_makes_it_healthy() {
        let now = Instant::now();
        let mut h = Health::new(BUDGET_MAX);
        h.answered(5 * MS);
        assert!(h.usable());
        assert!(h.suspect(now), "the first suspicion starts the probe");
        assert!(!h.suspect(now + MS), "a second one does not start another");
        assert_eq!(h.state, State::Suspect { since: now });
        assert!(!h.usable());
        // No answer, then answers slower than the budget: still skipped.
        assert!(!h.probed(None));
        assert!(!h.probed(Some(300 * MS)));
        assert!(!h.usable());
        // An answer in time ends it.
        assert!(h.probed(Some(2 * MS)));
        assert!(h.usable());
        assert!(h.suspect(now + 10 * MS), "a new episode starts a new probe");
    }

    #[test]
    fn a_shard_is_unanswering_from_its_suspicion_until_a_probe_answers_in_time() {
        let now = Instant::now();
        let mut h = Health::new(BUDGET_MAX);
        h.answered(5 * MS);
        assert_eq!(h.suspect_for(now), Duration::ZERO);
        h.suspect(now);
        assert_eq!(h.suspect_for(now + 40 * MS), 40 * MS);
        h.suspect(now + 50 * MS);
        assert_eq!(
            h.suspect_for(now + 90 * MS),
            90 * MS,
            "counted from the first suspicion"
        );
        assert!(h.probed(Some(2 * MS)));
        assert_eq!(h.suspect_for(now + 100 * MS), Duration::ZERO);
    }

    #[test]
    fn a_shard_that_keeps_answering_slower_than_the_longest_budget_stays_skipped() {
        let now = Instant::now();
        let mut h = Health::new(BUDGET_MAX);
        h.answered(5 * MS);
        h.suspect(now);
        // 300 ms per reply: the typical time climbs to the cap, the budget
        // with it, and still no probe is in time.
        for _ in 0..50 {
            assert!(!h.probed(Some(300 * MS)));
        }
        assert_eq!(h.budget(), BUDGET_MAX);
        assert!(!h.usable());
    }

    #[test]
    fn a_consistently_slower_shard_gets_a_larger_budget_and_stays_in_use() {
        let now = Instant::now();
        let mut h = Health::new(BUDGET_MAX);
        h.answered(5 * MS);
        h.suspect(now);
        // 60 ms answers are within the first budget (100 ms) ...
        assert!(h.probed(Some(60 * MS)));
        // ... and the budget grows with them: 60 ms is usual here.
        for _ in 0..10 {
            h.answered(60 * MS);
        }
        assert!(h.budget() >= 200 * MS, "{:?}", h.budget());
    }

    #[test]
    fn a_suspect_shard_is_a_last_resort_only_while_its_late_claims_answer() {
        let now = Instant::now();
        let mut h = Health::new(BUDGET_MAX);
        h.answered(5 * MS);
        assert!(!h.last_resort(), "a healthy shard is claimed from anyway");
        h.suspect(now);
        assert!(!h.last_resort(), "not heard from since: maybe silent");
        h.answered_late(400 * MS);
        assert!(h.take_last_resort());
        assert!(!h.take_last_resort(), "one at a time");
        // Answered late again: still a last resort, still suspect.
        h.last_resort_ended(Some(400 * MS));
        assert!(!h.usable());
        assert!(h.take_last_resort());
        // No answer by its deadline: no more until a late answer comes.
        h.last_resort_ended(None);
        assert!(!h.last_resort());
        h.answered_late(400 * MS);
        assert!(h.last_resort());
        h.late_failed();
        assert!(!h.last_resort(), "a late claim that failed ends it too");
    }

    #[test]
    fn a_shard_is_silent_once_suspect_a_while_and_unheard_from() {
        let now = Instant::now();
        let later = now + SILENT_AFTER;
        let mut h = Health::new(BUDGET_MAX);
        h.answered(5 * MS);
        assert!(!h.silent(later), "healthy");
        h.suspect(now);
        assert!(!h.silent(now + 100 * MS), "late by a moment only");
        assert!(h.silent(later), "suspect a while, no answer since");
        h.answered_late(400 * MS);
        assert!(!h.silent(later), "slow, but it answers");
        h.late_failed();
        assert!(h.silent(later));
        assert!(
            !h.probed(Some(2 * BUDGET_MAX)),
            "a late probe: still suspect"
        );
        assert!(!h.silent(later), "but it answers");
        assert!(h.probed(Some(5 * MS)));
        assert!(!h.silent(later + SILENT_AFTER), "healthy again");
    }

    #[test]
    fn a_last_resort_claim_answered_in_time_makes_the_shard_healthy() {
        let now = Instant::now();
        let mut h = Health::new(BUDGET_MAX);
        h.answered(5 * MS);
        h.suspect(now);
        h.answered_late(300 * MS);
        assert!(h.take_last_resort());
        h.last_resort_ended(Some(10 * MS));
        assert!(h.usable());
        assert!(!h.last_resort(), "healthy: claimed from as usual");
        // A new episode starts unheard from.
        h.suspect(now + MS);
        assert!(!h.last_resort());
    }

    #[test]
    fn shards_are_independent() {
        let health = ShardHealth::new(2, BUDGET_MAX);
        health.with(0, |h| h.suspect(Instant::now()));
        assert!(!health.usable(0));
        assert!(health.usable(1));
        assert_eq!(health.budget(1), BUDGET_MAX);
    }

    #[test]
    fn a_shard_found_well_again_is_first_for_one_claim() {
        let health = ShardHealth::new(3, BUDGET_MAX);
        assert_eq!(health.take_recovered(), None, "none was ever sick");
        for shard in [1, 2] {
            health.with(shard, |h| h.suspect(Instant::now()));
        }
        assert!(!health.probed(1, None));
        assert_eq!(health.take_recovered(), None, "still suspect");
        assert!(health.probed(2, Some(MS)));
        assert_eq!(health.take_recovered(), Some(2));
        assert_eq!(health.take_recovered(), None, "one claim only");
        // Well again, then suspect before any claim went there: no priority.
        assert!(health.probed(1, Some(MS)));
        health.with(1, |h| h.suspect(Instant::now()));
        assert_eq!(health.take_recovered(), None);
    }

    #[test]
    fn a_shard_is_sick_while_suspect_or_while_its_writes_fail() {
        let health = ShardHealth::new(2, BUDGET_MAX);
        assert!(!health.sick(0));
        health.write_failed(0);
        assert!(health.sick(0) && health.usable(0), "claims still go there");
        assert!(!health.sick(1));
        health.writes_succeeded(0);
        assert!(!health.sick(0));
        health.write_failed(0);
        health.with(0, |h| h.suspect(Instant::now()));
        assert!(health.sick(0));
        assert!(health.probed(0, Some(MS)));
        assert!(
            !health.sick(0),
            "a probe in time ends the failing writes too"
        );
    }

    #[test]
    fn a_raised_ceiling_lets_a_far_shard_answer_in_time() {
        // A shard 300 ms away: with the default ceiling every claim there
        // runs out of budget; with a ceiling of 2 s it keeps being used.
        let far = 300 * MS;
        let mut default = Health::new(BUDGET_MAX);
        default.answered(far);
        assert!(default.budget() < far);
        let mut raised = Health::new(2_000 * MS);
        raised.answered(far);
        assert_eq!(raised.budget(), 1_200 * MS, "4 x its answer time");
        assert!(
            raised.probed(Some(far)),
            "a probe answered in 300 ms is in time"
        );
        let health = ShardHealth::new(1, 2_000 * MS);
        assert_eq!(health.probe_deadline(), 4_000 * MS);
        assert_eq!(
            ShardHealth::new(1, BUDGET_MAX).probe_deadline(),
            PROBE_DEADLINE
        );
    }
}

//! The chaos run's summary: what was done, what the rows say, and the
//! invariants with PASS/FAIL, as a table on stdout and as JSON.

use super::faults::{Event, Fault, When};
use super::profile::Profile;
use super::torture::order::OrderChecks;
use super::torture::progress::{Stall, HEALTHY_LAG_LIMIT, HEALTHY_STALL_LIMIT};
use super::torture::sampler::Samples;
use super::torture::ticks::TickChecks;
use super::torture::waits_check::WaitChecks;
use super::verify::Checks;
use serde::Serialize;

/// Invariant: every requested job was acknowledged.
pub const ENQUEUED: &str = "requested jobs enqueued";
/// Invariant: every kind of fault was injected at least once.
pub const FAULTS_MISSING: &str = "fault kinds never injected";
/// Invariant: every acknowledged job has a row, and every row finished.
pub const LOST: &str = "lost (no row, or unfinished)";
/// Invariant: one row per job, and its completion is its last attempt's.
pub const COMPLETED_TWICE: &str = "completed more than once";
/// Invariant: no row that nobody enqueued.
pub const FOREIGN_ROWS: &str = "rows nobody enqueued";
/// Invariant: no side effect of a step from an attempt after its record.
pub const STEP_AGAIN: &str = "recorded steps applied again";
/// Invariant: a step runs at most once per attempt.
pub const STEP_TWICE: &str = "step applied twice in one attempt";
/// Invariant: a recorded step's recording attempt applied its side effect.
pub const STEP_NO_EFFECT: &str = "recorded steps without their effect";
/// Invariant: a succeeded workflow has all its steps recorded.
pub const MISSING_STEP: &str = "succeeded workflows missing a step";
/// Invariant: no worker process crashed or failed its graceful stop.
pub const WORKER_EXITS: &str = "unexpected worker exits";
/// Torture invariant: jobs of one (queue, key) start in id order, retries included.
pub const OUT_OF_ORDER: &str = "keyed runs out of order";
/// Torture invariant: runs of one (queue, key) never overlap.
pub const OVERLAPS: &str = "keyed runs overlapping";
/// Torture invariant: one attempt starts once.
pub const ATTEMPT_TWICE: &str = "attempts started twice";
/// Torture invariant: a succeeded keyed job ran its last attempt to the end.
pub const SUCCEEDED_NO_RUN: &str = "succeeded keyed jobs without their run";
/// Torture invariant: the failures by design happened and were retried.
pub const RETRIED: &str = "keyed jobs failed by design, retried";
/// Torture invariant: the invariant sampler read the shards during the run.
pub const SAMPLES_TAKEN: &str = "invariant samples taken";
/// Torture invariant: no sample found a broken invariant.
pub const SAMPLE_VIOLATIONS: &str = "violations in invariant samples";
/// Torture invariant: no shard without a fault on it stopped finishing jobs.
pub const HEALTHY_STALLS: &str = "healthy shards stalled (> 10 s)";
/// Torture invariant: no shard without a fault on it left due jobs
/// unpromoted or expired leases unrecovered.
pub const HEALTHY_LAGS: &str = "healthy shards' upkeep behind (> 10 s)";
/// Ticks of the schedule run by the worker whose scheduler clock is ahead.
pub const TICKS_EXPECTED: &str = "scheduled ticks due (clock ahead)";
/// Of them (and of those enqueued): dropped, run twice, early, late start.
pub const TICKS_WRONG: &str = "ticks dropped/doubled (clock ahead)";
/// Waiting workflows that did not succeed.
pub const WAITS_UNFINISHED: &str = "waiting workflows not succeeded";
/// Sleeps passed before their wake time (the shard's clock).
pub const WAITS_EARLY: &str = "sleeps passed before their wake time";
/// Waiting workflows' effect steps recorded without one effect of their
/// run, or missing from a succeeded workflow.
pub const WAITS_EFFECTS: &str = "wait effects not once per record";
/// Children not run once, or their result not gathered once as given.
pub const WAITS_CHILDREN: &str = "children or gathered results wrong";
/// Messages lost, received twice, out of order, or unreceived without a timeout.
pub const WAITS_MAIL: &str = "messages lost/doubled/out of order";
/// Sleeps passed and checked.
pub const WAITS_SLEEPS: &str = "sleeps checked";
/// Recvs woken by a send after they parked.
pub const WAITS_WOKEN: &str = "recvs woken by a later send";
/// Recvs that found their message waiting.
pub const WAITS_FOUND: &str = "recvs that found their message";
/// Recvs that timed out.
pub const WAITS_TIMED_OUT: &str = "recvs timed out";
/// Children checked.
pub const WAITS_CHILDREN_RUN: &str = "children checked";
/// Of them, on another shard than their parent's.
pub const WAITS_CHILDREN_ELSEWHERE: &str = "children on another shard";
/// Children's messages (`ctx.send`, mostly across shards) lost, doubled,
/// or not received once by their parent.
pub const WAITS_KID_MAIL: &str = "children's messages lost/doubled";
/// Children's messages received by their parents.
pub const WAITS_KID_MAIL_RUN: &str = "children's messages received";

/// What the run was asked to do.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Chaos or torture.
    pub profile: Profile,
    /// Fault kinds switched off (`--skip-fault`).
    pub skipped_faults: Vec<String>,
    /// Cold keys of the torture workload (`--keys`).
    pub keys: u64,
    /// Shards (servers).
    pub shards: usize,
    /// Worker processes at any time.
    pub workers: usize,
    /// Jobs asked for.
    pub jobs: usize,
    /// Length of the fault phase.
    pub duration_s: u64,
    /// Longest wait for the drain after the fault phase.
    pub drain_timeout_s: u64,
    /// CPUs of this machine (shared by servers, workers and this process).
    pub cpus: usize,
}

/// How often one kind of fault fired.
#[derive(Debug, Clone, Serialize)]
pub struct FaultCount {
    /// Fault name.
    pub fault: &'static str,
    /// Firings that worked.
    pub done: u64,
    /// Firings that failed.
    pub failed: u64,
}

/// One invariant and whether it held.
#[derive(Debug, Clone, Serialize)]
pub struct Invariant {
    /// What must hold.
    pub name: &'static str,
    /// The measured value.
    pub value: u64,
    /// The value it must have (at least, with `at_least`).
    pub expected: u64,
    /// Whether `expected` is a lower bound.
    pub at_least: bool,
    /// Whether it held.
    pub pass: bool,
}

/// Everything the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What was asked.
    pub settings: Settings,
    /// Acknowledged jobs.
    pub enqueued: u64,
    /// Acknowledged workflows among them.
    pub workflows: u64,
    /// Enqueue chunks that failed (their jobs count as unacknowledged).
    pub failed_chunks: u64,
    /// The first enqueue failure.
    pub first_enqueue_error: Option<String>,
    /// Every fault firing.
    pub faults: Vec<Event>,
    /// Firings per kind.
    pub fault_counts: Vec<FaultCount>,
    /// Worker processes started, replacements included.
    pub workers_started: usize,
    /// Worker processes SIGKILLed.
    pub workers_killed: u64,
    /// Worker exits nobody asked for.
    pub unexpected_exits: Vec<String>,
    /// Whether the queue drained before the deadline.
    pub drained: bool,
    /// From the first enqueue until drained (or the deadline).
    pub elapsed_s: f64,
    /// Succeeded jobs per second over `elapsed_s`.
    pub jobs_per_second: f64,
    /// What the rows say.
    pub checks: Checks,
    /// What only the torture run measures.
    pub torture: Option<TortureReport>,
    /// The invariants.
    pub invariants: Vec<Invariant>,
}

/// What the torture run measured besides the chaos checks.
#[derive(Debug, Clone, Serialize)]
pub struct TortureReport {
    /// Per-key order of the keyed runs.
    pub order: OrderChecks,
    /// The invariant samples taken during the run.
    pub samples: Samples,
    /// Each shard's longest stall outside its faults.
    pub stalls: Vec<Stall>,
    /// The ticks of the scheduler whose clock ran ahead.
    pub ticks: TickChecks,
    /// The workflows that sleep, receive messages and gather children.
    pub waits: WaitChecks,
}

impl Summary {
    /// Counts the faults of `schedule` and evaluates the invariants.
    pub fn finish(mut self, schedule: &[(When, Fault)]) -> Summary {
        self.fault_counts = count_faults(schedule, &self.faults);
        let c = &self.checks;
        let must_be = |name, value: u64, expected| Invariant {
            name,
            value,
            expected,
            at_least: false,
            pass: value == expected,
        };
        let at_least = |name, value: u64, expected| Invariant {
            name,
            value,
            expected,
            at_least: true,
            pass: value >= expected,
        };
        let kinds_missing = self.fault_counts.iter().filter(|f| f.done == 0).count() as u64;
        self.invariants = vec![
            must_be(ENQUEUED, self.enqueued, self.settings.jobs as u64),
            must_be(FAULTS_MISSING, kinds_missing, 0),
            must_be(LOST, c.lost(), 0),
            must_be(COMPLETED_TWICE, c.completed_twice(), 0),
            must_be(FOREIGN_ROWS, c.foreign_rows, 0),
            must_be(STEP_AGAIN, count(c.effects_after_record), 0),
            must_be(STEP_TWICE, count(c.repeated_within_attempt), 0),
            must_be(STEP_NO_EFFECT, count(c.recorded_without_effect), 0),
            must_be(MISSING_STEP, count(c.succeeded_missing_steps), 0),
            must_be(WORKER_EXITS, self.unexpected_exits.len() as u64, 0),
        ];
        if let Some(t) = &self.torture {
            let o = &t.order;
            let stalled = t
                .stalls
                .iter()
                .filter(|s| s.longest_s > HEALTHY_STALL_LIMIT.as_secs_f64())
                .count();
            let lag_limit = HEALTHY_LAG_LIMIT.as_secs_f64();
            let lagging = t
                .stalls
                .iter()
                .filter(|s| s.promotion_lag_s.max(s.recovery_lag_s) > lag_limit)
                .count();
            self.invariants.extend([
                must_be(OUT_OF_ORDER, count(o.out_of_order), 0),
                must_be(OVERLAPS, count(o.overlaps), 0),
                must_be(ATTEMPT_TWICE, count(o.attempt_started_twice), 0),
                must_be(SUCCEEDED_NO_RUN, count(o.succeeded_without_run), 0),
                at_least(RETRIED, count(o.retried_by_design), 1),
                at_least(SAMPLES_TAKEN, t.samples.taken, 1),
                must_be(SAMPLE_VIOLATIONS, t.samples.violations, 0),
                must_be(HEALTHY_STALLS, stalled as u64, 0),
                must_be(HEALTHY_LAGS, lagging as u64, 0),
                at_least(TICKS_EXPECTED, t.ticks.expected, 1),
                must_be(TICKS_WRONG, t.ticks.wrong(), 0),
            ]);
            let w = &t.waits;
            self.invariants.extend([
                must_be(WAITS_UNFINISHED, count(w.not_succeeded), 0),
                must_be(WAITS_EARLY, count(w.early_wakes), 0),
                must_be(
                    WAITS_EFFECTS,
                    count(w.effects_wrong + w.missing_effect_steps),
                    0,
                ),
                must_be(WAITS_CHILDREN, w.children_wrong, 0),
                must_be(WAITS_MAIL, w.mail_wrong, 0),
                at_least(WAITS_SLEEPS, count(w.sleeps), 1),
                at_least(WAITS_WOKEN, w.received_after_park, 1),
                at_least(WAITS_FOUND, w.received_waiting, 1),
                at_least(WAITS_TIMED_OUT, w.timed_out, 1),
                at_least(WAITS_CHILDREN_RUN, w.children, 1),
                at_least(WAITS_CHILDREN_ELSEWHERE, w.children_elsewhere, 1),
                must_be(WAITS_KID_MAIL, w.kid_messages_wrong, 0),
                at_least(WAITS_KID_MAIL_RUN, w.kid_messages, 1),
            ]);
        }
        self
    }

    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.invariants.iter().all(|i| i.pass)
    }

    /// Prints the table.
    pub fn print(&self) {
        let s = &self.settings;
        let c = &self.checks;
        println!(
            "\nshardq {:?}: {} shards, {} worker processes, {} jobs, {} s of faults, on {} CPUs shared by all",
            s.profile, s.shards, s.workers, s.jobs, s.duration_s, s.cpus
        );
        if !s.skipped_faults.is_empty() {
            println!("faults switched off: {}", s.skipped_faults.join(", "));
        }
        println!("\n{:<40} {:>8} {:>8}", "fault", "done", "failed");
        for f in &self.fault_counts {
            println!("  {:<38} {:>8} {:>8}", f.fault, f.done, f.failed);
        }
        for e in self.faults.iter().filter(|e| e.error.is_some()) {
            println!(
                "  at {:.1} s {} failed: {}",
                e.at_s,
                e.fault,
                e.error.as_deref().unwrap_or("")
            );
        }
        println!("\n{:<40} {:>8}", "jobs", "");
        let line = |what: &str, value: String| println!("  {what:<38} {value:>8}");
        line("enqueued (acknowledged)", self.enqueued.to_string());
        line("  of them three-step workflows", self.workflows.to_string());
        line("completed (succeeded)", c.succeeded.to_string());
        line("dead", c.dead.to_string());
        line("ended failed or cancelled", c.other_final.to_string());
        line("failed enqueue chunks", self.failed_chunks.to_string());
        line(
            "unacknowledged but written (allowed)",
            c.unacknowledged_written.to_string(),
        );
        line("jobs claimed more than once", c.claimed_again.to_string());
        line("most attempts of one job", c.most_attempts.to_string());
        line("recorded steps", c.recorded_steps.to_string());
        line(
            "re-run unrecorded steps (allowed)",
            c.rerun_steps.to_string(),
        );
        line(
            "effects of never-recorded steps",
            c.unrecorded_effects.to_string(),
        );
        line("worker processes started", self.workers_started.to_string());
        line("worker processes killed", self.workers_killed.to_string());
        line(
            "drained",
            if self.drained { "yes" } else { "NO" }.to_string(),
        );
        println!(
            "  {:<38} {:>8.0} jobs/s ({} jobs in {:.1} s, first enqueue to drained)",
            "throughput", self.jobs_per_second, c.all_succeeded, self.elapsed_s
        );
        if let Some(err) = &self.first_enqueue_error {
            println!("  first enqueue error: {err}");
        }
        for dead in &c.dead_errors {
            println!("  dead: {dead}");
        }
        if let Some(t) = &self.torture {
            t.print();
        }
        println!(
            "\n{:<40} {:>8} {:>8}  result",
            "invariant", "value", "must be"
        );
        for i in &self.invariants {
            let result = if i.pass { "PASS" } else { "FAIL" };
            let expected = if i.at_least {
                format!(">= {}", i.expected)
            } else {
                i.expected.to_string()
            };
            println!("  {:<38} {:>8} {expected:>8}  {result}", i.name, i.value);
        }
        let torture_evidence = self.torture.iter().flat_map(|t| {
            t.order
                .examples
                .iter()
                .chain(&t.samples.first)
                .chain(&t.samples.first_unanswered)
                .chain(&t.ticks.examples)
                .chain(&t.waits.examples)
        });
        for what in self
            .unexpected_exits
            .iter()
            .chain(&c.examples)
            .chain(torture_evidence)
        {
            println!("  evidence: {what}");
        }
        let failed = self.invariants.iter().filter(|i| !i.pass).count();
        if failed == 0 {
            println!("\nPASS: all {} invariants hold", self.invariants.len());
        } else {
            println!(
                "\nFAIL: {failed} of {} invariants failed",
                self.invariants.len()
            );
        }
    }
}

/// A database count as an invariant value.
fn count(value: i64) -> u64 {
    value.max(0) as u64
}

impl TortureReport {
    /// Prints the torture run's own lines.
    fn print(&self) {
        let line = |what: &str, value: String| println!("  {what:<38} {value:>8}");
        let o = &self.order;
        line("distinct keys (strings)", o.distinct_keys.to_string());
        line("keyed runs checked for order", o.checked_runs.to_string());
        line(
            "jobs failed by design, retried",
            o.retried_by_design.to_string(),
        );
        line("invariant samples taken", self.samples.taken.to_string());
        line(
            "shard answers missing from samples",
            self.samples.unanswered.to_string(),
        );
        line(
            "staleness under a fault (excused)",
            self.samples.excused.to_string(),
        );
        line(
            "staleness threshold (ms)",
            self.samples.stale_after_ms.to_string(),
        );
        let t = &self.ticks;
        line(
            "scheduled ticks enqueued (clock ahead)",
            format!("{} of {}", t.enqueued, t.expected),
        );
        line(
            "  dropped / doubled / early",
            format!("{} / {} / {}", t.dropped, t.doubled, t.early),
        );
        let w = &self.waits;
        line("waiting workflows", w.workflows.to_string());
        line(
            "  messages stored / received",
            format!("{} / {}", w.stored, w.received),
        );
        line(
            "  unreceived / refused after a timeout",
            format!("{} / {}", w.unreceived, w.refused),
        );
        line(
            "  children / on another shard / their messages received",
            format!(
                "{} / {} / {}",
                w.children, w.children_elsewhere, w.kid_messages
            ),
        );
        line(
            "  effect re-runs before a record",
            w.effect_reruns.to_string(),
        );
        for (name, n) in &self.samples.by_invariant {
            println!("  violated in samples: {name}: {n}");
        }
        for s in &self.stalls {
            println!(
                "  shard {}: outside its faults: longest stall {:.0} s (at {:.0} s), promotion lag {:.1} s, recovery lag {:.1} s; {} samples, {} failed",
                s.shard,
                s.longest_s,
                s.at_s,
                s.promotion_lag_s,
                s.recovery_lag_s,
                s.samples,
                s.failed_samples
            );
        }
    }
}

/// Firings per fault kind, in schedule order, each kind once.
fn count_faults(schedule: &[(When, Fault)], events: &[Event]) -> Vec<FaultCount> {
    let mut counts: Vec<FaultCount> = Vec::new();
    for (_, fault) in schedule {
        if counts.iter().all(|c| c.fault != fault.name()) {
            counts.push(FaultCount {
                fault: fault.name(),
                done: 0,
                failed: 0,
            });
        }
    }
    for event in events {
        if let Some(count) = counts.iter_mut().find(|c| c.fault == event.fault) {
            match event.error {
                None => count.done += 1,
                Some(_) => count.failed += 1,
            }
        }
    }
    counts
}

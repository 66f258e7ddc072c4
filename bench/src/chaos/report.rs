//! The chaos run's summary: what was done, what the rows say, and the
//! invariants with PASS/FAIL, as a table on stdout and as JSON.

use super::faults::{Event, SCHEDULE};
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

/// What the run was asked to do.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
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
    /// The value it must have.
    pub expected: u64,
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
    /// The invariants.
    pub invariants: Vec<Invariant>,
}

impl Summary {
    /// Counts the faults and evaluates the invariants.
    pub fn finish(mut self) -> Summary {
        self.fault_counts = count_faults(&self.faults);
        let c = &self.checks;
        let must_be = |name, value: u64, expected| Invariant {
            name,
            value,
            expected,
            pass: value == expected,
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
            "\nshardq chaos: {} shards, {} worker processes, {} jobs, {} s of faults, on {} CPUs shared by all",
            s.shards, s.workers, s.jobs, s.duration_s, s.cpus
        );
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
        println!(
            "\n{:<40} {:>8} {:>8}  result",
            "invariant", "value", "must be"
        );
        for i in &self.invariants {
            let result = if i.pass { "PASS" } else { "FAIL" };
            println!(
                "  {:<38} {:>8} {:>8}  {result}",
                i.name, i.value, i.expected
            );
        }
        for what in self.unexpected_exits.iter().chain(&c.examples) {
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

/// Firings per fault kind, in schedule order, each kind once.
fn count_faults(events: &[Event]) -> Vec<FaultCount> {
    let mut counts: Vec<FaultCount> = Vec::new();
    for (_, fault) in SCHEDULE {
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

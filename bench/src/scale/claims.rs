//! The outcomes the benchmark is expected to show, checked against what it
//! measured (medians over repeats). Each says what was expected, what was
//! measured, and whether it held; none changes the exit code.

use super::disturb::Kind;
use super::plan::Mode;
use super::result::{DisturbanceResult, RunResult};
use serde::Serialize;

/// One expected outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    /// Short name.
    pub name: &'static str,
    /// What was expected.
    pub expected: &'static str,
    /// What was measured.
    pub measured: String,
    /// Whether it held (None: informational, or nothing to judge).
    pub held: Option<bool>,
}

/// The median of `values` (0 when empty).
fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let m = values.len() / 2;
    if values.len() % 2 == 1 {
        values[m]
    } else {
        (values[m - 1] + values[m]) / 2.0
    }
}

/// Median of `f` over the good runs of one kind (`sweep`, `latency`) in one cell.
fn cell_of(
    kind: &str,
    runs: &[RunResult],
    mode: Mode,
    shards: usize,
    d: usize,
    f: fn(&RunResult) -> f64,
) -> Option<f64> {
    let v: Vec<f64> = runs
        .iter()
        .filter(|r| {
            r.kind == kind
                && r.ok
                && r.mode == mode
                && r.shards == shards
                && r.dequeuers_per_shard == d
        })
        .map(f)
        .collect();
    (!v.is_empty()).then(|| median(v))
}

/// Median of `f` over the good sweep runs of one cell.
fn cell(
    runs: &[RunResult],
    mode: Mode,
    shards: usize,
    d: usize,
    f: fn(&RunResult) -> f64,
) -> Option<f64> {
    cell_of("sweep", runs, mode, shards, d, f)
}

fn axis(runs: &[RunResult], f: fn(&RunResult) -> usize) -> Vec<usize> {
    let mut v: Vec<usize> = runs.iter().filter(|r| r.kind == "sweep").map(f).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn verdict(parts: &[(String, bool)]) -> (String, Option<bool>) {
    let text = parts
        .iter()
        .map(|(t, _)| t.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let held = (!parts.is_empty()).then(|| parts.iter().all(|(_, ok)| *ok));
    (
        if text.is_empty() {
            "no data".into()
        } else {
            text
        },
        held,
    )
}

/// Judges every claim.
pub fn judge(runs: &[RunResult]) -> Vec<Claim> {
    let shards = axis(runs, |r| r.shards);
    let deq = axis(runs, |r| r.dequeuers_per_shard);
    let tput = |r: &RunResult| r.jobs_per_s;
    let p99 = |r: &RunResult| r.p99();
    let mut flat = Vec::new();
    let mut falls = Vec::new();
    let mut twice = Vec::new();
    let mut latency = Vec::new();
    if let (Some(&lo), Some(&hi)) = (deq.first(), deq.last()) {
        for &n in &shards {
            let series = |m| {
                deq.iter()
                    .filter_map(|&d| cell(runs, m, n, d, tput))
                    .collect::<Vec<_>>()
            };
            let (g, u) = (series(Mode::Gated), series(Mode::Ungated));
            let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            if let Some(gh) = cell(runs, Mode::Gated, n, hi, tput) {
                let share = gh / best(&g).max(1e-9);
                flat.push((
                    format!(
                        "{n} shard(s): {gh:.0} jobs/s at {hi} = {:.0}% of best {:.0}",
                        share * 100.0,
                        best(&g)
                    ),
                    share >= 0.8,
                ));
            }
            if let (Some(ul), Some(uh)) = (
                cell(runs, Mode::Ungated, n, lo, tput),
                cell(runs, Mode::Ungated, n, hi, tput),
            ) {
                falls.push((
                    format!(
                        "{n} shard(s): {ul:.0} → {uh:.0} jobs/s ({:+.0}%), {:.0}% of best",
                        (uh / ul.max(1e-9) - 1.0) * 100.0,
                        uh / best(&u).max(1e-9) * 100.0
                    ),
                    uh <= 0.9 * best(&u),
                ));
            }
            if let (Some(gh), Some(uh)) = (
                cell(runs, Mode::Gated, n, hi, tput),
                cell(runs, Mode::Ungated, n, hi, tput),
            ) {
                twice.push((
                    format!(
                        "{n} shard(s): {gh:.0} vs {uh:.0} jobs/s = {:.2}×",
                        gh / uh.max(1e-9)
                    ),
                    gh >= 2.0 * uh,
                ));
            }
            // Latency is judged on the fixed-rate latency runs when there are
            // any: in a drain, every job waits for the backlog ahead of it.
            let kind = if runs.iter().any(|r| r.kind == "latency") {
                "latency"
            } else {
                "sweep"
            };
            if let (Some(gp), Some(up)) = (
                cell_of(kind, runs, Mode::Gated, n, hi, p99),
                cell_of(kind, runs, Mode::Ungated, n, hi, p99),
            ) {
                latency.push((
                    format!(
                        "{n} shard(s), {kind} runs: p99 {gp:.1} vs {up:.1} ms = {:.2}× lower",
                        up / gp.max(1e-9)
                    ),
                    up >= 5.0 * gp,
                ));
            }
        }
    }
    let mut out = Vec::new();
    let mut add = |name, expected, parts: Vec<(String, bool)>| {
        let (measured, held) = verdict(&parts);
        out.push(Claim {
            name,
            expected,
            measured,
            held,
        });
    };
    add(
        "gated stays flat",
        "at the highest dequeuer count gated keeps >= 80% of its own best throughput",
        flat,
    );
    add(
        "ungated falls",
        "at the highest dequeuer count ungated is >= 10% below its own best",
        falls,
    );
    add(
        "gated >= 2x ungated",
        "at the highest dequeuer count gated throughput >= 2x ungated",
        twice,
    );
    add(
        "gated p99 >= 5x lower",
        "at the highest dequeuer count gated p99 claim latency <= 1/5 of ungated",
        latency,
    );
    // Judged on the ACCESS EXCLUSIVE runs (the expectation); the
    // other disturbances are reported beside them, informational.
    let of_kinds = |wanted: &dyn Fn(Kind) -> bool| -> Vec<(Mode, Kind, &DisturbanceResult)> {
        runs.iter()
            .filter(|r| r.kind == "disturbance" && r.ok)
            .filter_map(|r| r.disturbance.as_ref().map(|d| (r.mode, d.plan.kind, d)))
            .filter(|(_, k, _)| wanted(*k))
            .collect()
    };
    let disturbed = |judged: bool| of_kinds(&|k| k == Kind::AccessExclusive && judged);
    let recovery_text =
        |d: &DisturbanceResult| d.recovery_s.map_or("never".into(), |r| format!("{r:.2} s"));
    let kept = disturbed(true)
        .into_iter()
        .map(|(m, _, d)| {
            (
                format!("{}: others kept {:.0}%", m.name(), d.others_kept * 100.0),
                m != Mode::Gated || d.others_kept >= 0.9,
            )
        })
        .collect();
    add("others keep >= 90%", "under an ACCESS EXCLUSIVE lock on one shard the others keep >= 90% of their throughput (judged on gated)", kept);
    let recovery = disturbed(true)
        .into_iter()
        .map(|(m, _, d)| {
            (
                format!("{}: {}", m.name(), recovery_text(d)),
                m != Mode::Gated || d.recovery_s.is_some_and(|r| r <= 2.0),
            )
        })
        .collect();
    add("gated recovers <= 2 s", "the locked shard is back within 10% of its before level <= 2 s after the lock is released (judged on gated)", recovery);
    sick_shard(&of_kinds(&is_sick), &mut add);
    let others: Vec<String> = of_kinds(&|k| k == Kind::VacuumFull)
        .into_iter()
        .map(|(m, k, d)| {
            format!(
                "{k:?} {}: others kept {:.0}%, recovery {}",
                m.name(),
                d.others_kept * 100.0,
                recovery_text(d)
            )
        })
        .collect();
    if !others.is_empty() {
        out.push(Claim {
            name: "other disturbances",
            expected:
                "VACUUM FULL of one shard: the others keep their throughput; the shard recovers",
            measured: others.join("; "),
            held: None,
        });
    }
    let mut eff = Vec::new();
    for m in [Mode::Gated, Mode::Ungated] {
        for &d in &deq {
            let Some(one) = cell(runs, m, 1, d, tput) else {
                continue;
            };
            let parts: Vec<String> = shards
                .iter()
                .filter(|&&n| n > 1)
                .filter_map(|&n| {
                    cell(runs, m, n, d, tput)
                        .map(|t| format!("{n}: {:.0}%", t / (n as f64 * one) * 100.0))
                })
                .collect();
            if !parts.is_empty() {
                eff.push(format!("{} {d}: {}", m.name(), parts.join(", ")));
            }
        }
    }
    out.push(Claim {
        name: "per-shard efficiency",
        expected: "throughput at N shards / (N x throughput at 1 shard); local shards share this machine's cores, so < 100% is expected",
        measured: if eff.is_empty() { "no data".into() } else { eff.join("; ") },
        held: None,
    });
    out
}

/// A sick shard: a server that stops, answers slowly, goes silent or
/// refuses (issue 21's goal), as opposed to one that is merely locked.
fn is_sick(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Freeze | Kind::Restart | Kind::Slow | Kind::Silent | Kind::Refuse
    )
}

/// Healthy shards keep >= [`SICK_KEPT`] of their rate while one shard is
/// sick, and the sick shard is claimed from again <= [`SICK_RECLAIMED_S`]
/// after it recovers, in every mode.
const SICK_KEPT: f64 = 0.9;
const SICK_RECLAIMED_S: f64 = 2.0;

fn sick_shard(
    runs: &[(Mode, Kind, &DisturbanceResult)],
    add: &mut dyn FnMut(&'static str, &'static str, Vec<(String, bool)>),
) {
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |k| format!("{:.0}%", k * 100.0));
    let kept = runs
        .iter()
        .map(|(m, k, d)| {
            (
                format!("{k:?} {}: {}", m.name(), pct(d.healthy_kept)),
                d.healthy_kept.is_some_and(|h| h >= SICK_KEPT),
            )
        })
        .collect();
    add("healthy keep >= 90% beside a sick shard", "while one shard is frozen, restarting, slow, silent or refusing, the other shards together keep >= 90% of their completions/s (every mode)", kept);
    let back = runs
        .iter()
        .map(|(m, k, d)| {
            let text = d
                .reclaimed_s
                .map_or("never".into(), |r| format!("{r:.2} s"));
            (
                format!("{k:?} {}: {text}", m.name()),
                d.reclaimed_s.is_some_and(|r| r <= SICK_RECLAIMED_S),
            )
        })
        .collect();
    add(
        "sick shard claimed again <= 2 s",
        "the sick shard is claimed from again <= 2 s after it recovers (every mode)",
        back,
    );
}

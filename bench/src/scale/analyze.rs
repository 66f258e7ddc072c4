//! From what a run recorded to its [`RunResult`]: throughput over the
//! measured span, merged latencies, the disturbance's before/during/after and
//! recovery, and the verdict of the exactly-once check.

use super::disturb::{Plan, Window};
use super::measure::{self, Percentiles};
use super::plan::{Load, RunSpec, WARMUP_S};
use super::raw::{self, Raw, Settings};
use super::result::{DisturbanceResult, RunResult};
use super::timeline::{self, Field, Timeline};
use serde_json::json;

/// Step of the plotted throughput (s).
const FINE_S: f64 = 0.25;

/// The before level is measured over at most this long before the
/// disturbance, and never in the warm-up (s): with claims of 500 long jobs
/// a shard completes in bursts, so a disturbance started late (`--disturb-at`)
/// gets a steadier before level.
const BEFORE_S: f64 = 10.0;

/// Recovery: back to at least this fraction of the before level.
pub const RECOVERED: f64 = 0.9;

/// Recovery is judged on a moving average this wide (s), centred, ...
const SMOOTH_S: f64 = 0.5;
/// ... moved in steps of this (s).
const STEP_S: f64 = 0.05;

/// The result of a run that finished.
pub fn result(spec: &RunSpec, s: &Settings, raw: Raw) -> RunResult {
    let n = spec.shards;
    let merged = measure::merge(&raw.output.finals, n);
    let timeline = Timeline::new(&raw.output.samples, raw.go_unix_ms, n);
    let jobs: u64 = raw.enqueued.iter().sum();
    let (measured_s, by_shard) = match spec.load {
        Load::Drain { .. } => {
            let all: Vec<usize> = (0..n).collect();
            let span = drain_span(&timeline, &all, jobs as f64).unwrap_or(0.0);
            let measured = 1.0 - 2.0 * DRAIN_EDGE;
            let by_shard: Vec<f64> = (0..n)
                .map(
                    |i| match drain_span(&timeline, &[i], raw.enqueued[i] as f64) {
                        Some(s) if s > 0.0 => raw.enqueued[i] as f64 * measured / s,
                        _ => 0.0,
                    },
                )
                .collect();
            (span, by_shard)
        }
        Load::Rate { duration_s, .. } => {
            let by_shard = (0..n)
                .map(|i| timeline.rate(i, timeline::completed, WARMUP_S, duration_s))
                .collect();
            (duration_s - WARMUP_S, by_shard)
        }
    };
    let jobs_per_s = match spec.load {
        Load::Drain { .. } if measured_s > 0.0 => {
            jobs as f64 * (1.0 - 2.0 * DRAIN_EDGE) / measured_s
        }
        Load::Drain { .. } => 0.0,
        Load::Rate { .. } => by_shard.iter().sum(),
    };
    let disturbance = match (spec.disturbance, raw.window, spec.load) {
        (Some(plan), Some(window), Load::Rate { duration_s, .. }) => Some(DisturbanceResult {
            fault_statements: raw.fault_statements,
            ..disturbance(&timeline, plan, window, duration_s)
        }),
        _ => None,
    };
    let recovery_s = match &disturbance {
        Some(d) => d.recovery_s.map_or(json!("never"), |r| json!(r)),
        None => serde_json::Value::Null,
    };
    let mut problems: Vec<String> = raw
        .checks
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.ok())
        .map(|(i, c)| {
            format!(
                "shard {i}: enqueued {}, rows {}, succeeded {} ({} on attempt 1), left {}",
                c.enqueued, c.rows, c.succeeded, c.succeeded_first_attempt, c.left
            )
        })
        .collect();
    if merged.fenced > 0 {
        problems.push(format!("{} completions fenced out", merged.fenced));
    }
    if raw.output.finals.len() != spec.processes {
        problems.push(format!(
            "{} of {} final reports",
            raw.output.finals.len(),
            spec.processes
        ));
    }
    RunResult {
        jobs,
        measured_s,
        jobs_per_s,
        jobs_per_s_by_shard: by_shard,
        claim_latency_ms: merged.pickup,
        claim_statement_ms: merged.claim_statement,
        completion_lag_ms: merged.completion_lag,
        lock_miss_rate: measure::lock_miss_rate(&merged.counters),
        empty_rate: measure::empty_rate(&merged.counters),
        counters: merged.counters,
        disturbance,
        recovery_s,
        check: raw.checks,
        fenced: merged.fenced,
        ok: problems.is_empty(),
        error: (!problems.is_empty())
            .then(|| format!("exactly-once check failed: {}", problems.join("; "))),
        seconds: timeline.seconds(),
        fine: fine(&timeline),
        phases: raw.phases,
        loadavg: raw.loadavg,
        cpu_busy: raw.cpu_busy,
        stalls: raw.stalls,
        ..failed(spec, s, String::new())
    }
}

/// Share of a drain's jobs left out at each end of its measured span.
pub const DRAIN_EDGE: f64 = 0.1;

/// Seconds in which the middle `1 - 2 × DRAIN_EDGE` of `jobs` outcomes were
/// written on `shards` (from 10% to 90% done, by the workers' counters): the
/// steady drain rate, without the fleet's ramp-up (processes' first claims)
/// and the tail (the last process finishing its buffer), which would
/// dominate short drains.
fn drain_span(t: &Timeline, shards: &[usize], jobs: f64) -> Option<f64> {
    let start = t.reach(shards, timeline::completed, (jobs * DRAIN_EDGE).max(1.0))?;
    let end = t.reach(shards, timeline::completed, jobs * (1.0 - DRAIN_EDGE))?;
    Some(end - start)
}

/// The result of a run that did not finish.
pub fn failed(spec: &RunSpec, s: &Settings, error: String) -> RunResult {
    RunResult {
        id: spec.id,
        kind: spec.kind,
        mode: spec.mode,
        slots: raw::slots(spec.mode, s),
        shards: spec.shards,
        processes: spec.processes,
        producers_per_process: spec.producers,
        dequeuers_per_shard: spec.dequeuers_per_shard,
        batch: s.batch,
        load: spec.load,
        jobs: 0,
        measured_s: 0.0,
        jobs_per_s: 0.0,
        jobs_per_s_by_shard: Vec::new(),
        claim_latency_ms: Percentiles::default(),
        claim_statement_ms: Vec::new(),
        completion_lag_ms: Percentiles::default(),
        counters: Vec::new(),
        lock_miss_rate: 0.0,
        empty_rate: 0.0,
        disturbance: None,
        recovery_s: serde_json::Value::Null,
        check: Vec::new(),
        fenced: 0,
        ok: false,
        error: Some(error),
        seconds: Vec::new(),
        fine: Vec::new(),
        phases: Default::default(),
        loadavg: String::new(),
        cpu_busy: 0.0,
        stalls: Vec::new(),
    }
}

/// Completions/s by shard in steps of [`FINE_S`].
fn fine(t: &Timeline) -> Vec<(f64, Vec<f64>)> {
    let mut out = Vec::new();
    let mut a = 0.0;
    while a + FINE_S <= t.end() + 1e-9 {
        let rates = (0..t.shards)
            .map(|i| t.rate(i, timeline::completed, a, a + FINE_S))
            .collect();
        out.push((a + FINE_S / 2.0, rates));
        a += FINE_S;
    }
    out
}

fn disturbance(t: &Timeline, plan: Plan, w: Window, end_s: f64) -> DisturbanceResult {
    let rates = |a: f64, b: f64| -> Vec<f64> {
        (0..t.shards)
            .map(|i| t.rate(i, timeline::completed, a, b))
            .collect()
    };
    let before = rates(WARMUP_S.max(w.start_s - BEFORE_S), w.start_s);
    let during = rates(w.start_s, w.end_s);
    let after = rates(w.end_s, end_s);
    let kept_by_shard: Vec<Option<f64>> = (0..t.shards)
        .map(|i| (before[i] > 0.0).then(|| during[i] / before[i]))
        .collect();
    let others = || (0..t.shards).filter(|&i| i != plan.shard);
    let others_kept = others()
        .map(|i| kept_by_shard[i].unwrap_or(0.0))
        .fold(f64::INFINITY, f64::min);
    let healthy_before: f64 = others().map(|i| before[i]).sum();
    let healthy_kept =
        (healthy_before > 0.0).then(|| others().map(|i| during[i]).sum::<f64>() / healthy_before);
    DisturbanceResult {
        plan,
        window: w,
        others_kept: if others_kept.is_finite() {
            others_kept
        } else {
            1.0
        },
        recovery_s: recovery(t, plan.shard, timeline::completed, w, end_s),
        recovery_claims_s: recovery(t, plan.shard, timeline::claimed, w, end_s),
        reclaimed_s: reclaimed(t, plan.shard, w),
        healthy_kept,
        kept_by_shard,
        fault_statements: None,
        before_jobs_per_s: before,
        during_jobs_per_s: during,
        after_jobs_per_s: after,
    }
}

/// A job counts as claimed once the interpolated counter rose this much
/// (interpolation between two samples makes fractions of jobs).
const CLAIMED_AGAIN: f64 = 0.5;

/// Seconds from the end of the disturbance until a job of `shard` is claimed
/// again (to the workers' sampling, 50 ms); None when none is before the
/// last sample. A shard that was claimed from all along (slow replies)
/// reads about 0.
fn reclaimed(t: &Timeline, shard: usize, w: Window) -> Option<f64> {
    let at_end = t.at(shard, timeline::claimed, w.end_s);
    let when = t.reach(&[shard], timeline::claimed, at_end + CLAIMED_AGAIN)?;
    Some((when - w.end_s).max(0.0))
}

/// Seconds from the end of the disturbance until the centred moving average
/// of `field` on `shard` is back to [`RECOVERED`] of its level before; None
/// when that does not happen before `end_s`.
fn recovery(t: &Timeline, shard: usize, field: Field, w: Window, end_s: f64) -> Option<f64> {
    let level = t.rate(shard, field, WARMUP_S.max(w.start_s - BEFORE_S), w.start_s);
    let half = SMOOTH_S / 2.0;
    let mut at = w.end_s;
    while at + half <= end_s {
        if t.rate(shard, field, at - half, at + half) >= RECOVERED * level {
            return Some(at - w.end_s);
        }
        at += STEP_S;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::proto::Sample;
    use shardq::worker::metrics::ShardCountersSnapshot;

    /// One process's samples of one shard's `claimed` counter, (ms, claimed).
    fn timeline(points: &[(f64, u64)]) -> Timeline {
        let samples: Vec<Sample> = points
            .iter()
            .map(|&(ms, claimed)| Sample {
                unix_ms: ms,
                shards: vec![ShardCountersSnapshot {
                    claimed,
                    ..Default::default()
                }],
            })
            .collect();
        Timeline::new(&[samples], 0.0, 1)
    }

    #[test]
    fn reclaimed_is_the_first_claim_after_the_end() {
        // Claims stop at 2 s, the fault ends at 4 s, the next claim is seen
        // in the sample at 5.5 s (claimed between 5.0 and 5.5).
        let t = timeline(&[
            (1000.0, 100),
            (2000.0, 200),
            (4000.0, 200),
            (5000.0, 200),
            (5500.0, 260),
        ]);
        let w = Window {
            start_s: 3.0,
            end_s: 4.0,
        };
        let at = reclaimed(&t, 0, w).expect("claimed again");
        assert!((1.0..=1.5).contains(&at), "{at}");
        // Never claimed again within the run.
        let w = Window {
            start_s: 3.0,
            end_s: 5.6,
        };
        assert_eq!(reclaimed(&t, 0, w), None);
    }
}

//! Which runs one invocation makes, in which order: the sweep over shard
//! counts × dequeuers per shard, each cell gated then ungated (so the modes
//! alternate and drift favours neither), then the disturbance runs.

use super::args::ScaleArgs;
use super::disturb;
use anyhow::{bail, Result};
use serde::Serialize;

/// Seconds at the start of a rate run left out of every window (the fleet
/// ramps up, the first claims find an empty table).
pub const WARMUP_S: f64 = 3.0;

/// Connections a worker process opens per shard beyond one per producer
/// (completion writes, the leaser, maintenance, the empty check).
pub const EXTRA_POOL: usize = 4;

pub use super::mode::Mode;

/// How jobs arrive.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "load", rename_all = "lowercase")]
pub enum Load {
    /// Insert `per_shard` jobs on every shard before the workers start
    /// claiming, then wait until all are done.
    Drain {
        /// Jobs per shard.
        per_shard: usize,
    },
    /// Offer `rate` jobs/s for `duration_s` while the workers run.
    Rate {
        /// Jobs per second, all shards together.
        rate: f64,
        /// Seconds.
        duration_s: f64,
    },
}

/// One run.
#[derive(Debug, Clone, Serialize)]
pub struct RunSpec {
    /// Position in the invocation.
    pub id: usize,
    /// `sweep`, `latency` or `disturbance`.
    pub kind: &'static str,
    /// Dequeue mode.
    pub mode: Mode,
    /// Shards used (the first N).
    pub shards: usize,
    /// Worker processes (W).
    pub processes: usize,
    /// Producers per process (P).
    pub producers: usize,
    /// W × P: claimers that may claim on each shard.
    pub dequeuers_per_shard: usize,
    /// How jobs arrive.
    pub load: Load,
    /// Jobs per shard inserted before the workers start, on top of a rate
    /// load's offer (a drain's backlog is in `load`).
    pub backlog: usize,
    /// The disturbance, if any.
    pub disturbance: Option<disturb::Plan>,
}

/// The ready buffer of a worker process with `producers` producers: room for
/// every producer's claim in flight plus two batches, at least the library's
/// default; or what `--buffer-jobs` says.
pub fn buffer_jobs(producers: usize, batch: u32, given: Option<usize>) -> usize {
    given.unwrap_or_else(|| 4_000usize.max((producers + 2) * batch as usize))
}

/// W and P for `dequeuers` claimers per shard with up to `processes` processes.
pub fn split(dequeuers: usize, processes: usize) -> (usize, usize) {
    let w = processes.min(dequeuers).max(1);
    (w, dequeuers.div_ceil(w).max(1))
}

/// The runs of `args`, in order, and how many shards they need.
pub fn build(args: &ScaleArgs) -> Result<(Vec<RunSpec>, usize)> {
    let q = args.quick;
    let shard_counts = args
        .shards
        .clone()
        .unwrap_or(if q { vec![1, 2] } else { vec![1, 2, 4] });
    let dequeuers =
        args.dequeuers
            .clone()
            .unwrap_or(if q { vec![8, 64] } else { vec![8, 32, 128] });
    if shard_counts.contains(&0)
        || dequeuers.contains(&0)
        || args.processes == 0
        || args.repeat == 0
    {
        bail!("--shards, --dequeuers, --processes and --repeat take positive numbers");
    }
    let loads = match &args.rate {
        Some(rates) => rates
            .iter()
            .map(|&rate| {
                if rate <= 0.0 || args.duration <= 0.0 {
                    bail!("--rate and --duration must be positive");
                }
                Ok(Load::Rate {
                    rate,
                    duration_s: args.duration,
                })
            })
            .collect::<Result<Vec<_>>>()?,
        None => vec![Load::Drain {
            per_shard: args.jobs.unwrap_or(if q { 15_000 } else { 30_000 }),
        }],
    };
    let mut runs = Vec::new();
    let mut push = |kind, mode, shards, dequeuers: usize, load, disturbance: Option<_>| {
        let (w, p) = match (disturbance.is_some(), args.producers) {
            (true, Some(p)) => (args.processes, p),
            _ => split(dequeuers, args.processes),
        };
        let backlog = if disturbance.is_some() {
            args.disturb_backlog
        } else {
            0
        };
        runs.push(RunSpec {
            id: runs.len() + 1,
            kind,
            mode,
            shards,
            processes: w,
            producers: p,
            dequeuers_per_shard: w * p,
            load,
            backlog,
            disturbance,
        });
    };
    let shard_counts = if args.only_disturb {
        Vec::new()
    } else {
        shard_counts
    };
    for &n in &shard_counts {
        for (&d, &load) in dequeuers
            .iter()
            .flat_map(|d| loads.iter().map(move |load| (d, load)))
        {
            let load = match load {
                // The full sweep keeps the backlog at least three times what
                // the fleet can hold claimed, so the claimers contend for
                // several rounds instead of emptying the queue in one.
                Load::Drain { per_shard } if args.jobs.is_none() && !q => {
                    let (w, p) = split(d, args.processes);
                    Load::Drain {
                        per_shard: per_shard
                            .max(3 * w * buffer_jobs(p, args.batch, args.buffer_jobs)),
                    }
                }
                load => load,
            };
            for _ in 0..args.repeat {
                for mode in [Mode::Gated, Mode::Ungated] {
                    push("sweep", mode, n, d, load, None);
                }
            }
        }
    }
    let top = dequeuers.iter().copied().max().unwrap_or(1);
    if args.rate.is_none() && args.latency_rate > 0.0 {
        let duration_s = args.latency_for.unwrap_or(if q { 6.0 } else { 15.0 });
        if duration_s <= WARMUP_S {
            bail!(
                "--latency-for must be longer than the {} s warm-up",
                WARMUP_S
            );
        }
        for &n in &shard_counts {
            for mode in [Mode::Gated, Mode::Ungated] {
                let rate = args.latency_rate * n as f64;
                push(
                    "latency",
                    mode,
                    n,
                    top,
                    Load::Rate { rate, duration_s },
                    None,
                );
            }
        }
    }
    let kinds = match (&args.disturb, args.no_disturb) {
        (_, true) => Vec::new(),
        (Some(kinds), false) => kinds.clone(),
        (None, false) if q => vec![disturb::Kind::AccessExclusive],
        (None, false) => vec![
            disturb::Kind::AccessExclusive,
            disturb::Kind::VacuumFull,
            disturb::Kind::Restart,
            disturb::Kind::Freeze,
        ],
    };
    for kind in kinds {
        let at_s = args.disturb_at.unwrap_or(if q { 5.0 } else { 6.0 });
        let for_s = args.disturb_for.unwrap_or(if q { 2.0 } else { 3.0 });
        let after_s = args.disturb_after.unwrap_or(if q { 3.0 } else { 6.0 });
        if at_s < 4.0 || for_s <= 0.0 || after_s < 1.0 {
            bail!("--disturb-at must be at least 4 (3 s warm-up + 1 s before), --disturb-for positive, --disturb-after at least 1");
        }
        if args.producers == Some(0) {
            bail!("--producers takes a positive number");
        }
        if args.disturb_rate < 0.0 || (args.disturb_rate == 0.0 && args.disturb_backlog == 0) {
            bail!("--disturb-rate must be positive, or 0 with a --disturb-backlog");
        }
        let plan = disturb::Plan {
            kind,
            shard: 0,
            at_s,
            for_s,
            slow_ms: args.slow_ms,
        };
        let load = Load::Rate {
            rate: args.disturb_rate,
            duration_s: at_s + for_s + after_s,
        };
        let modes = args
            .disturb_modes
            .clone()
            .unwrap_or(vec![Mode::Gated, Mode::Ungated]);
        for mode in modes {
            push(
                "disturbance",
                mode,
                args.disturb_shards,
                args.disturb_dequeuers,
                load,
                Some(plan),
            );
        }
    }
    let needed = runs.iter().map(|r| r.shards).max().unwrap_or(1);
    for r in &runs {
        let per_shard = r.processes * (r.producers + EXTRA_POOL) + 8;
        if per_shard > 300 {
            eprintln!(
                "warning: run {} opens about {per_shard} connections per shard; local servers allow 300",
                r.id
            );
        }
    }
    Ok((runs, needed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequeuers_map_to_processes_times_producers() {
        assert_eq!(split(8, 4), (4, 2));
        assert_eq!(split(128, 4), (4, 32));
        assert_eq!(split(2, 4), (2, 1));
        assert_eq!(split(10, 4), (4, 3));
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        scale: ScaleArgs,
    }

    fn runs_of(flags: &str) -> Vec<RunSpec> {
        let cli = <Cli as clap::Parser>::try_parse_from(flags.split(' ')).unwrap();
        build(&cli.scale).unwrap().0
    }

    #[test]
    fn a_list_of_rates_runs_every_rate_in_both_modes() {
        let runs = runs_of("scale --shards 4 --dequeuers 8 --rate 2500,5000 --no-disturb");
        let offered: Vec<(f64, Mode)> = runs
            .iter()
            .map(|r| match r.load {
                Load::Rate { rate, .. } => (rate, r.mode),
                Load::Drain { .. } => panic!("a drain run in a rate sweep"),
            })
            .collect();
        assert_eq!(
            offered,
            [
                (2500.0, Mode::Gated),
                (2500.0, Mode::Ungated),
                (5000.0, Mode::Gated),
                (5000.0, Mode::Ungated)
            ]
        );
    }

    #[test]
    fn proxy_disturbances_take_the_worker_settings_given() {
        let runs = runs_of(
            "scale --only-disturb --disturb slow,silent,refuse --disturb-modes gated \
             --processes 2 --producers 1 --disturb-backlog 1000 --disturb-rate 0 --slow-ms 250",
        );
        assert_eq!(runs.len(), 3, "no sweep or latency runs, one mode");
        for r in &runs {
            assert_eq!(r.kind, "disturbance");
            assert_eq!(r.mode, Mode::Gated);
            assert_eq!((r.processes, r.producers, r.dequeuers_per_shard), (2, 1, 2));
            assert_eq!(r.backlog, 1000);
            let plan = r.disturbance.expect("a disturbance");
            assert!(plan.kind.needs_proxy());
            assert_eq!(plan.slow_ms, 250);
        }
    }

    #[test]
    fn a_zero_rate_needs_a_backlog() {
        let cli = <Cli as clap::Parser>::try_parse_from(
            "scale --only-disturb --disturb silent --disturb-rate 0".split(' '),
        )
        .unwrap();
        assert!(build(&cli.scale).is_err());
    }
}

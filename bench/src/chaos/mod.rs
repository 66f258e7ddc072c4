//! `shardq-bench chaos` (also `shardq chaos`): a bounded fault-injection run.
//!
//! On fresh local shards, a fleet of worker processes drains a stream of noop
//! jobs and three-step durable workflows while workers are SIGKILLed, a shard
//! crashes and restarts, connections are terminated, the queue table is locked
//! and rewritten. Afterwards every row is read back and checked: no job lost,
//! none completed twice, no recorded step applied again.
//!
//! `--torture` widens it (see [`profile`] and [`torture`]): two queues that
//! share key strings, keyed jobs that fail and retry, delayed jobs promoted
//! every 50 ms, small buffers, completion stalls, stopped workers, a shard
//! frozen, slow, silent and refusing, a scheduler whose clock runs minutes
//! ahead; invariants sampled every second, per-key order and the scheduled
//! ticks checked afterwards, and any stall of a healthy shard fails the run.
//!
//! ```text
//! setup ─> fault phase (enqueue + faults) ─> drain ─> stop workers ─> check ─> teardown
//! ```

mod cluster;
mod faults;
mod fleet;
mod inject;
mod load;
mod names;
mod profile;
mod report;
mod reshard;
mod schedule;
mod sql;
mod torture;
mod verify;
pub mod worker;

use anyhow::{bail, Result};
use clap::Args;
use cluster::Cluster;
use faults::{Fault, When};
use fleet::Fleet;
use profile::Profile;
use report::{Settings, Summary, TortureReport};
use shardq::shards::ShardSet;
use shardq::Client;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// Share of the fault phase over which the jobs are enqueued: the last faults
/// still hit a queue with work in flight, and the enqueuer has slack to
/// catch up after a stall.
const ENQUEUE_SHARE: f64 = 0.8;

/// How often the fleet is checked for workers that exited by themselves.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Arguments of `shardq-bench chaos`.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Jobs to enqueue (one in five a three-step workflow, the rest noops).
    #[arg(long, default_value_t = 100_000)]
    pub jobs: usize,
    /// Worker processes running at any time.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Length of the fault phase, in seconds; enqueueing runs during it.
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// After the fault phase, how long the queue may take to drain.
    #[arg(long, default_value_t = 180)]
    pub drain_timeout_s: u64,
    /// Port of shard 0 (shard i on base+i); by default free ports are found.
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep the temporary folder (server data and logs, worker logs) afterwards.
    #[arg(long)]
    pub keep_dir: bool,
    /// Self-check: break invariants on purpose after the drain; succeed only
    /// when the checks report exactly what was broken.
    #[arg(long, hide = true)]
    pub inject_violations: bool,
    /// The torture profile: the widened workload and faults, invariants
    /// sampled every second, per-key order checked, healthy-shard stalls.
    #[arg(long)]
    pub torture: bool,
    /// Torture: cold ordering keys (each cold job takes the next one, so a
    /// run has up to this many distinct keys, plus 64 hot ones).
    #[arg(long, default_value_t = 50_000)]
    pub keys: u64,
    /// The shard list moves back and forth (2 → 3 → 2 …) under the faults
    /// instead (its own run: see `chaos::reshard`).
    #[arg(long)]
    pub reshard: bool,
    /// Switch a fault kind off, by its name in the summary (e.g. "completion
    /// stall"); repeatable.
    #[arg(long = "skip-fault", value_name = "NAME")]
    pub skip_faults: Vec<String>,
}

impl ChaosArgs {
    /// The profile's schedule without the faults switched off.
    fn schedule(&self) -> Result<Vec<(When, Fault)>> {
        let full = Profile::from_flag(self.torture).schedule();
        for name in &self.skip_faults {
            if !full.iter().any(|(_, f)| f.name() == name) {
                let known: Vec<&str> = full.iter().map(|(_, f)| f.name()).collect();
                bail!("--skip-fault {name:?} is no fault of this run; its faults: {known:?}");
            }
        }
        Ok(full
            .iter()
            .filter(|(_, f)| !self.skip_faults.iter().any(|name| name == f.name()))
            .copied()
            .collect())
    }
}

/// Runs the chaos test; fails (exit 1) when an invariant fails.
pub async fn run(args: ChaosArgs) -> Result<()> {
    if args.workers == 0 || args.jobs == 0 {
        bail!("--workers and --jobs must be at least 1");
    }
    if args.reshard {
        let settings = reshard::Settings {
            jobs: args.jobs,
            duration_s: args.duration_s,
            drain_timeout_s: args.drain_timeout_s,
            base_port: args.base_port,
            keep_dir: args.keep_dir,
            json: args.json.clone(),
        };
        return tokio::select! {
            done = reshard::run(&settings) => done,
            () = interrupted() => Err(anyhow::anyhow!("interrupted")),
        };
    }
    if args.torture && args.inject_violations {
        bail!("--inject-violations checks the chaos profile's checks; run it without --torture");
    }
    let schedule = args.schedule()?;
    let shortest = faults::longest_period(&schedule).as_secs() * 2;
    if args.duration_s < shortest {
        bail!("--duration-s must be at least {shortest}, so that every fault fires");
    }
    let profile = Profile::from_flag(args.torture);
    let mut cluster = Cluster::start(args.base_port, args.keep_dir, profile).await?;
    let outcome = tokio::select! {
        summary = run_on(&cluster, &args, &schedule) => summary,
        () = interrupted() => Err(anyhow::anyhow!("interrupted")),
    };
    // The fleet is gone (workers stopped, or killed on drop): stop the servers.
    if let Err(err) = cluster.teardown() {
        tracing::warn!(error = format!("{err:#}"), "chaos teardown failed");
    }
    let summary = outcome?;
    summary.print();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)?;
    }
    if args.inject_violations {
        return inject::detected(&summary);
    }
    if !summary.passed() {
        let failed = summary.invariants.iter().filter(|i| !i.pass).count();
        bail!("{failed} chaos invariant(s) failed");
    }
    Ok(())
}

/// Statement deadline of the chaos command's own connections.
const CHECK_STATEMENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Statement deadline of the invariant sampler: a frozen shard fails its
/// sample instead of holding up the next ones.
const SAMPLE_STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// A client over the servers' own URLs with statements given up after `timeout`.
fn own_client(cluster: &Cluster, timeout: Duration) -> Result<Client> {
    let mut own = cluster.config.clone();
    own.database.statement_timeout = timeout;
    Ok(Client::from_shards(
        ShardSet::connect(&own)?,
        own.limits.clone(),
    ))
}

/// The invariant samples and each shard's progress samples (and failures).
type Progress = (
    torture::sampler::Samples,
    Vec<(Vec<torture::progress::Sample>, usize)>,
);

/// The monitors of the torture run, until the drain.
struct Monitors {
    stop: CancellationToken,
    samples: tokio::task::JoinHandle<torture::sampler::Samples>,
    progress: tokio::task::JoinHandle<Vec<(Vec<torture::progress::Sample>, usize)>>,
}

impl Monitors {
    fn start(cluster: &Cluster, queues: &[&str], started: Instant) -> Result<Monitors> {
        let stop = CancellationToken::new();
        let sampled = own_client(cluster, SAMPLE_STATEMENT_TIMEOUT)?;
        let urls = (0..cluster::SHARDS).map(|i| cluster.url(i)).collect();
        let queues = queues.iter().map(|q| q.to_string()).collect();
        Ok(Monitors {
            samples: tokio::spawn(torture::sampler::run(
                sampled,
                cluster.config.clone(),
                started,
                stop.clone(),
            )),
            progress: tokio::spawn(torture::progress::monitor(
                urls,
                queues,
                started,
                stop.clone(),
            )),
            stop: stop.clone(),
        })
    }

    /// Stops the monitors; returns the samples and each shard's progress.
    async fn finish(self) -> Result<Progress> {
        self.stop.cancel();
        Ok((self.samples.await?, self.progress.await?))
    }
}

/// The run proper, on a started cluster.
async fn run_on(
    cluster: &Cluster,
    args: &ChaosArgs,
    schedule: &[(When, Fault)],
) -> Result<Summary> {
    let profile = Profile::from_flag(args.torture);
    let queues = profile.queues();
    // The enqueuer and the checks: the workers' 1 s statement deadline is too
    // short for the checks' scans over the whole run's rows.
    let client = own_client(cluster, CHECK_STATEMENT_TIMEOUT)?;
    // The skewed scheduler's ticks are counted from here, by the database's clock.
    let ticks_from = match profile {
        Profile::Torture => Some(torture::ticks::db_now(&client).await?),
        Profile::Chaos => None,
    };
    let skew = ticks_from.map(|_| torture::ticks::AHEAD);
    let fleet = Mutex::new(Fleet::start(
        cluster.config_path.clone(),
        cluster.log_dir(),
        args.workers,
        skew,
    )?);
    let phase = Duration::from_secs(args.duration_s);
    let started = Instant::now();
    let deadline = started + phase + Duration::from_secs(args.drain_timeout_s);
    tracing::info!(
        jobs = args.jobs,
        workers = args.workers,
        phase_s = args.duration_s,
        "fault phase begins"
    );

    let monitors = match profile {
        Profile::Torture => Some(Monitors::start(cluster, queues, started)?),
        Profile::Chaos => None,
    };
    let reaping = CancellationToken::new();
    let keys = args.keys;
    // The torture run's mail driver learns each waiting workflow's id from
    // the enqueuer; the channel closes when the enqueuer is done.
    let (acked, announced) = tokio::sync::mpsc::unbounded_channel();
    let mail = match profile {
        Profile::Torture => Some(tokio::spawn(torture::mail::run(
            client.clone(),
            announced,
            deadline,
        ))),
        Profile::Chaos => None,
    };
    let load = tokio::spawn(load::run(
        client.clone(),
        args.jobs,
        phase.mul_f64(ENQUEUE_SHARE),
        deadline,
        move |n| match profile {
            Profile::Chaos => load::new_job(n),
            Profile::Torture => torture::keyed::new_job(n, keys),
        },
        move |n, id| {
            if torture::mail::wanted(n) {
                // Closed only in the chaos profile, where nobody listens.
                let _ = acked.send((n, id));
            }
        },
    ));
    let phases = async {
        let events = faults::run(cluster, &fleet, schedule, started, phase).await;
        tracing::info!("fault phase over; waiting for the enqueuer and the drain");
        let load = load.await;
        let drained = match &load {
            Ok(_) => verify::drain(&client, queues, deadline).await,
            Err(_) => None,
        };
        reaping.cancel();
        (events, load, drained)
    };
    // Workers that exit by themselves are replaced until the queue is drained.
    let ((events, load, drained), ()) = tokio::join!(phases, reap_until(&fleet, reaping.clone()));
    let load = load?;
    let end = drained.unwrap_or_else(Instant::now);
    let monitored = match monitors {
        Some(monitors) => Some(monitors.finish().await?),
        None => None,
    };
    // The skewed scheduler's ticks are expected until here.
    let ticks_until = match ticks_from {
        Some(_) => Some(torture::ticks::db_now(&client).await?),
        None => None,
    };
    let mut fleet = fleet.into_inner();
    fleet.stop(fleet::STOP_GRACE).await?;
    if args.inject_violations {
        inject::inject(&client, &load).await?;
    }
    let checks = verify::check(&client, queues, &load).await?;
    let sent = match mail {
        Some(mail) => mail.await?,
        None => Vec::new(),
    };
    let torture = match (monitored, ticks_from.zip(ticks_until)) {
        (Some((mut samples, progress)), Some((from, until))) => Some(TortureReport {
            waits: torture::waits_check::check(&client, &sent).await?,
            order: torture::order::check(&client, &load, &fleet.lost_leases).await?,
            ticks: torture::ticks::check(&client, from, until).await?,
            samples: {
                samples.judge(&events);
                samples
            },
            stalls: torture::progress::stalls(&progress, &events),
        }),
        _ => None,
    };
    let elapsed_s = end.duration_since(started).as_secs_f64();
    let skipped_faults = args.skip_faults.clone();
    Ok(Summary {
        settings: Settings {
            profile,
            skipped_faults,
            keys: args.keys,
            shards: cluster::SHARDS,
            workers: args.workers,
            jobs: args.jobs,
            duration_s: args.duration_s,
            drain_timeout_s: args.drain_timeout_s,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        },
        enqueued: load.enqueued,
        workflows: load.workflows,
        failed_chunks: load.failed_chunks,
        first_enqueue_error: load.first_error,
        faults: events,
        fault_counts: Vec::new(),
        workers_started: fleet.started(),
        workers_killed: fleet.killed,
        unexpected_exits: fleet.unexpected,
        drained: drained.is_some(),
        elapsed_s,
        jobs_per_second: checks.all_succeeded as f64 / elapsed_s.max(1e-9),
        checks,
        torture,
        invariants: Vec::new(),
    }
    .finish(schedule))
}

/// Replaces workers that exit by themselves, until `stop`.
async fn reap_until(fleet: &Mutex<Fleet>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(REAP_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(err) = fleet.lock().await.reap() {
            tracing::error!(error = format!("{err:#}"), "cannot replace a worker");
        }
    }
}

/// Completes on SIGINT or SIGTERM, so that an interrupted run still stops its
/// workers and servers.
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        // Without a SIGTERM handler, SIGTERM keeps its default (exit at once).
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        return;
    };
    tokio::select! {
        Ok(()) = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

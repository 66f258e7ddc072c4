//! One run: reset the shards, load them, start the fleet, disturb if asked,
//! wait for the drain, stop the fleet, check exactly-once, measure.

use super::cluster::Cluster;
use super::fleet::Fleet;
use super::load;
use super::plan::{Load, RunSpec, EXTRA_POOL};
use super::raw::{Phases, Raw, Settings};
use super::result::RunResult;
use super::{analyze, disturb, proto, stall, timeline, verify};
use anyhow::{bail, Result};
use shardq_harness::lossy_proxy::LossyProxy;
use std::time::{Duration, Instant};

/// The queue of the bench's jobs.
pub const QUEUE: &str = "scale";

/// Run after the truncate: no dirty pages left for the run to pay for. (No
/// VACUUM ANALYZE: on the empty table it would record 0 rows, and the claim
/// would be planned as a sequential scan; truncated, it is planned on the index.)
const SETTLE_SQL: &[&str] = &["CHECKPOINT"];

/// How often the drain is checked.
const POLL: Duration = Duration::from_millis(50);

/// The `SHARDQ_*` settings of the worker processes of `spec`.
pub fn worker_env(spec: &RunSpec, s: &Settings) -> Vec<(String, String)> {
    let buffer = super::plan::buffer_jobs(spec.producers, s.batch, s.buffer_jobs);
    let mut env = vec![
        ("SHARDQ_DEQUEUE__MODE", spec.mode.name().to_string()),
        ("SHARDQ_DEQUEUE__SLOTS_PER_SHARD", s.slots.to_string()),
        (
            "SHARDQ_DEQUEUE__ADAPTIVE_SLOTS",
            s.adaptive_slots.to_string(),
        ),
        ("SHARDQ_DEQUEUE__BATCH_SIZE", s.batch.to_string()),
        ("SHARDQ_WORKER__PRODUCERS", spec.producers.to_string()),
        ("SHARDQ_WORKER__BUFFER_JOBS", buffer.to_string()),
    ];
    // Only the disturbance runs shorten the lock wait, the statement deadline
    // and the failing-shard backoff (unless told to keep them); the sweep
    // keeps the library's defaults.
    if spec.disturbance.is_some() && !s.worker_defaults {
        env.push((
            "SHARDQ_DEQUEUE__LOCK_TIMEOUT_MS",
            s.lock_timeout_ms.to_string(),
        ));
        env.push((
            "SHARDQ_DEQUEUE__UNHEALTHY_BACKOFF_MAX_MS",
            s.unhealthy_backoff_max_ms.to_string(),
        ));
        // A frozen shard's statements give up after a second, not ten.
        env.push(("SHARDQ_DEQUEUE__STATEMENT_TIMEOUT_MS", "1000".to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Runs `spec`; a failure is recorded in the result, not returned.
pub async fn run(
    cluster: &Cluster,
    spec: &RunSpec,
    s: &Settings,
    progress: &dyn Fn(u64, u64),
) -> RunResult {
    match execute(cluster, spec, s, progress).await {
        Ok(raw) => analyze::result(spec, s, raw),
        Err(err) => analyze::failed(spec, s, format!("{err:#}")),
    }
}

async fn execute(
    cluster: &Cluster,
    spec: &RunSpec,
    s: &Settings,
    progress: &dyn Fn(u64, u64),
) -> Result<Raw> {
    let n = spec.shards;
    if n > cluster.len() {
        bail!("{n} shards asked, {} available", cluster.len());
    }
    let loadavg = crate::procfs::loadavg();
    let mut phases = Phases::default();
    let mut mark = Instant::now();
    let mut lap = |slot: &mut f64| {
        let now = Instant::now();
        *slot = now.duration_since(mark).as_secs_f64();
        mark = now;
    };
    cluster.reset(n).await?;
    for i in 0..n {
        cluster.execute(i, SETTLE_SQL).await?;
    }
    lap(&mut phases.setup_s);
    // The disturbed shard's proxy, for the whole run: before and after are
    // measured through it too.
    let proxy = match spec.disturbance {
        Some(plan) if plan.kind.needs_proxy() => {
            let upstream = cluster.upstream(plan.shard, "--disturb slow, silent or refuse")?;
            Some((plan.shard, LossyProxy::start(upstream)))
        }
        _ => None,
    };
    let via = proxy.as_ref().map(|(i, p)| (*i, p.addr().port()));
    let name = format!("run{:02}", spec.id);
    let config = cluster.worker_config(&name, n, spec.producers + EXTRA_POOL, QUEUE, via)?;
    let env = worker_env(spec, s);
    let logs = cluster.log_dir();
    let mut fleet = Fleet::start(spec.processes, &config, &env, &logs, &name).await?;
    lap(&mut phases.start_s);
    // A drain run prefills its backlog before `go`, so it measures the
    // dequeue alone, not the inserts competing with it.
    let backlog = match spec.load {
        Load::Drain { per_shard } => per_shard,
        Load::Rate { .. } => spec.backlog,
    };
    let prefilled = match backlog {
        0 => None,
        per_shard => {
            let counts = load::burst(&cluster.admin, n, per_shard, QUEUE, s.job_ms).await??;
            // Statistics of the filled table, so every run plans its claims
            // and completions alike instead of whenever autovacuum analyzes.
            for i in 0..n {
                cluster.execute(i, &["ANALYZE workflow_status"]).await?;
            }
            Some(counts)
        }
    };
    lap(&mut phases.prefill_s);
    let go_unix_ms = proto::unix_ms();
    let busy_at_go = crate::procfs::machine_busy_ticks()?;
    let go = Instant::now();
    fleet.go().await?;
    let deadline = go + s.timeout;
    let mut watch = stall::Watch::new(go, n);
    let work = async {
        let (loading, expected) = match (spec.load, prefilled.clone()) {
            (Load::Drain { per_shard }, Some(counts)) => (
                tokio::spawn(async move { Ok(counts) }),
                (per_shard * n) as u64,
            ),
            // `--jobs 0`: nothing to drain.
            (Load::Drain { .. }, None) => (tokio::spawn(async move { Ok(vec![0; n]) }), 0),
            (Load::Rate { rate, duration_s }, _) => {
                let duration = Duration::from_secs_f64(duration_s);
                let task = load::rate(&cluster.admin, n, rate, go, duration, QUEUE, s.job_ms);
                let offered = (rate * duration_s).round() as u64;
                (task, offered + (spec.backlog * n) as u64)
            }
        };
        while !loading.is_finished() {
            check_alive(&mut fleet)?;
            let done = fleet.by_shard(n, timeline::completed);
            progress(done.iter().sum(), expected);
            watch
                .tick(cluster, &fleet.by_shard(n, timeline::claimed), &done)
                .await;
            tokio::time::sleep(POLL).await;
        }
        let mut enqueued = loading.await??;
        if let (Load::Rate { .. }, Some(counts)) = (spec.load, &prefilled) {
            for (e, c) in enqueued.iter_mut().zip(counts) {
                *e += c;
            }
        }
        let total: u64 = enqueued.iter().sum();
        loop {
            let by_shard = fleet.by_shard(n, timeline::completed);
            let done: u64 = by_shard.iter().sum();
            progress(done, total);
            if done >= total {
                break;
            }
            check_alive(&mut fleet)?;
            let claimed = fleet.by_shard(n, timeline::claimed);
            watch.tick(cluster, &claimed, &by_shard).await;
            if Instant::now() > deadline {
                bail!(
                    "only {done} of {total} jobs completed within {:?}",
                    s.timeout
                );
            }
            tokio::time::sleep(POLL).await;
        }
        Ok::<_, anyhow::Error>(enqueued)
    };
    let disturbance = async {
        match spec.disturbance {
            Some(plan) => {
                let proxy = proxy.as_ref().map(|(_, p)| p);
                disturb::run(cluster, plan, go, proxy).await.map(Some)
            }
            None => Ok(None),
        }
    };
    let (enqueued, window) = tokio::join!(work, disturbance);
    let (enqueued, window) = (enqueued?, window?);
    let cpu_busy = cpu_share(busy_at_go, go.elapsed())?;
    lap(&mut phases.run_s);
    let output = fleet.stop().await?;
    lap(&mut phases.stop_s);
    let checks = verify::check(&cluster.admin, QUEUE, &enqueued).await?;
    lap(&mut phases.check_s);
    Ok(Raw {
        enqueued,
        output,
        go_unix_ms,
        window,
        checks,
        phases,
        loadavg,
        cpu_busy,
        stalls: watch.stalls,
        fault_statements: proxy.map(|(_, p)| p.fault_statements().len()),
    })
}

/// Share of all cores busy since `busy_before` was read, `wall` ago: tells a
/// latency lost to a saturated machine from one lost in shardq.
fn cpu_share(busy_before: u64, wall: Duration) -> Result<f64> {
    let busy =
        crate::procfs::Clock::probe().secs(crate::procfs::machine_busy_ticks()? - busy_before);
    Ok(busy / (wall.as_secs_f64() * crate::procfs::cpus() as f64).max(f64::EPSILON))
}

fn check_alive(fleet: &mut Fleet) -> Result<()> {
    match fleet.any_exited() {
        Some(why) => bail!(why),
        None => Ok(()),
    }
}

//! `shardq-bench chaos --reshard`: the shard list moves back and forth
//! (2 → 3 → 2 …) while worker processes are SIGKILLed (those on the list a
//! move leaves behind too), replies to enqueues are lost after their commit,
//! deduplicated jobs fail their first attempt and retry, and a queue's limit
//! is changed over and over after a skewed writer's change.
//!
//! Checked: every job enqueued exactly once and succeeded (none lost, none
//! doubled by a move or a retried enqueue), no deduplication id held by two
//! unfinished jobs at any sample and none written twice, every move
//! finished within its bound, every limit change in force once set, and
//! `shardq check` clean at every sample (a move's held jobs judged by what
//! a move promises).
//!
//! ```text
//! setup (3 servers, 2 in the map) ─> fault phase: enqueuer, mover, killer,
//! limit changer, sampler ─> last move finished ─> drain ─> checks
//! ```

mod fleet;
mod load;
mod verify;

pub use load::HANDLER;

use super::ChaosArgs;
use anyhow::{bail, Context, Result};
use fleet::Fleet;
use shardq::config::Config;
use shardq::reshard::{reshard, Options};
use shardq::shards::ShardSet;
use shardq::Client;
use shardq_harness::lossy_proxy::{server_addr, LossyProxy};
use shardq_harness::LocalCluster;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The queue of the run.
pub const QUEUE: &str = "reshard";

/// Servers: the map moves between the first two and all three.
const SERVERS: usize = 3;

/// How long one move may take before it counts as not finishing.
const MOVE_BOUND: Duration = Duration::from_secs(90);

/// Pause between two moves.
const BETWEEN_MOVES: Duration = Duration::from_secs(2);

/// Chance that an insert's reply is lost after its commit.
const LOST_REPLY: f64 = 0.05;

/// Worker settings: short leases, so a killed worker's jobs come back soon.
const SETTINGS: &str = "
[database]
statement_timeout_ms = 5000
[worker]
queues = [\"reshard\"]
concurrency = 8
lease_ms = 2000
maintenance_interval_ms = 200
retry_backoff_min_ms = 200
retry_backoff_max_ms = 1000
shutdown_grace_ms = 2000
";

/// What the run saw; printed, and judged by [`verify`].
#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    pub moves: Vec<f64>,
    pub move_errors: Vec<String>,
    pub enqueued: usize,
    pub lost_replies: u64,
    pub settled_again: u64,
    pub dedup_refused: u64,
    pub workers_killed: u64,
    pub limit_changes: u64,
    pub samples: u64,
    pub failures: Vec<String>,
    /// Jobs (payload `u`) the shard that left held when it was emptied to
    /// join again: finished there, counted by the checks.
    pub archived: Vec<(u64, String)>,
}

/// The shard list of the first `n` servers, at `urls`, as TOML.
fn list(urls: &[String], n: usize) -> String {
    let mut text = String::new();
    for (i, url) in urls.iter().take(n).enumerate() {
        text.push_str(&format!(
            "[[shards]]\nname = \"s{i}\"\nurl = \"{url}\"\npool_size = 8\n\n"
        ));
    }
    text + SETTINGS
}

/// Runs the mode; fails when a check fails.
pub async fn run(args: &ChaosArgs) -> Result<()> {
    let mut local = LocalCluster::start("shardq-reshard-chaos", SERVERS, args.base_port)
        .await
        .context("cannot start the servers")?;
    local.keep(args.keep_dir);
    let direct: Vec<String> = (0..SERVERS).map(|i| local.url(i)).collect();
    let two = Config::from_toml(&list(&direct, 2))?;
    let three = Config::from_toml(&list(&direct, 3))?;
    shardq::migrate::migrate_all(&ShardSet::connect(&two)?).await?;
    let all = ShardSet::connect(&three)?;
    shardq::migrate::migrate_joining(all.get(2), 3).await?;
    let dir = local.root().path().to_path_buf();
    let paths = [dir.join("two.toml"), dir.join("three.toml")];
    std::fs::write(&paths[0], list(&direct, 2))?;
    std::fs::write(&paths[1], list(&direct, 3))?;

    // The enqueuer's replies go through proxies that lose some.
    let proxies: Vec<LossyProxy> = direct
        .iter()
        .map(|u| LossyProxy::start(server_addr(u)))
        .collect();
    let proxied: Vec<String> = direct
        .iter()
        .zip(&proxies)
        .map(|(u, p)| u.replace(&server_addr(u).to_string(), &p.addr().to_string()))
        .collect();
    // SHARDQ_CHAOS_LOST_REPLY: another chance, to make unknown outcomes common.
    let lost = std::env::var("SHARDQ_CHAOS_LOST_REPLY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LOST_REPLY);
    for proxy in &proxies {
        proxy.set_drop_only(Some("OVERRIDING SYSTEM VALUE"));
        proxy.set_drop_probability(lost);
    }
    let enqueuer = Client::new(&Config::from_toml(&list(&proxied, 3))?)?;
    let own = Client::from_shards(all.clone(), three.limits.clone());

    let summary = Arc::new(std::sync::Mutex::new(Summary::default()));
    let fleet = Arc::new(tokio::sync::Mutex::new(Fleet::start(
        &paths,
        &local.root().log_dir(),
    )?));
    let stop = CancellationToken::new();
    let phase = Duration::from_secs(args.duration_s);
    let started = Instant::now();
    eprintln!(
        "reshard chaos: {} jobs over {phase:?}, 3 servers, moves 2 ⇄ 3",
        args.jobs
    );

    verify::skewed_limit_write(&all).await?;
    let load = tokio::spawn(load::run(
        enqueuer,
        args.jobs,
        phase.mul_f64(0.8),
        summary.clone(),
    ));
    let sampler = tokio::spawn(verify::sample(
        own.clone(),
        three.clone(),
        summary.clone(),
        stop.clone(),
    ));
    let limits = tokio::spawn(verify::change_limits(
        own.clone(),
        summary.clone(),
        stop.clone(),
    ));
    let killer = tokio::spawn(fleet::kill_now_and_then(fleet.clone(), stop.clone()));
    let mut count = 2;
    while started.elapsed() < phase {
        let to = if count == 2 { 3 } else { 2 };
        let (old, new) = (count, to);
        let move_started = Instant::now();
        let options = Options {
            patience: Some(MOVE_BOUND),
            ..Options::default()
        };
        let moved =
            tokio::time::timeout(MOVE_BOUND, reshard(&all, old, new, &options, |_| {})).await;
        let took = move_started.elapsed().as_secs_f64();
        {
            let mut s = summary.lock().unwrap();
            match moved {
                Ok(Ok(done)) if done.complete => s.moves.push(took),
                Ok(Ok(_)) => s.move_errors.push(format!("{old} → {new}: not complete")),
                Ok(Err(e)) => s.move_errors.push(format!("{old} → {new}: {e}")),
                Err(_) => s
                    .move_errors
                    .push(format!("{old} → {new}: not finished within {MOVE_BOUND:?}")),
            }
        }
        if new == 2 && summary.lock().unwrap().move_errors.is_empty() {
            // The shard that left keeps its finished jobs; a shard joins
            // the list empty, so the operator empties it before it joins
            // again.
            let left = empty(all.get(2)).await?;
            let mut s = summary.lock().unwrap();
            for (u, status) in left {
                if status == "unfinished" {
                    s.failures.push(format!(
                        "job {u} left unfinished on the shard a move emptied"
                    ));
                }
                s.archived.push((u, status));
            }
        }
        count = to;
        eprintln!(
            "  {:>5.1} s: moved {old} → {new} in {took:.1} s",
            started.elapsed().as_secs_f64()
        );
        fleet.lock().await.follow(count)?;
        tokio::time::sleep(BETWEEN_MOVES).await;
    }
    stop.cancel();
    let _ = killer.await;
    let _ = limits.await;
    let enqueued = load.await??;
    for proxy in &proxies {
        proxy.set_drop_probability(0.0);
    }
    let archived = summary.lock().unwrap().archived.clone();
    let drained = verify::drain(
        &own,
        enqueued.len().saturating_sub(archived.len()),
        Duration::from_secs(args.drain_timeout_s),
    )
    .await;
    let _ = sampler.await;
    let killed = {
        let mut fleet = fleet.lock().await;
        fleet.stop().await;
        fleet.killed
    };
    {
        let mut s = summary.lock().unwrap();
        s.workers_killed = killed;
        s.enqueued = enqueued.len();
        if let Err(e) = drained {
            s.failures.push(format!("{e:#}"));
        }
    }
    let failures = verify::check_once(&own, &enqueued, &archived).await?;
    let mut s = summary.lock().unwrap();
    s.failures.extend(failures);
    s.lost_replies = proxies.iter().map(LossyProxy::dropped).sum();
    verify::print(&s);
    let bad = !s.failures.is_empty() || !s.move_errors.is_empty();
    drop(s);
    if let Err(e) = local.teardown() {
        tracing::warn!(error = format!("{e:#}"), "teardown failed");
    }
    if bad {
        bail!("the reshard chaos run failed its checks");
    }
    Ok(())
}

/// Empties a shard that left the list, so that it can join again; returns
/// the jobs it held (payload `u`; `succeeded`, or `unfinished` for one a
/// move should have taken), which the checks count as they were.
async fn empty(shard: &shardq::shards::Shard) -> Result<Vec<(u64, String)>> {
    let mut db = shard.client().await?;
    let tx = db.transaction().await?;
    tx.batch_execute("SET LOCAL lock_timeout = '10s'; LOCK workflow_status")
        .await
        .context("cannot lock the table of the shard that left")?;
    let rows = tx
        .query(
            "SELECT (payload->>'u')::bigint AS u, CASE WHEN status IN \
                 ('succeeded', 'failed', 'dead', 'cancelled') THEN status ELSE 'unfinished' END \
             FROM workflow_status WHERE queue = $1",
            &[&QUEUE],
        )
        .await?;
    tx.batch_execute("TRUNCATE workflow_status CASCADE").await?;
    tx.commit().await?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, Option<i64>>(0).unwrap_or(-1) as u64, r.get(1)))
        .collect())
}

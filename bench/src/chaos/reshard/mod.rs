//! `shardq-bench chaos --reshard`: the shard list moves back and forth
//! (2 → 3 → 2 …) while worker processes are SIGKILLed (those on the list a
//! move leaves behind too), replies to enqueues are lost after their commit
//! (now and then all of a shard's for longer than the client retries, so
//! enqueues end `OutcomeUnknown` and are settled with `enqueue_again`),
//! deduplicated jobs fail their first attempt and retry and are enqueued
//! again while held, and a queue's limit is changed over and over after a
//! skewed writer's change.
//!
//! Checked: every job enqueued exactly once and succeeded, under the id its
//! enqueue answered (none lost, none doubled by a move or a retried
//! enqueue), no deduplication id held by two
//! unfinished jobs at any sample and none written twice, every move
//! finished within its bound, every limit change in force once set, and
//! `shardq check` clean at every sample (a move's held jobs judged by what
//! a move promises).
//!
//! ```text
//! setup (3 servers, 2 in the map) ─> fault phase: enqueuer, mover, killer,
//! blackouts, limit changer, sampler ─> last move finished ─> drain ─> checks
//! ```

mod fleet;
mod load;
mod replies;
mod sql;
mod summary;
mod verify;

pub use load::HANDLER;

use anyhow::{bail, Context, Result};
use fleet::Fleet;
use replies::Replies;
use shardq::config::Config;
use shardq::reshard::{reshard, Options};
use shardq::shards::ShardSet;
use shardq::Client;
use shardq_harness::{LocalCluster, ShardList};
use std::sync::Arc;
use std::time::{Duration, Instant};
use summary::{Found, Summary, QUEUE};
use tokio::sync::RwLock;
use tokio_util::sync::CancellationToken;

/// Servers: the map moves between the first two and all three.
const SERVERS: usize = 3;

/// How long one move may take before it counts as not finishing.
const MOVE_BOUND: Duration = Duration::from_secs(90);

/// Pause between two moves.
const BETWEEN_MOVES: Duration = Duration::from_secs(2);

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

/// The shard list of the first `n` servers, at `urls`, as TOML.
fn list(urls: &[String], n: usize) -> String {
    ShardList::numbered(urls.iter().take(n))
        .pool_size(8)
        .toml(SETTINGS)
}

/// What `chaos --reshard` was asked for.
#[derive(Debug, Clone)]
pub struct Settings {
    pub jobs: usize,
    pub duration_s: u64,
    pub drain_timeout_s: u64,
    pub base_port: Option<u16>,
    pub keep_dir: bool,
    pub json: Option<std::path::PathBuf>,
}

/// Runs the mode; fails when a check fails.
pub async fn run(args: &Settings) -> Result<()> {
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
    let (replies, proxied) = Replies::start(&direct);
    let replies = Arc::new(replies);
    let enqueuer = Client::new(&Config::from_toml(&list(&proxied, 3))?)?;
    let own = Client::from_shards(all.clone(), three.limits.clone());

    let summary = Arc::new(std::sync::Mutex::new(Summary::default()));
    let gate = Arc::new(RwLock::new(()));
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
        gate.clone(),
    ));
    let blackouts = tokio::spawn({
        let (replies, stop) = (replies.clone(), stop.clone());
        async move { replies.blackouts(stop).await }
    });
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
        if new == 2 {
            fleet.lock().await.kill_old_list().await?;
        }
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
            // No enqueue may be unsettled meanwhile: `enqueue_again` finds
            // a job written there before the move by looking there.
            let left = {
                let _alone = gate.write().await;
                empty(all.get(2)).await?
            };
            let mut s = summary.lock().unwrap();
            for found in left {
                if found.status == "unfinished" {
                    s.failures.push(format!(
                        "job {} ({}) left unfinished on the shard a move emptied",
                        found.u, found.id
                    ));
                }
                s.archived.push(found);
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
    let blackouts = blackouts.await?;
    replies.quiet();
    let archived = summary.lock().unwrap().archived.clone();
    let drain_started = Instant::now();
    let drained = verify::drain(
        &own,
        enqueued.len().saturating_sub(archived.len()),
        Duration::from_secs(args.drain_timeout_s),
    )
    .await;
    let drain_s = drain_started.elapsed().as_secs_f64();
    let _ = sampler.await;
    let (killed, before_shrink) = {
        let mut fleet = fleet.lock().await;
        fleet.stop().await;
        (fleet.killed, fleet.killed_before_shrink)
    };
    {
        let mut s = summary.lock().unwrap();
        s.drain_s = drain_s;
        s.workers_killed = killed;
        s.killed_before_shrink = before_shrink;
        s.enqueued = enqueued.len();
        if let Err(e) = drained {
            s.failures.push(format!("{e:#}"));
        }
    }
    let failures = verify::check_once(&own, &enqueued, &archived).await?;
    let mut s = summary.lock().unwrap();
    s.failures.extend(failures);
    s.lost_replies = replies.lost();
    s.blackouts = blackouts;
    verify::print(&s);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&*s)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
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
/// the jobs it held (`succeeded`, or `unfinished` for one a move should
/// have taken), which the checks count as they were.
async fn empty(shard: &shardq::shards::Shard) -> Result<Vec<Found>> {
    let mut db = shard.client().await?;
    let tx = db.transaction().await?;
    tx.batch_execute(sql::LOCK_JOBS)
        .await
        .context("cannot lock the table of the shard that left")?;
    let rows = tx.query(sql::JOBS, &[&QUEUE]).await?;
    tx.batch_execute(sql::EMPTY_JOBS).await?;
    tx.commit().await?;
    Ok(rows
        .iter()
        .map(|r| Found::from_row(r, &shard.name))
        .collect())
}

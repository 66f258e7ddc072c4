//! The reshard run's checks: sampled every second during the faults (the
//! invariant check, each deduplication id held by one job at most), limit
//! changes in force once set, and after the drain every job once.

use super::load::{Enqueued, AGAIN};
use super::sql;
use super::summary::{Found, Summary, QUEUE};
use anyhow::{bail, Result};
use rand::Rng;
use shardq::client::{CheckOptions, QueueLimits};
use shardq::config::Config;
use shardq::shards::ShardSet;
use shardq::store::check::Invariant;
use shardq::Client;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Most failures of one kind listed (the count says the rest).
const LISTED: usize = 10;

/// A change of the queue's limit as a writer whose clock ran two minutes
/// ahead made it (its revision, that clock, in microseconds), on every
/// shard: every later change must still take effect.
pub async fn skewed_limit_write(all: &ShardSet) -> Result<()> {
    let ahead = (SystemTime::now() + Duration::from_secs(120))
        .duration_since(UNIX_EPOCH)?
        .as_micros() as i64;
    for shard in all.all() {
        shard
            .client()
            .await?
            .execute(sql::SKEWED_LIMIT, &[&QUEUE, &ahead])
            .await?;
    }
    Ok(())
}

/// Sets the queue's concurrency to a new value every 3 s and reads it back
/// until `stop`; then lifts it.
pub async fn change_limits(client: Client, summary: Arc<Mutex<Summary>>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(3)) => {}
        }
        let n = rand::thread_rng().gen_range(8..64);
        let set = QueueLimits {
            concurrency: Some(n),
            ..QueueLimits::default()
        };
        let failure = match client.set_queue_limits(QUEUE, set).await {
            Err(e) => Some(format!("limit set to {n}: {e}")),
            Ok(()) => match client.queue_limits().await {
                Ok(limits) => limits
                    .iter()
                    .find(|l| l.queue == QUEUE)
                    .filter(|l| l.limits.concurrency == Some(n))
                    .map_or_else(
                        || Some(format!("limit set to {n} but not in force: {limits:?}")),
                        |_| None,
                    ),
                Err(e) => Some(format!("limits unreadable: {e}")),
            },
        };
        let mut s = summary.lock().unwrap();
        s.limit_changes += 1;
        s.failures.extend(failure);
    }
    if let Err(e) = client.set_queue_limits(QUEUE, QueueLimits::default()).await {
        summary
            .lock()
            .unwrap()
            .failures
            .push(format!("limit lifted: {e}"));
    }
}

/// Every second until `stop`: the invariant check (clean but for the
/// shard map's place, which a move changes under a fixed list) and the
/// deduplication ids.
pub async fn sample(
    client: Client,
    config: Config,
    summary: Arc<Mutex<Summary>>,
    stop: CancellationToken,
) {
    let options = CheckOptions::from_config(&config);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let report = client.check(&options).await;
        let mut found = Vec::new();
        for invariant in report.broken_invariants() {
            if invariant != Invariant::ShardMap {
                found.push(format!(
                    "check: {invariant:?} broken {} time(s)",
                    report.broken(invariant)
                ));
            }
        }
        match dedup_held_twice(client.shards()).await {
            Ok(twice) => found.extend(twice),
            Err(e) => tracing::debug!(error = format!("{e:#}"), "a dedup sample failed"),
        }
        let mut s = summary.lock().unwrap();
        s.samples += 1;
        s.failures.extend(found);
    }
}

/// Deduplication ids held by two different unfinished jobs, over every
/// shard (a job being copied is one job on two shards, under one id).
async fn dedup_held_twice(shards: &ShardSet) -> Result<Vec<String>> {
    let mut holders: HashMap<String, HashSet<(i32, i64)>> = HashMap::new();
    for shard in shards.all() {
        for row in shard.client().await?.query(sql::DEDUP_HELD, &[]).await? {
            holders
                .entry(row.get(0))
                .or_default()
                .insert((row.get(1), row.get(2)));
        }
    }
    Ok(holders
        .into_iter()
        .filter(|(_, jobs)| jobs.len() > 1)
        .map(|(id, jobs)| {
            format!(
                "deduplication id {id} held by {} jobs: {jobs:?}",
                jobs.len()
            )
        })
        .collect())
}

/// Waits until `expected` jobs succeeded on the shards, or `limit` passes.
pub async fn drain(client: &Client, expected: usize, limit: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let mut done = 0;
        for shard in client.shards().all() {
            let row = shard
                .client()
                .await?
                .query_one(sql::SUCCEEDED, &[&QUEUE])
                .await?;
            done += row.get::<_, i64>(0);
        }
        if done >= expected as i64 {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("{done} of {expected} jobs succeeded after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// After the drain: each enqueued job is one row, succeeded, under the id
/// its enqueue answered; no other row; each deduplication id one job.
pub async fn check_once(
    client: &Client,
    enqueued: &[Enqueued],
    archived: &[Found],
) -> Result<Vec<String>> {
    let mut found: Vec<Found> = archived.to_vec();
    for shard in client.shards().all() {
        for row in shard.client().await?.query(sql::JOBS, &[&QUEUE]).await? {
            found.push(Found::from_row(&row, &shard.name));
        }
    }
    let mut rows: HashMap<u64, Vec<&Found>> = HashMap::new();
    let mut dedups: HashMap<&str, Vec<&Found>> = HashMap::new();
    for f in &found {
        rows.entry(f.u).or_default().push(f);
        // A second enqueue answered too late to judge may have been
        // written after the first job finished: its own job, under the id.
        if let (Some(d), true) = (&f.dedup_id, f.u < AGAIN) {
            dedups.entry(d).or_default().push(f);
        }
    }
    let mut failures = Vec::new();
    let wanted: HashSet<u64> = enqueued.iter().map(|e| e.n).collect();
    let mut bad: Vec<String> = enqueued
        .iter()
        .filter_map(|e| match rows.get(&e.n).map(Vec::as_slice) {
            Some([f]) if f.status == "succeeded" && f.id == e.id => None,
            Some(r) => Some(format!("job {} (enqueue answered {}): {r:?}", e.n, e.id)),
            None => Some(format!("job {} ({}) lost", e.n, e.id)),
        })
        .collect();
    bad.extend(
        rows.iter()
            .filter(|(u, _)| !wanted.contains(u))
            .map(|(u, r)| format!("a job nobody enqueued (u = {u}): {r:?}")),
    );
    if !bad.is_empty() {
        failures.push(format!(
            "{} job(s) not exactly once under their id: {:?}",
            bad.len(),
            &bad[..bad.len().min(LISTED)]
        ));
    }
    let twice: Vec<_> = dedups.iter().filter(|(_, r)| r.len() > 1).collect();
    if !twice.is_empty() {
        failures.push(format!(
            "{} deduplication id(s) written twice: {:?}",
            twice.len(),
            &twice[..twice.len().min(LISTED)]
        ));
    }
    Ok(failures)
}

/// The summary, as the run ends.
pub fn print(s: &Summary) {
    let mut moves = s.moves.clone();
    moves.sort_by(f64::total_cmp);
    let median = moves.get(moves.len() / 2).copied().unwrap_or(0.0);
    let max = moves.last().copied().unwrap_or(0.0);
    println!("reshard chaos:");
    println!(
        "  moves finished: {} (median {median:.1} s, longest {max:.1} s); not finished: {}",
        moves.len(),
        s.move_errors.len()
    );
    for e in &s.move_errors {
        println!("    {e}");
    }
    println!(
        "  jobs enqueued: {}; insert replies lost: {} ({} blackouts); outcomes unknown: {}, \
         settled with {} enqueue_again",
        s.enqueued, s.lost_replies, s.blackouts, s.unknown_outcomes, s.settled_again
    );
    println!(
        "  deduplicated jobs enqueued again while held: {} refused, {} answered with the \
         first's id ({} answered too late to judge)",
        s.dedup_refused, s.dedup_existing, s.dedup_unjudged
    );
    println!(
        "  workers SIGKILLed: {} ({} of the old list as a shrink began); limit changes: {}; \
         samples: {}",
        s.workers_killed, s.killed_before_shrink, s.limit_changes, s.samples
    );
    println!(
        "  drained {:.1} s after the fault phase; jobs emptied with the shard that left: {}",
        s.drain_s,
        s.archived.len()
    );
    if s.failures.is_empty() {
        println!("  checks: every job once, no deduplication id twice, every limit change in force, check clean: PASS");
    } else {
        let mut seen = HashSet::new();
        println!("  checks FAILED ({}):", s.failures.len());
        for f in s
            .failures
            .iter()
            .filter(|f| seen.insert((*f).clone()))
            .take(30)
        {
            println!("    {f}");
        }
    }
}

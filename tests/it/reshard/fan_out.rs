//! A fan-out across shards while the shards grow 2 → 4: a parent keyed to
//! one shard starts children keyed to keys of their own (spread over the
//! shards by whatever map its run routes by), then gathers their results,
//! while the move runs. The children that run first wait until the move
//! has copied its ranges once (they hold every slot), so the rest stay
//! queued and move with their ranges, and the parents move parked. A worker of the two-shard
//! list runs first; one of the four-shard list starts once the move has
//! opened its ranges, and the first stops after the move (a rolling
//! deploy). Every child runs once, every result reaches its parent once,
//! and no child is written twice on any shard.

use super::{growing_to_four, GrowingToFour};
use serde_json::json;
use shardq::reshard::{reshard, Options, Progress, Step};
use shardq::shards::ShardSet;
use shardq::{ChildResult, Client, Config, HandlerRegistry, JobOutcome, NewJob, Worker};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const CHILDREN: usize = 40;

/// Small batches and buffer: the children beyond the running ones stay
/// queued (claimed jobs are running, and a move leaves them).
const FAN_OUT_TOML: &str = "
[dequeue]
batch_size = 4
empty_backoff_min_ms = 5
empty_backoff_max_ms = 50
[worker]
queues = [\"moving\"]
concurrency = 8
buffer_jobs = 4
maintenance_interval_ms = 100
";
const PARENTS: usize = 3;

/// `parent` starts [`CHILDREN`] children, each keyed by a key of its own,
/// then sums their results; `child` (its runs counted by its index) waits
/// until `moved` says the move copied its ranges once.
fn registry(runs: Arc<Vec<AtomicU32>>, moved: watch::Receiver<bool>) -> HandlerRegistry {
    let mut registry = HandlerRegistry::new();
    registry.register("parent", |ctx| async move {
        let p = ctx.payload["p"].as_u64().unwrap_or(0) as usize;
        let mut handles = Vec::with_capacity(CHILDREN);
        for c in 0..CHILDREN {
            let i = p * CHILDREN + c;
            let child =
                NewJob::new("moving", "child", json!({ "i": i })).ordering_key(format!("fan-{i}"));
            handles.push(ctx.start_child(child).await?);
        }
        let mut sum = 0;
        for handle in &handles {
            match handle.result().await? {
                ChildResult::Succeeded(v) => sum += v.as_i64().unwrap_or(0),
                other => return Err(format!("a child ended {other:?}").into()),
            }
        }
        Ok(json!(sum))
    });
    registry.register("child", move |ctx| {
        let (runs, mut moved) = (runs.clone(), moved.clone());
        async move {
            let i = ctx.payload["i"].as_u64().unwrap_or(0) as usize;
            runs[i].fetch_add(1, Ordering::SeqCst);
            moved.wait_for(|done| *done).await?;
            Ok(json!(i * 10))
        }
    });
    registry
}

fn worker(
    config: &Config,
    runs: &Arc<Vec<AtomicU32>>,
    moved: &watch::Receiver<bool>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (config, stop) = (config.clone(), stop.clone());
    let registry = registry(runs.clone(), moved.clone());
    tokio::spawn(async move {
        let shards = ShardSet::connect(&config).unwrap();
        Worker::new(config, shards, registry).run(stop).await;
    })
}

/// Every child row of the run, over every shard: (shard key, id, status,
/// the shard it is on).
async fn child_rows(all: &ShardSet) -> Vec<(i32, i64, String, usize)> {
    let mut rows = Vec::new();
    for shard in all.all() {
        let found = shard
            .client()
            .await
            .unwrap()
            .query(
                "SELECT shard_key, id, status FROM workflow_status \
                 WHERE handler = 'child' AND status <> 'held'",
                &[],
            )
            .await
            .unwrap();
        rows.extend(
            found
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), shard.index)),
        );
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_spread_over_the_shards_run_once_while_two_grow_to_four() {
    let GrowingToFour {
        servers: _servers,
        old,
        new,
        all,
    } = growing_to_four(FAN_OUT_TOML).await;
    let runs: Arc<Vec<AtomicU32>> =
        Arc::new((0..PARENTS * CHILDREN).map(|_| AtomicU32::new(0)).collect());
    let client = Client::new(&new).unwrap();
    let mut parents = Vec::new();
    for p in 0..PARENTS {
        let parent =
            NewJob::new("moving", "parent", json!({ "p": p })).ordering_key(format!("parent-{p}"));
        parents.push(client.enqueue(parent).await.unwrap());
    }

    let (moved_tx, moved) = watch::channel(false);
    let old_stop = CancellationToken::new();
    let old_worker = worker(&old, &runs, &moved, &old_stop);
    // The children are started, and the first hold every slot, when the
    // move starts.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stopped = Options {
        stop_after: Some(Step::Opened),
        ..Options::default()
    };
    let opened = reshard(&all, 2, 4, &stopped, |_| {})
        .await
        .expect("first step");
    assert!(!opened.complete && opened.ranges > 0);
    let new_stop = CancellationToken::new();
    let new_worker = worker(&new, &runs, &moved, &new_stop);
    // The first drain pass copied the queued children and the parked
    // parents; the running children go on then (the drain waits for them).
    let summary = reshard(&all, 2, 4, &Options::default(), |p| {
        if matches!(p, Progress::Pass { .. }) {
            let _ = moved_tx.send(true);
        }
    })
    .await
    .expect("the move finishes");
    assert!(summary.complete, "{summary:?}");
    assert!(
        opened.moved + summary.moved > 0,
        "queued children and parked parents moved: {opened:?} {summary:?}"
    );
    old_stop.cancel();
    old_worker.await.unwrap();

    for (p, &parent) in parents.iter().enumerate() {
        let outcome = client
            .result(parent, Duration::from_secs(120))
            .await
            .unwrap();
        let expected: usize = (p * CHILDREN..(p + 1) * CHILDREN).map(|i| i * 10).sum();
        assert_eq!(
            outcome,
            JobOutcome::Succeeded(json!(expected)),
            "parent {p}"
        );
    }
    new_stop.cancel();
    new_worker.await.unwrap();

    let twice: Vec<usize> = (0..PARENTS * CHILDREN)
        .filter(|&i| runs[i].load(Ordering::SeqCst) != 1)
        .collect();
    assert!(twice.is_empty(), "children not run exactly once: {twice:?}");
    let rows = child_rows(&all).await;
    let distinct: HashSet<(i32, i64)> = rows.iter().map(|(k, id, _, _)| (*k, *id)).collect();
    assert_eq!(
        rows.len(),
        PARENTS * CHILDREN,
        "one row per child: {rows:?}"
    );
    assert_eq!(distinct.len(), rows.len(), "no child written twice");
    assert!(rows.iter().all(|(_, _, s, _)| s == "succeeded"), "{rows:?}");
    let used: HashSet<usize> = rows.iter().map(|(_, _, _, on)| *on).collect();
    assert!(used.len() >= 3, "children spread over the shards: {used:?}");
}

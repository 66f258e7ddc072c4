//! A shard that stops answering during a move: the move waits, or with
//! patience gives up, and loses nothing.

use super::{on_servers_with_jobs, unfinished, GrowingToThree};
use serde_json::json;
use shardq::reshard::{reshard, Options, Step};
use shardq::{HandlerRegistry, NewJob, Worker};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The old shard frozen (SIGSTOP) while its range is being copied: the
/// command's statements there give up at their deadline and are tried
/// again; once the server answers again the move finishes, and every job
/// runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_frozen_during_the_copy_makes_the_move_wait_and_lose_nothing() {
    use nix::sys::signal::Signal;
    let jobs: Vec<NewJob> = (0..3_000)
        .map(|i| {
            NewJob::new("moving", "noop", json!({ "i": i })).ordering_key(format!("k-{}", i % 300))
        })
        .collect();
    let (
        GrowingToThree {
            servers, new, all, ..
        },
        first,
    ) = on_servers_with_jobs(1_000, jobs).await;
    // Frozen once the ranges are open, as the copy begins; thawed 3 s later.
    let frozen = std::sync::atomic::AtomicBool::new(false);
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut retries = 0;
    let moving = async {
        let summary = reshard(&all, 2, 3, &Options::default(), |p| match p {
            shardq::reshard::Progress::Done(Step::Opened) => {
                servers.servers[0]
                    .server()
                    .signal_all(Signal::SIGSTOP)
                    .unwrap();
                frozen.store(true, Ordering::SeqCst);
            }
            shardq::reshard::Progress::Retrying { .. } => retries += 1,
            _ => {}
        })
        .await;
        done.store(true, Ordering::SeqCst);
        summary
    };
    let thaw = async {
        while !frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let waited = !done.load(Ordering::SeqCst);
        servers.servers[0]
            .server()
            .signal_all(Signal::SIGCONT)
            .unwrap();
        waited
    };
    let (summary, waited) = tokio::time::timeout(Duration::from_secs(90), async {
        tokio::join!(moving, thaw)
    })
    .await
    .expect("the move finishes once the shard answers");
    let summary = summary.unwrap();
    assert!(waited, "the move waited for the frozen shard");
    assert!(retries > 0, "the frozen shard's steps were retried");
    assert!(summary.complete && summary.moved > 0, "{summary:?}");

    let report = Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded as usize, first.len());
    assert_eq!(unfinished(&all).await, 0);
}

/// With patience set (`shardq reshard --give-up-after`), a shard that stops
/// answering mid-move ends the command with an error instead of a wait;
/// the move stays recorded, and run again once the shard answers, it
/// finishes with every job run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_with_patience_gives_up_on_a_frozen_shard_and_finishes_when_run_again() {
    use nix::sys::signal::Signal;
    let jobs: Vec<NewJob> = (0..600)
        .map(|i| NewJob::new("moving", "noop", json!({ "i": i })))
        .collect();
    let (
        GrowingToThree {
            servers, new, all, ..
        },
        first,
    ) = on_servers_with_jobs(500, jobs).await;
    let patient = Options {
        patience: Some(Duration::from_secs(2)),
        ..Options::default()
    };
    let mut retries = 0;
    // Frozen once the ranges are open, as the copy begins.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(30),
        reshard(&all, 2, 3, &patient, |p| match p {
            shardq::reshard::Progress::Done(Step::Opened) => {
                servers.servers[0]
                    .server()
                    .signal_all(Signal::SIGSTOP)
                    .unwrap();
            }
            shardq::reshard::Progress::Retrying { .. } => retries += 1,
            _ => {}
        }),
    )
    .await;
    servers.servers[0]
        .server()
        .signal_all(Signal::SIGCONT)
        .unwrap();
    let gave_up = gave_up.expect("the command gives up instead of waiting");
    assert!(gave_up.is_err(), "{gave_up:?}");
    assert!(
        retries > 1,
        "it tried again before giving up ({retries}): {gave_up:?}"
    );

    let summary = reshard(&all, 2, 3, &Options::default(), |_| {})
        .await
        .unwrap();
    assert!(summary.complete);
    let report = Worker::new(new.clone(), all.clone(), HandlerRegistry::with_builtins())
        .stop_when_empty(true)
        .run(CancellationToken::new())
        .await;
    assert_eq!(report.stats.succeeded as usize, first.len());
    assert_eq!(unfinished(&all).await, 0);
}

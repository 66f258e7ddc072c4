//! Per-shard progress during the run, and the stalls of healthy shards found
//! in it. Every second each shard is asked (on its own connection, with a
//! deadline, so a frozen shard only loses its own samples) how many jobs have
//! finished and how many are ready, and how far promotion of due jobs and
//! recovery of expired leases are behind. A shard *stalls* while it has ready
//! jobs and finishes none; it *lags* while a due job waits for promotion or
//! an expired lease for recovery. Either counts against it only while no
//! fault is on it (nor was in the last [`RECOVERY_SLACK`]).

use super::super::faults::Event;
use super::super::sql;
use serde::Serialize;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often each shard is sampled.
const EVERY: Duration = Duration::from_secs(1);

/// Deadline of one shard's sample (connect included): below [`EVERY`], so a
/// frozen shard does not delay the next round.
const SAMPLE_DEADLINE: Duration = Duration::from_millis(900);

/// Longest a shard with no fault on it may have ready jobs and finish none.
/// Generous: CI runs servers, workers and this process on 2 loaded cores,
/// and a disturbed shard's neighbours may slow down (not stop).
pub const HEALTHY_STALL_LIMIT: Duration = Duration::from_secs(10);

/// Longest a shard with no fault on it may leave a due job unpromoted or an
/// expired lease unrecovered (both run every 50 ms in the torture run).
pub const HEALTHY_LAG_LIMIT: Duration = Duration::from_secs(10);

/// How long after a fault on a shard ends it is still taken as disturbed:
/// its workers' backoff (up to 1 s) and a reconnect, with room for 2 loaded
/// cores.
const RECOVERY_SLACK: f64 = 5.0;

/// One successful sample of one shard.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the fault phase began.
    pub at_s: f64,
    /// Jobs of the run's queues in a final state.
    pub finished: i64,
    /// Jobs ready to be claimed.
    pub ready: i64,
    /// Seconds the most overdue scheduled job is past its time.
    pub promotion_lag_s: f64,
    /// Seconds the oldest expired lease is past its expiry.
    pub recovery_lag_s: f64,
}

/// A shard's longest stall outside its faults.
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    /// Shard index.
    pub shard: usize,
    /// Samples taken (failed ones are not counted).
    pub samples: usize,
    /// Samples that failed (deadline or error), mostly while a fault was on it.
    pub failed_samples: usize,
    /// Longest time with ready jobs, nothing finished and no fault on it.
    pub longest_s: f64,
    /// When that stall ended.
    pub at_s: f64,
    /// Longest promotion lag outside its faults.
    pub promotion_lag_s: f64,
    /// Longest recovery lag outside its faults.
    pub recovery_lag_s: f64,
    /// Jobs finished per sample (the difference to the previous one).
    pub finished_per_sample: Vec<i64>,
}

/// Samples every shard at `urls` every second from `started` until `stop`;
/// returns each shard's samples and how many failed.
pub async fn monitor(
    urls: Vec<String>,
    queues: Vec<String>,
    started: Instant,
    stop: CancellationToken,
) -> Vec<(Vec<Sample>, usize)> {
    let shards = urls.into_iter().map(|url| {
        let (queues, stop) = (queues.clone(), stop.clone());
        async move { sample_shard(url, queues, started, stop).await }
    });
    futures_util::future::join_all(shards).await
}

async fn sample_shard(
    url: String,
    queues: Vec<String>,
    started: Instant,
    stop: CancellationToken,
) -> (Vec<Sample>, usize) {
    let mut samples = Vec::new();
    let mut failed = 0;
    let mut db: Option<tokio_postgres::Client> = None;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return (samples, failed),
            _ = tick.tick() => {}
        }
        let asked = async {
            if db.is_none() {
                db = Some(super::super::faults::connect(&url).await?);
            }
            let db = db.as_ref().expect("connected");
            anyhow::Ok(db.query_one(sql::QUEUE_PROGRESS, &[&queues]).await?)
        };
        match tokio::time::timeout(SAMPLE_DEADLINE, asked).await {
            Ok(Ok(row)) => samples.push(Sample {
                at_s: started.elapsed().as_secs_f64(),
                finished: row.get(3),
                ready: row.get(4),
                promotion_lag_s: row.get(5),
                recovery_lag_s: row.get(6),
            }),
            // A connection that failed or missed its deadline may be stuck:
            // the next sample opens a new one.
            _ => {
                failed += 1;
                db = None;
            }
        }
    }
}

/// Whether a fault of `events` was on `shard` at `at` (or ended less than
/// [`RECOVERY_SLACK`] before).
pub fn disturbed(events: &[Event], shard: usize, at: f64) -> bool {
    events
        .iter()
        .any(|e| e.shard == Some(shard) && e.at_s <= at && at <= e.until_s + RECOVERY_SLACK)
}

/// Each shard's longest stall and lags outside the faults on it (`events`).
pub fn stalls(per_shard: &[(Vec<Sample>, usize)], events: &[Event]) -> Vec<Stall> {
    per_shard
        .iter()
        .enumerate()
        .map(|(shard, (samples, failed))| {
            let disturbed = |at: f64| disturbed(events, shard, at);
            let (mut longest_s, mut at_s) = (0.0, 0.0);
            let (mut promotion_lag_s, mut recovery_lag_s) = (0.0f64, 0.0f64);
            let mut since: Option<f64> = None;
            let mut previous: Option<&Sample> = None;
            for sample in samples {
                let progressed = previous.is_none_or(|p| sample.finished > p.finished);
                let disturbed = disturbed(sample.at_s);
                if !disturbed {
                    promotion_lag_s = promotion_lag_s.max(sample.promotion_lag_s);
                    recovery_lag_s = recovery_lag_s.max(sample.recovery_lag_s);
                }
                if progressed || sample.ready == 0 || disturbed {
                    since = Some(sample.at_s);
                } else if let Some(start) = since {
                    let stalled = sample.at_s - start;
                    if stalled > longest_s {
                        (longest_s, at_s) = (stalled, sample.at_s);
                    }
                }
                previous = Some(sample);
            }
            let finished_per_sample = samples
                .windows(2)
                .map(|w| w[1].finished - w[0].finished)
                .collect();
            Stall {
                shard,
                samples: samples.len(),
                failed_samples: *failed,
                longest_s,
                at_s,
                promotion_lag_s,
                recovery_lag_s,
                finished_per_sample,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: f64, finished: i64, ready: i64) -> Sample {
        Sample {
            at_s,
            finished,
            ready,
            promotion_lag_s: 0.0,
            recovery_lag_s: 0.0,
        }
    }

    fn fault_on(shard: usize, at_s: f64, until_s: f64) -> Event {
        Event {
            at_s,
            until_s,
            fault: "freeze shard",
            shard: Some(shard),
            detail: String::new(),
            error: None,
        }
    }

    #[test]
    fn a_stall_counts_only_with_ready_jobs_and_no_fault_on_the_shard() {
        let flat = |ready| (1..=20).map(|t| sample(t as f64, 5, ready)).collect();
        let shards = vec![(flat(3), 0), (flat(0), 0), (flat(3), 0)];
        let events = [fault_on(2, 0.0, 20.0), fault_on(1, 0.0, 20.0)];
        let found = stalls(&shards, &events);
        assert_eq!(
            found[0].longest_s, 19.0,
            "ready, nothing finished, no fault"
        );
        assert_eq!(found[1].longest_s, 0.0, "nothing ready");
        assert_eq!(found[2].longest_s, 0.0, "its own fault all along");
    }

    #[test]
    fn progress_and_the_end_of_a_fault_restart_the_clock() {
        let mut samples: Vec<Sample> = (0..10).map(|t| sample(t as f64, t, 9)).collect();
        samples.extend((10..30).map(|t| sample(t as f64, 10, 9)));
        // Under a fault from 10 to 17 s (and its slack to 22 s): the stall
        // runs from 22 s to 29 s.
        let found = stalls(&[(samples, 2)], &[fault_on(0, 10.0, 17.0)]);
        assert_eq!(found[0].longest_s, 7.0);
        assert_eq!(found[0].at_s, 29.0);
        assert_eq!(found[0].failed_samples, 2);
        assert_eq!(found[0].finished_per_sample.iter().sum::<i64>(), 10);
    }

    #[test]
    fn lags_count_outside_the_faults_only() {
        let lagging = |at_s: f64, lag: f64| Sample {
            promotion_lag_s: lag,
            recovery_lag_s: lag / 2.0,
            ..sample(at_s, at_s as i64, 1)
        };
        let samples = vec![lagging(1.0, 30.0), lagging(20.0, 12.0), lagging(30.0, 3.0)];
        let found = stalls(&[(samples, 0)], &[fault_on(0, 0.0, 10.0)]);
        assert_eq!(
            found[0].promotion_lag_s, 12.0,
            "the 30 s lag was under the fault"
        );
        assert_eq!(found[0].recovery_lag_s, 6.0);
    }
}

//! The serial baseline: each of C loops claims one job, runs it, and writes its
//! completion, paying two round trips per job. Kept to measure the pipeline
//! against (`shardq worker --serial`).

use super::rotation::{Next, Rotation};
use super::{executor, Pipeline, Stats};
use crate::store::jobs::{self, Claim, ClaimParams, CompleteMany};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// One serial loop; returns at shutdown.
pub(crate) async fn run(
    pipeline: Arc<Pipeline>,
    mut rotation: Rotation,
    shutdown: CancellationToken,
) {
    let stats = &pipeline.stats;
    let mut rng = StdRng::from_entropy();
    while !shutdown.is_cancelled() {
        let target = match rotation.next(Instant::now()) {
            Next::Visit(t) => t,
            Next::WaitUntil(until) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(until.into()) => continue,
                }
            }
        };
        let (shard_index, queue) = &pipeline.targets[target];
        let shard = pipeline.shards.get(*shard_index);
        let params = ClaimParams {
            queue,
            limit: 1,
            owner: &pipeline.owner,
            lease: pipeline.config.worker.lease,
            mode: pipeline.config.dequeue.mode,
        };
        let started = Instant::now();
        let result = jobs::claim(shard, params).await;
        stats.record_claim(*shard_index, &result, started.elapsed());
        match result {
            Ok(Claim::Jobs(jobs)) => {
                rotation.claimed(target);
                for job in jobs {
                    pipeline.hold(&job);
                    let (id, fence) = (job.id, job.fence);
                    let done = executor::execute(&pipeline, job).await;
                    let done_at = done.finished;
                    let write = CompleteMany {
                        owner: &pipeline.owner,
                        retry: pipeline.config.worker.retry_backoff,
                        done: &[done],
                    };
                    let written = jobs::complete_many(shard, write).await;
                    pipeline.forget([(id, fence)]);
                    match written {
                        Ok(w) => {
                            stats.add_written(&w);
                            Stats::add(&stats.metrics.shards[*shard_index].completed, 1 - w.fenced);
                            stats
                                .metrics
                                .record_completion_lags(std::iter::once(done_at.elapsed()));
                        }
                        Err(err) => {
                            tracing::warn!(error = %crate::error_chain(&err), "completion failed; the job returns when its lease expires")
                        }
                    }
                }
            }
            Ok(Claim::Busy) => {
                if let Some(pause) = rotation.busy(target, Instant::now(), &mut rng) {
                    tokio::time::sleep(pause).await;
                }
            }
            Ok(Claim::Empty) => {
                rotation.empty(target, Instant::now(), &mut rng);
            }
            Err(err) => {
                rotation.failed(target, Instant::now(), &mut rng);
                tracing::warn!(error = %crate::error_chain(&err), "claim failed");
            }
        }
    }
}

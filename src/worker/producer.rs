//! Producers: claim batches while rotating over the shards, and hand the jobs
//! to the executor slots. A producer claims only when the process has room
//! for a whole batch (the `room` semaphore counts claimed-but-unfinished jobs).

use super::local_gate::Refused;
use super::rotation::{Next, Rotation};
use super::Pipeline;
use crate::job::ClaimedJob;
use crate::store::jobs::{self, Claim, ClaimParams};
use crate::store::ErrorKind;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Where claimed jobs go: keyed jobs to the slot their key hashes to, the
/// rest to a queue that every slot serves.
pub(crate) struct Dispatch {
    pub keyed: Vec<tokio::sync::mpsc::UnboundedSender<ClaimedJob>>,
    pub shared: async_channel::Sender<ClaimedJob>,
}

impl Dispatch {
    fn send(&self, job: ClaimedJob) {
        // Sends fail only when the executors are gone, i.e. at shutdown; the
        // job then stays claimed and its lease brings it back.
        match &job.ordering_key {
            Some(key) => {
                let slot = crate::router::fnv1a64(key.as_bytes()) as usize % self.keyed.len();
                let _ = self.keyed[slot].send(job);
            }
            None => {
                let _ = self.shared.try_send(job);
            }
        }
    }
}

/// One producer's loop; returns at shutdown.
pub(crate) async fn run(
    pipeline: Arc<Pipeline>,
    dispatch: Arc<Dispatch>,
    mut rotation: Rotation,
    shutdown: CancellationToken,
) {
    let batch = pipeline.config.dequeue.batch_size;
    loop {
        let room = tokio::select! {
            _ = shutdown.cancelled() => return,
            room = pipeline.room.clone().acquire_many_owned(batch) => room,
        };
        let Ok(room) = room else { return };
        room.forget();
        let claimed = claim_somewhere(&pipeline, &dispatch, &mut rotation, &shutdown).await;
        pipeline
            .room
            .add_permits((batch as usize).saturating_sub(claimed.unwrap_or(0)));
        if claimed.is_none() {
            return;
        }
    }
}

/// Visits targets until one yields jobs; `None` at shutdown.
async fn claim_somewhere(
    pipeline: &Pipeline,
    dispatch: &Dispatch,
    rotation: &mut Rotation,
    shutdown: &CancellationToken,
) -> Option<usize> {
    let stats = &pipeline.stats;
    let mut rng = StdRng::from_entropy();
    // Targets the local gate refused in a row, and the earliest it reopens one.
    let mut refused = 0;
    let mut reopens: Option<Instant> = None;
    loop {
        if shutdown.is_cancelled() {
            return None;
        }
        let now = Instant::now();
        let target = match rotation.next(now) {
            Next::Visit(target) => target,
            Next::WaitUntil(until) => {
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep_until(until.into()) => continue,
                }
            }
        };
        let entered = match pipeline.gate.try_enter(target, now) {
            Ok(entered) => entered,
            Err(why) => {
                refused += 1;
                let until = match why {
                    // A permit comes back within a claim statement; the cap
                    // only bounds a missed wake-up.
                    Refused::Full => now + pipeline.config.dequeue.busy_backoff.max,
                    Refused::SkipUntil(until) => until,
                };
                reopens = Some(reopens.map_or(until, |r| r.min(until)));
                if refused >= pipeline.targets.len() {
                    let until = reopens.take().unwrap_or(until);
                    refused = 0;
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = pipeline.gate.wait(until) => {}
                    }
                }
                continue;
            }
        };
        refused = 0;
        reopens = None;
        let (shard_index, queue) = &pipeline.targets[target];
        let shard = pipeline.shards.get(*shard_index);
        let params = ClaimParams {
            queue,
            limit: pipeline.config.dequeue.batch_size,
            owner: &pipeline.owner,
            lease: pipeline.config.worker.lease,
            mode: pipeline.config.dequeue.mode,
        };
        let started = Instant::now();
        let result = jobs::claim(shard, params).await;
        let now = Instant::now();
        stats.record_claim(*shard_index, &result, now - started);
        match result {
            Ok(Claim::Jobs(jobs)) => {
                entered.claimed();
                drop(entered);
                rotation.claimed(target);
                let n = jobs.len();
                let claim = pipeline.next_claim();
                for mut job in jobs {
                    job.claim = claim;
                    pipeline.hold(&job);
                    dispatch.send(job);
                }
                return Some(n);
            }
            Ok(Claim::Busy) => entered.busy(now, &mut rng),
            Ok(Claim::Empty) => entered.empty(now, &mut rng),
            Err(err) => {
                if err.kind() == ErrorKind::NoAnswer {
                    // No answer from the server: the claim may still have run.
                    pipeline.claim_reply_lost(*shard_index);
                }
                let delay = rotation.failed(target, now, &mut rng);
                tracing::warn!(
                    shard = %shard.name,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %crate::error_chain(&err),
                    "claim failed; skipping shard"
                );
            }
        }
    }
}

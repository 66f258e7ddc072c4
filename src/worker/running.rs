//! The jobs this process holds, from their claim until their outcome is
//! written (or given up), and the claims that may have left it holding jobs
//! it never received.

use super::permits::Permit;
use crate::job::{ClaimedJob, JobId};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Every job this process holds, with the shard it is on, its fence and its
/// cancellation token: the leaser extends exactly these leases and asks the
/// shards about exactly these cancellations; a cancelled one that has not
/// started never does.
///
/// Invariant: an entry is keyed by the job and belongs to one claim (its
/// fence); it is removed only with that fence, so a job claimed again since
/// (its lease lost) stays held under its new claim.
#[derive(Debug, Default)]
pub(crate) struct RunningJobs {
    held: Mutex<HashMap<JobId, Held>>,
}

/// A job held by this process.
#[derive(Debug)]
struct Held {
    shard: usize,
    fence: i64,
    cancel: CancellationToken,
    /// Its queue's permit, when the queue is limited: given back with the
    /// entry.
    _permit: Option<Permit>,
}

impl RunningJobs {
    /// Starts holding `job`, with its queue's `permit` if limited: from its
    /// claim until its outcome is written.
    pub(crate) fn hold(&self, job: &ClaimedJob, permit: Option<Permit>) {
        let held = Held {
            shard: job.shard,
            fence: job.fence,
            cancel: CancellationToken::new(),
            _permit: permit,
        };
        self.lock().insert(job.id, held);
    }

    /// The cancellation token of held job `id` (a fresh one if it is not held).
    pub(crate) fn cancel_token(&self, id: JobId) -> CancellationToken {
        self.lock()
            .get(&id)
            .map_or_else(CancellationToken::new, |h| h.cancel.clone())
    }

    /// Stops holding these claims of jobs (their outcomes are written or
    /// given up); an entry of a later claim of the same job stays.
    pub(crate) fn forget(&self, claims: impl IntoIterator<Item = (JobId, i64)>) {
        let mut held = self.lock();
        for (id, fence) in claims {
            if held.get(&id).is_some_and(|h| h.fence == fence) {
                held.remove(&id);
            }
        }
    }

    /// The ids of the held jobs on shard `shard`.
    pub(crate) fn ids_on(&self, shard: usize) -> HashSet<JobId> {
        self.lock()
            .iter()
            .filter(|(_, h)| h.shard == shard)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The held jobs on shard `shard`, with their fences.
    pub(crate) fn on(&self, shard: usize) -> Vec<(JobId, i64)> {
        self.lock()
            .iter()
            .filter(|(_, h)| h.shard == shard)
            .map(|(id, h)| (*id, h.fence))
            .collect()
    }

    /// Tells held job `id` that its cancellation was asked: a running handler
    /// sees it; an unstarted job is released instead of started.
    pub(crate) fn cancel(&self, id: JobId) {
        if let Some(held) = self.lock().get(&id) {
            held.cancel.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Held>> {
        self.held.lock().expect("running jobs")
    }
}

/// Per shard: when a claim there last failed without the server's answer (a
/// deadline, a cut connection), so the claim may have run anyway and left
/// this process owning jobs it never received. Producers note it; the
/// leaser gives such jobs back.
#[derive(Debug)]
pub(crate) struct LostClaims {
    last: Vec<Mutex<Option<Instant>>>,
}

impl LostClaims {
    /// For `shards` shards, none lost.
    pub(crate) fn new(shards: usize) -> Self {
        LostClaims {
            last: (0..shards).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Notes that a claim on shard `shard` may have run without its reply.
    pub(crate) fn lost(&self, shard: usize) {
        *self.last[shard].lock().expect("lost claims") = Some(Instant::now());
    }

    /// When a claim on shard `shard` last may have lost its reply.
    pub(crate) fn last(&self, shard: usize) -> Option<Instant> {
        *self.last[shard].lock().expect("lost claims")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, shard: usize, fence: i64) -> ClaimedJob {
        ClaimedJob {
            id: JobId { shard_key: 0, id },
            shard,
            queue: "q".into(),
            handler: "noop".into(),
            ordering_key: None,
            payload: serde_json::Value::Null,
            attempt: 1,
            fence,
            claim: 0,
            created_at: std::time::SystemTime::now(),
            held_until: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn forget_removes_only_the_same_claim() {
        let running = RunningJobs::default();
        running.hold(&job(1, 0, 10), None);
        running.hold(&job(2, 1, 20), None);
        // Job 1 was claimed again (fence 11): the old claim's outcome must not drop it.
        running.hold(&job(1, 0, 11), None);
        running.forget([(job(1, 0, 10).id, 10)]);
        assert_eq!(running.on(0), vec![(job(1, 0, 11).id, 11)]);
        running.forget([(job(1, 0, 11).id, 11)]);
        assert!(running.on(0).is_empty());
        assert_eq!(running.ids_on(1).len(), 1);
    }

    #[test]
    fn cancel_reaches_the_held_token() {
        let running = RunningJobs::default();
        let j = job(1, 0, 1);
        running.hold(&j, None);
        let token = running.cancel_token(j.id);
        assert!(!token.is_cancelled());
        running.cancel(j.id);
        assert!(token.is_cancelled());
        // Not held: a fresh, uncancelled token; cancelling it is a no-op.
        running.cancel(job(9, 0, 1).id);
        assert!(!running.cancel_token(job(9, 0, 1).id).is_cancelled());
    }
}

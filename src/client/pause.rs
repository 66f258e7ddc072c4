//! Pausing and resuming a queue on every shard.

use super::error::ClientError;
use super::handle::Client;
use crate::shards::ShardError;
use crate::store::queues;
use futures_util::future::join_all;

/// A queue paused on some shards.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PausedQueue {
    /// Queue.
    pub queue: String,
    /// The shards (names) it is paused on, in shard order: all of them
    /// unless a pause or resume reached only some.
    pub shards: Vec<String>,
    /// When it was first paused (the earliest shard's clock, as text).
    pub paused_at: String,
}

impl Client {
    /// Pauses `queue` on every shard: from the next claim statement on, no
    /// worker claims its jobs. Jobs already claimed (running, or in a
    /// worker's buffer) finish; enqueueing goes on. The state lives in the
    /// shards, so it survives restarts of workers and servers. Pausing a
    /// paused queue changes nothing.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for an empty name; [`ClientError::NotEveryShard`]
    /// when some shard did not answer (the others are paused: run it again).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: each shard's change is one statement, made or
    /// not, and running it again is harmless.
    pub async fn pause_queue(&self, queue: &str) -> Result<(), ClientError> {
        check_name(queue)?;
        let results = join_all(self.shards.all().iter().map(|s| queues::pause(s, queue))).await;
        self.every_shard("pause", queue, results)
    }

    /// Resumes `queue` on every shard and wakes the workers that listen
    /// there, so claiming comes back at once.
    ///
    /// # Errors
    ///
    /// As [`Client::pause_queue`].
    ///
    /// # Cancel safety
    ///
    /// As [`Client::pause_queue`].
    pub async fn resume_queue(&self, queue: &str) -> Result<(), ClientError> {
        check_name(queue)?;
        let results = join_all(self.shards.all().iter().map(|s| queues::resume(s, queue))).await;
        self.every_shard("resume", queue, results)
    }

    /// The paused queues, with the shards each is paused on.
    ///
    /// # Errors
    ///
    /// [`ClientError::Shard`] when a shard cannot be asked (then the answer
    /// is unknown).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn paused_queues(&self) -> Result<Vec<PausedQueue>, ClientError> {
        let shards = self.shards.all();
        let answers = join_all(shards.iter().map(queues::paused)).await;
        let mut paused: Vec<PausedQueue> = Vec::new();
        for (shard, answer) in shards.iter().zip(answers) {
            for p in answer? {
                match paused.iter_mut().find(|q| q.queue == p.queue) {
                    Some(q) => {
                        q.shards.push(shard.name.clone());
                        if p.paused_at < q.paused_at {
                            q.paused_at = p.paused_at;
                        }
                    }
                    None => paused.push(PausedQueue {
                        queue: p.queue,
                        shards: vec![shard.name.clone()],
                        paused_at: p.paused_at,
                    }),
                }
            }
        }
        paused.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(paused)
    }

    /// `Ok` when every shard made the change, else the shards that did not.
    pub(super) fn every_shard(
        &self,
        action: &'static str,
        queue: &str,
        results: Vec<Result<bool, ShardError>>,
    ) -> Result<(), ClientError> {
        let failed: Vec<String> = self
            .shards
            .all()
            .iter()
            .zip(results)
            .filter_map(|(shard, r)| {
                r.err()
                    .map(|e| format!("{} ({})", shard.name, crate::error_chain::error_chain(&e)))
            })
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(ClientError::NotEveryShard {
                action,
                queue: queue.to_string(),
                failed,
            })
        }
    }
}

/// A queue name PostgreSQL takes and a job could have.
pub(super) fn check_name(queue: &str) -> Result<(), ClientError> {
    let reason = if queue.is_empty() {
        crate::job::InvalidJob::EmptyName("queue")
    } else if queue.contains('\0') {
        crate::job::InvalidJob::NulInName("queue")
    } else {
        return Ok(());
    };
    Err(ClientError::Invalid { index: 0, reason })
}

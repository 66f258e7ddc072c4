//! How deep one queue is across the fleet: [`Client::depth`].

use super::error::ClientError;
use super::handle::Client;
use crate::shards::ShardError;
use crate::store::backlog::{self, StateCounts};

/// One queue's unfinished jobs, summed over the shards that answered.
#[derive(Debug)]
pub struct QueueDepth {
    /// The jobs by state, over every shard in [`QueueDepth::answered`].
    pub counts: StateCounts,
    /// The shards whose jobs are counted, by name.
    pub answered: Vec<String>,
    /// The shards of [`QueueDepth::answered`] whose `waiting`, `retrying`,
    /// `delayed` and `parked` jobs are not counted: their full read ran
    /// past half the shard's deadline (a long transaction holding the
    /// horizon, or millions of such jobs), and only the ready and running
    /// jobs were read.
    pub bounded: Vec<String>,
    /// The shards that did not answer (their jobs are not counted), with why.
    pub failed: Vec<(String, ShardError)>,
}

impl QueueDepth {
    /// Whether every shard answered in full, so that
    /// [`QueueDepth::counts`] is the whole fleet's.
    pub fn complete(&self) -> bool {
        self.failed.is_empty() && self.bounded.is_empty()
    }
}

impl Client {
    /// How many jobs of `queue` are ready, waiting, retrying, delayed and
    /// running, summed over the shards. Every shard is asked at once, each
    /// under its statement deadline, with one statement that reads only the
    /// partial indexes of unfinished jobs (no finished row is read, however
    /// much history the queue has); past half the deadline, with one that
    /// counts the ready and running jobs alone (listed in
    /// [`QueueDepth::bounded`]). A shard that fails is listed in
    /// [`QueueDepth::failed`], its jobs not counted: check
    /// [`QueueDepth::complete`] before treating the counts as the fleet's.
    ///
    /// # Errors
    ///
    /// [`ClientError::Shard`] (the first shard's error) when no shard
    /// answered.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn depth(&self, queue: &str) -> Result<QueueDepth, ClientError> {
        let asks = self.shards.all().iter().map(|shard| async move {
            let read = backlog::read_within(shard, Some(queue), shard.deadline());
            (shard, read.await)
        });
        let mut depth = QueueDepth {
            counts: StateCounts::default(),
            answered: Vec::new(),
            bounded: Vec::new(),
            failed: Vec::new(),
        };
        for (shard, answer) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(read) => {
                    for q in read.queues.iter().filter(|q| q.queue == queue) {
                        depth.counts.add(&q.depth);
                    }
                    depth.answered.push(shard.name.clone());
                    if read.bounded {
                        depth.bounded.push(shard.name.clone());
                    }
                }
                Err(e) => depth.failed.push((shard.name.clone(), e)),
            }
        }
        if depth.answered.is_empty() && !depth.failed.is_empty() {
            let (_, first) = depth.failed.swap_remove(0);
            return Err(ClientError::Shard(first));
        }
        Ok(depth)
    }
}

//! A queue's recent failures grouped by error, over every shard.

use super::handle::Client;
use crate::store::failures::{self, ErrorGroup};
use std::time::Duration;

/// A queue's recent failures by error over the shards that answered.
#[derive(Debug, Clone, Default)]
pub struct Failures {
    /// Most jobs first, then the newest.
    pub groups: Vec<ErrorGroup>,
    /// The shards that did not answer within the deadline.
    pub unanswered: Vec<String>,
    /// Shards that hit the per-shard row limit: their older failures in the
    /// span are not counted.
    pub truncated: Vec<String>,
}

/// What [`Client::failures_by_error`] reads.
#[derive(Debug, Clone, Copy)]
pub struct FailureOptions {
    /// How far back.
    pub within: Duration,
    /// At most this many failures per shard, the newest.
    pub per_shard: i64,
    /// How long one shard may take to answer.
    pub deadline: Duration,
}

impl Default for FailureOptions {
    /// The last 24 hours, 1,000 failures per shard, 2 s per shard.
    fn default() -> Self {
        FailureOptions {
            within: Duration::from_secs(24 * 3600),
            per_shard: 1_000,
            deadline: Duration::from_secs(2),
        }
    }
}

impl Client {
    /// The dead and failed jobs of `queue` that finished within
    /// `options.within`, grouped by their error's first line (digits
    /// folded), summed over the shards that answered; each shard reads at
    /// most `options.per_shard` of its newest, through the index of failed
    /// jobs.
    ///
    /// # Errors
    ///
    /// None: a shard that fails or misses the deadline is listed in
    /// [`Failures::unanswered`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn failures_by_error(&self, queue: &str, options: &FailureOptions) -> Failures {
        let asks = self.shards().all().iter().map(|shard| async move {
            let read = failures::by_error(shard, queue, options.within, options.per_shard);
            let answer = tokio::time::timeout(options.deadline, read).await;
            (shard.name.clone(), answer.ok().and_then(Result::ok))
        });
        let mut out = Failures::default();
        let mut all = Vec::new();
        for (name, answer) in futures_util::future::join_all(asks).await {
            match answer {
                Some(groups) => {
                    if groups.iter().map(|g| g.jobs).sum::<i64>() >= options.per_shard {
                        out.truncated.push(name);
                    }
                    all.extend(groups);
                }
                None => out.unanswered.push(name),
            }
        }
        out.groups = failures::merge(all);
        out
    }
}

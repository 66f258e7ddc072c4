//! What a producer claims from: one queue on one shard.

/// One queue on one shard, which a worker claims from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The shard's index in the shard set.
    pub shard: usize,
    /// The queue's name.
    pub queue: String,
}

/// Every target a worker serves: shard-major, queues in `worker.queues`
/// order. A target's index in this list is its number everywhere (the
/// gate, the rotation, the wake-ups and the telemetry's per-target
/// counters, which [`crate::telemetry::Stats`] numbers the same way).
pub(crate) fn targets(shards: usize, queues: &[String]) -> Vec<Target> {
    (0..shards)
        .flat_map(|shard| {
            queues.iter().map(move |queue| Target {
                shard,
                queue: queue.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_every_shard_and_queue_shard_major() {
        let queues = vec!["a".to_string(), "b".to_string()];
        let pairs: Vec<(usize, String)> = targets(2, &queues)
            .into_iter()
            .map(|t| (t.shard, t.queue))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (0, "a".to_string()),
                (0, "b".to_string()),
                (1, "a".to_string()),
                (1, "b".to_string())
            ]
        );
    }
}

//! One line per queue across the fleet (`shardq status`): the shards'
//! counts summed by queue and state, the longest-waiting ready job over
//! every shard and where it is.

use super::inspect::ShardStatus;
use std::collections::BTreeMap;

/// The queue name under which a shard reports its estimate of all finished
/// jobs (too many to count by queue).
pub const ALL_FINISHED: &str = "*";

/// One queue over every shard that answered.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QueueSummary {
    /// Queue.
    pub queue: String,
    /// Jobs by state (`queued`, `running`, `waiting`, `retrying`,
    /// `delayed`, and finished states where a shard counts them), summed.
    pub counts: BTreeMap<String, i64>,
    /// Seconds since the longest-waiting ready job of the queue became due,
    /// over every shard that answered.
    pub oldest_ready_s: Option<f64>,
    /// The shard that holds that job: the one furthest behind.
    pub oldest_on: Option<String>,
    /// How many shards hold jobs of the queue.
    pub shards: usize,
}

impl QueueSummary {
    /// The count of `state` (0 when absent).
    pub fn count(&self, state: &str) -> i64 {
        self.counts.get(state).copied().unwrap_or(0)
    }
}

/// Per queue, by name, the counts of every shard in `shards` that answered
/// (a shard that did not is left out: its jobs are not in the totals).
pub fn summarize(shards: &[ShardStatus]) -> Vec<QueueSummary> {
    let mut by_queue: BTreeMap<&str, QueueSummary> = BTreeMap::new();
    for shard in shards {
        let Some(counts) = &shard.counts else {
            continue;
        };
        let mut seen_here: Vec<&str> = Vec::new();
        for c in counts.iter().filter(|c| c.queue != ALL_FINISHED) {
            let summary = by_queue
                .entry(c.queue.as_str())
                .or_insert_with(|| QueueSummary {
                    queue: c.queue.clone(),
                    counts: BTreeMap::new(),
                    oldest_ready_s: None,
                    oldest_on: None,
                    shards: 0,
                });
            *summary.counts.entry(c.status.clone()).or_default() += c.count;
            if let Some(age) = c.oldest_ready_s {
                if summary.oldest_ready_s.is_none_or(|oldest| age > oldest) {
                    summary.oldest_ready_s = Some(age);
                    summary.oldest_on = Some(shard.shard.clone());
                }
            }
            if !seen_here.contains(&c.queue.as_str()) {
                seen_here.push(c.queue.as_str());
                summary.shards += 1;
            }
        }
    }
    by_queue.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::queues::QueueCount;

    fn count(queue: &str, status: &str, n: i64, oldest: Option<f64>) -> QueueCount {
        QueueCount {
            queue: queue.into(),
            status: status.into(),
            count: n,
            estimated: false,
            oldest_ready_s: oldest,
        }
    }

    fn shard(name: &str, counts: Option<Vec<QueueCount>>) -> ShardStatus {
        ShardStatus {
            shard: name.into(),
            target: String::new(),
            error: counts.is_none().then(|| "down".into()),
            counts,
            backlog_bounded: false,
            connections: None,
            horizon: None,
            wakes_owed: Vec::new(),
            schedules: Vec::new(),
        }
    }

    #[test]
    fn queues_are_summed_over_the_shards_that_answered_and_the_oldest_named() {
        let shards = [
            shard(
                "a",
                Some(vec![
                    count("mail", "queued", 3, Some(2.0)),
                    count("mail", "running", 1, None),
                    count("*", "finished", 1000, None),
                ]),
            ),
            shard(
                "b",
                Some(vec![
                    count("mail", "queued", 4, Some(9.5)),
                    count("sms", "dead", 2, None),
                ]),
            ),
            shard("c", None),
        ];
        let got = summarize(&shards);
        assert_eq!(got.len(), 2, "{got:?}");
        let mail = &got[0];
        assert_eq!((mail.count("queued"), mail.count("running")), (7, 1));
        assert_eq!(mail.oldest_ready_s, Some(9.5));
        assert_eq!(mail.oldest_on.as_deref(), Some("b"));
        assert_eq!(mail.shards, 2);
        assert_eq!((got[1].queue.as_str(), got[1].count("dead")), ("sms", 2));
        assert_eq!(got[1].oldest_ready_s, None);
    }
}

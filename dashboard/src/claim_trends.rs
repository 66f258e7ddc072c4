//! Each shard's claims over the last hour: how many claim statements the
//! live workers ran there, how many found every dequeue slot taken (lock
//! misses), and how long they took, per sample. Workers write cumulative
//! counters in their heartbeat (`shardq_workers`); the trend sampler reads
//! them every `trend_interval` (`Client::live_workers`) and keeps the
//! differences. A worker first seen in a sample counts from the next one
//! (its counters cover time before), a worker gone is dropped.

use shardq::client::WorkerRow;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// One shard's claims over one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClaimSpan {
    /// Claim statements, every answer.
    pub attempts: u64,
    /// Of those, the lock misses.
    pub busy: u64,
    /// Their time, in microseconds.
    pub claim_us: u64,
}

impl ClaimSpan {
    pub fn miss_rate(&self) -> Option<f64> {
        (self.attempts > 0).then(|| self.busy as f64 / self.attempts as f64)
    }

    /// The mean time of one claim.
    pub fn mean(&self) -> Option<Duration> {
        (self.attempts > 0).then(|| Duration::from_micros(self.claim_us / self.attempts))
    }

    fn add(&mut self, other: &ClaimSpan) {
        self.attempts += other.attempts;
        self.busy += other.busy;
        self.claim_us += other.claim_us;
    }
}

/// One shard's samples (`None`: it did not answer) and the counters of its
/// workers at the last answer.
#[derive(Default)]
struct ShardClaims {
    spans: VecDeque<Option<ClaimSpan>>,
    last: HashMap<String, ClaimSpan>,
}

/// The samples of every shard, the last `keep` of each.
pub(crate) struct ClaimTrends {
    keep: usize,
    shards: Mutex<Vec<ShardClaims>>,
}

impl ClaimTrends {
    pub fn new(keep: usize) -> ClaimTrends {
        ClaimTrends {
            keep: keep.max(1),
            shards: Mutex::new(Vec::new()),
        }
    }

    /// Folds one read of every shard's live workers (in shard order).
    pub fn push(&self, answers: Vec<Option<Vec<WorkerRow>>>) {
        let mut shards = self.shards.lock().expect("claim trends");
        if shards.len() < answers.len() {
            shards.resize_with(answers.len(), ShardClaims::default);
        }
        for (shard, answer) in shards.iter_mut().zip(answers) {
            let span = answer.map(|workers| fold(&mut shard.last, &workers));
            shard.spans.push_back(span);
            while shard.spans.len() > self.keep {
                shard.spans.pop_front();
            }
        }
    }

    /// Shard `index`'s samples, oldest first.
    pub fn spans(&self, index: usize) -> Vec<Option<ClaimSpan>> {
        let shards = self.shards.lock().expect("claim trends");
        shards
            .get(index)
            .map(|s| s.spans.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Shard `index`'s claims over its last `n` samples.
    pub fn recent(&self, index: usize, n: usize) -> ClaimSpan {
        let spans = self.spans(index);
        let mut sum = ClaimSpan::default();
        for span in spans.iter().rev().take(n).flatten() {
            sum.add(span);
        }
        sum
    }
}

/// The claims since `last` of the workers seen then too; `last` becomes
/// this read.
fn fold(last: &mut HashMap<String, ClaimSpan>, workers: &[WorkerRow]) -> ClaimSpan {
    let mut span = ClaimSpan::default();
    let mut now = HashMap::with_capacity(workers.len());
    for w in workers {
        let c = ClaimSpan {
            attempts: w.counters.attempts(),
            busy: w.counters.busy,
            claim_us: w.counters.claim_us,
        };
        if let Some(before) = last.get(&w.worker_id) {
            span.attempts += c.attempts.saturating_sub(before.attempts);
            span.busy += c.busy.saturating_sub(before.busy);
            span.claim_us += c.claim_us.saturating_sub(before.claim_us);
        }
        now.insert(w.worker_id.clone(), c);
    }
    *last = now;
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: &str, claims: u64, busy: u64, claim_us: u64) -> WorkerRow {
        let mut row = WorkerRow {
            worker_id: id.into(),
            host: "h".into(),
            pid: 1,
            queues: vec![],
            started_at: String::new(),
            heartbeat_age_ms: 0,
            counters: Default::default(),
        };
        row.counters.claims = claims;
        row.counters.busy = busy;
        row.counters.claim_us = claim_us;
        row
    }

    #[test]
    fn a_span_is_the_difference_of_the_workers_seen_twice() {
        let trends = ClaimTrends::new(3);
        trends.push(vec![Some(vec![worker("a", 10, 5, 1_000)]), None]);
        // b is new: it counts from the next sample; a ran 10 more claims,
        // 5 of them misses, in 3 ms.
        trends.push(vec![
            Some(vec![worker("a", 15, 10, 4_000), worker("b", 50, 0, 9_000)]),
            Some(vec![]),
        ]);
        trends.push(vec![Some(vec![worker("b", 60, 10, 19_000)]), Some(vec![])]);
        let spans = trends.spans(0);
        assert_eq!(spans[0], Some(ClaimSpan::default()));
        assert_eq!(
            spans[1],
            Some(ClaimSpan {
                attempts: 10,
                busy: 5,
                claim_us: 3_000
            })
        );
        let last = spans[2].unwrap();
        assert_eq!(last.miss_rate(), Some(0.5));
        assert_eq!(last.mean(), Some(Duration::from_micros(500)));
        assert_eq!(trends.recent(0, 2).attempts, 30);
        assert_eq!(
            trends.spans(1),
            vec![None, Some(ClaimSpan::default()), Some(ClaimSpan::default())]
        );
        trends.push(vec![None, None]);
        assert_eq!(trends.spans(0).len(), 3, "only the window is kept");
    }
}

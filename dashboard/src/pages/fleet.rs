//! The pieces of the fleet's tables that several pages draw: the count
//! columns, a queue summed over the shards, a queue's row on one shard,
//! the live workers' rows.

use super::{age, q};
use crate::chart;
use maud::{html, Markup};
use shardq::client::{ListState, QueueOverview, ShardOverview, WorkerRow};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The count columns, in lifecycle order.
pub(crate) const COLUMNS: [ListState; 8] = [
    ListState::Ready,
    ListState::Scheduled,
    ListState::Running,
    ListState::Retrying,
    ListState::Waiting,
    ListState::Parked,
    ListState::Dead,
    ListState::Cancelled,
];

/// One queue summed over the shards that answered.
pub(crate) struct QueueAcross {
    pub queue: String,
    /// Jobs by list state, summed.
    pub counts: BTreeMap<String, i64>,
    /// The states some shard counted only up to the cap: there are more.
    pub at_least: BTreeSet<String>,
    /// The longest any ready job of the queue has been due, and its shard.
    pub oldest_ready: Option<(Duration, String)>,
    /// Finished per time bucket, summed bucket by bucket.
    pub completions: Vec<i64>,
    /// The shards where the queue is paused.
    pub paused_on: Vec<String>,
    /// How many shards hold jobs of the queue.
    pub shards: usize,
}

impl QueueAcross {
    pub fn count(&self, state: &str) -> i64 {
        self.counts.get(state).copied().unwrap_or(0)
    }
}

/// Per queue, by name, over the shards that answered.
pub(crate) fn across(shards: &[ShardOverview]) -> Vec<QueueAcross> {
    let mut by_name: BTreeMap<&str, QueueAcross> = BTreeMap::new();
    for s in shards.iter().filter(|s| s.error.is_none()) {
        for queue in &s.queues {
            let row = by_name
                .entry(queue.queue.as_str())
                .or_insert_with(|| QueueAcross {
                    queue: queue.queue.clone(),
                    counts: BTreeMap::new(),
                    at_least: BTreeSet::new(),
                    oldest_ready: None,
                    completions: Vec::new(),
                    paused_on: Vec::new(),
                    shards: 0,
                });
            row.shards += 1;
            for (state, n) in &queue.counts {
                *row.counts.entry(state.clone()).or_default() += n;
            }
            row.at_least.extend(queue.at_least.iter().cloned());
            if let Some(d) = queue.oldest_ready {
                if row.oldest_ready.as_ref().is_none_or(|(o, _)| d > *o) {
                    row.oldest_ready = Some((d, s.shard.clone()));
                }
            }
            if row.completions.len() < queue.completions.len() {
                row.completions.resize(queue.completions.len(), 0);
            }
            for (sum, n) in row.completions.iter_mut().zip(&queue.completions) {
                *sum += n;
            }
            if queue.paused {
                row.paused_on.push(s.shard.clone());
            }
        }
    }
    by_name.into_values().collect()
}

/// A count as shown: `N+` when it stopped at the cap (there are more).
pub(crate) fn amount(n: i64, at_least: bool) -> Markup {
    html! {
        @if at_least { span title="counted up to the cap per queue and shard: there are more" { (n) "+" } }
        @else { (n) }
    }
}

/// Queue `queue`'s row on shard `s` (the queue's page): its counts, linked
/// to that shard's jobs; `behind` marks the shard with the oldest ready job.
pub(crate) fn shard_queue_row(
    s: &ShardOverview,
    queue: &QueueOverview,
    bucket_s: u64,
    window_s: u64,
    behind: bool,
) -> Markup {
    html! {
        tr data-shard=(s.shard) data-queue=(queue.queue) class=[behind.then_some("behind")] {
            td class="l" { (s.shard) @if behind { " " span class="down" { "behind" } } }
            @for c in COLUMNS {
                td class="count" data-shard=(s.shard) data-queue=(queue.queue) data-state=(c.as_str()) {
                    @let n = queue.count(c);
                    @if !s.counted(c) {
                        span class="muted" title="not counted: see the note above" { "?" }
                    } @else if n > 0 {
                        a href={"/jobs?state=" (c.as_str()) "&queue=" (q(&queue.queue)) "&shard=" (q(&s.shard))} { (amount(n, queue.at_least.contains(c.as_str()))) }
                    } @else { span class="muted" { "0" } }
                }
            }
            td { @match queue.oldest_ready { Some(d) => (age(d)), None => span class="muted" { "–" } } }
            td { (format!("{:.1}", queue.completions.iter().sum::<i64>() as f64 / window_s.max(1) as f64)) }
            td class="l" { (chart::completions(&queue.completions, bucket_s)) }
        }
    }
}

/// The live workers' rows (each shard's heartbeat of each worker).
pub(crate) fn worker_rows(rows: &[(&ShardOverview, &WorkerRow)]) -> Markup {
    html! {
        @if rows.is_empty() { p class="muted" { "No worker has sent a heartbeat in the last 30 s." } }
        @else {
            table id="workers" {
                tr { th class="l" { "Shard" } th class="l" { "Worker" } th class="l" { "Host" } th { "PID" }
                     th class="l" { "Queues" } th class="l" { "Started" } th { "Heartbeat" }
                     th { "Claims" } th { "Claimed" } th { "Lock misses" } th { "Empty" } th { "Completed" } th { "Miss rate" } }
                @for (s, w) in rows {
                    @let c = &w.counters;
                    @let attempts = c.claims + c.busy + c.empty + c.errors;
                    tr data-shard=(s.shard) data-worker=(w.worker_id) {
                        td class="l" { (s.shard) } td class="l" { (w.worker_id) } td class="l" { (w.host) }
                        td { (w.pid) } td class="l" { (w.queues.join(", ")) } td class="l muted" { (w.started_at) }
                        td { (format!("{:.1}s ago", w.heartbeat_age_ms as f64 / 1000.0)) }
                        td { (c.claims) } td { (c.claimed) } td { (c.busy) } td { (c.empty) } td class="completed" { (c.completed) }
                        td { @if attempts > 0 { (format!("{:.1}%", c.busy as f64 * 100.0 / attempts as f64)) } @else { "–" } }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue's row on a bounded shard: the states its read left out are
    /// `?`, a count that stopped at the cap is `N+`, the rest plain.
    #[test]
    fn a_row_marks_uncounted_states_and_counts_at_the_cap() {
        let queue = QueueOverview {
            queue: "q".into(),
            counts: [
                ("ready", 7),
                ("scheduled", 0),
                ("dead", 5),
                ("cancelled", 2),
            ]
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
            at_least: ["dead".to_string()].into(),
            ..QueueOverview::default()
        };
        let shard = ShardOverview {
            shard: "s0".into(),
            target: String::new(),
            error: None,
            bounded: true,
            queues: vec![queue.clone()],
            workers: Vec::new(),
        };
        let row = shard_queue_row(&shard, &queue, 10, 300, false).into_string();
        let cell = |state: &str| {
            let start = row
                .find(&format!("data-state=\"{state}\">"))
                .unwrap_or_else(|| panic!("{state}: {row}"));
            row[start..][..row[start..].find("</td>").unwrap()].to_string()
        };
        assert!(cell("scheduled").contains(">?</span>"), "{row}");
        assert!(cell("waiting").contains(">?</span>"), "{row}");
        assert!(cell("ready").contains(">7</a>"), "{row}");
        assert!(cell("dead").contains(">5+</span>"), "{row}");
        assert!(cell("cancelled").contains(">2</a>"), "{row}");
        let unbounded = ShardOverview {
            bounded: false,
            ..shard
        };
        let row = shard_queue_row(&unbounded, &queue, 10, 300, false).into_string();
        assert!(
            row.contains("data-state=\"scheduled\"><span class=\"muted\">0</span>"),
            "{row}"
        );
    }
}

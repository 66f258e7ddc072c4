//! `/shards`: one row per shard, the sick ones on top: whether it answered,
//! its connections, its lock-miss rate, its jobs by state over all queues,
//! its longest-waiting ready job, its live workers.

use super::fleet::COLUMNS;
use super::{age, layout};
use crate::state::Shared;
use axum::extract::State;
use axum::response::Html;
use maud::html;
use shardq::client::{Connections, OverviewOptions, ShardOverview};
use std::cmp::Reverse;
use std::time::Duration;

/// One shard's row.
struct ShardRow<'a> {
    shard: &'a ShardOverview,
    connections: Option<Connections>,
    oldest_ready: Option<Duration>,
}

impl ShardRow<'_> {
    /// Sick first: no answer, then the longest-waiting ready job, then the
    /// highest lock-miss rate.
    fn sickness(&self) -> (bool, Reverse<Duration>, Reverse<u64>) {
        let miss = self.shard.lock_miss_rate().unwrap_or(0.0);
        (
            self.shard.error.is_none(),
            Reverse(self.oldest_ready.unwrap_or_default()),
            Reverse((miss * 1e6) as u64),
        )
    }

    fn count(&self, state: &str) -> i64 {
        self.shard
            .queues
            .iter()
            .map(|q| q.counts.get(state).copied().unwrap_or(0))
            .sum()
    }
}

pub(crate) async fn page(State(state): State<Shared>) -> Html<String> {
    let options = OverviewOptions {
        deadline: state.options.shard_deadline,
        ..OverviewOptions::default()
    };
    // The connections under the same deadline, at once with the overview.
    let (shards, connections) = tokio::join!(
        state.client.overview(&options),
        state.client.connections(options.deadline)
    );
    let mut rows: Vec<ShardRow> = shards
        .iter()
        .zip(connections)
        .map(|(shard, connections)| ShardRow {
            shard,
            connections,
            oldest_ready: shard.queues.iter().filter_map(|q| q.oldest_ready).max(),
        })
        .collect();
    rows.sort_by_key(|r| r.sickness());
    let body = html! {
        (maud::PreEscaped("<meta http-equiv=\"refresh\" content=\"5\">"))
        p class="muted" { "Sick shards first: no answer, then the longest-waiting ready job, then the highest lock-miss rate." }
        table id="shard-rows" {
            tr {
                th class="l" { "Shard" } th class="l" { "Server" } th class="l" { "State" }
                th { "Connections" } th { "Lock-miss rate" } th { "Live workers" }
                @for c in COLUMNS { th { (c.as_str()) } }
                th { "Oldest ready" }
            }
            @for r in &rows {
                tr data-shard=(r.shard.shard) {
                    td class="l" { (r.shard.shard) }
                    td class="l muted" { (r.shard.target) }
                    @match &r.shard.error {
                        Some(e) => td class="l down" data-state="unreachable" title=(e) { "no answer" },
                        None => td class="l up" data-state="up" { "up" },
                    }
                    td { @match r.connections {
                        Some(c) => { (c.total) " of " (c.max) }
                        None => span class="muted" { "?" },
                    } }
                    td { @match r.shard.lock_miss_rate() {
                        Some(m) => (format!("{:.1}%", m * 100.0)),
                        None => span class="muted" { "–" },
                    } }
                    td { (r.shard.workers.len()) }
                    @for c in COLUMNS {
                        td class="count" data-shard=(r.shard.shard) data-state=(c.as_str()) {
                            @if r.shard.error.is_some() { span class="muted" { "?" } }
                            @else { (r.count(c.as_str())) }
                        }
                    }
                    td { @match r.oldest_ready { Some(d) => (age(d)), None => span class="muted" { "–" } } }
                }
            }
        }
    };
    layout("Shards", state.options.read_only, body)
}

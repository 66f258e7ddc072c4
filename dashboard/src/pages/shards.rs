//! `/shards`: one row per shard, the sick ones on top: whether it answered,
//! its connections, its claim time and lock-miss rate over the last minute
//! and as a chart of the last hour, its jobs by state over all queues, its
//! longest-waiting ready job, its live workers, and the wakes its finished
//! children owe parents on other shards.

use super::fleet::{amount, COLUMNS};
use super::{age, layout};
use crate::chart;
use crate::claim_trends::ClaimSpan;
use crate::state::Shared;
use axum::extract::State;
use axum::response::Html;
use maud::html;
use shardq::client::{Connections, OverviewOptions, ShardOverview};
use shardq::store::children_elsewhere::OwedToShard;
use std::cmp::Reverse;
use std::time::Duration;

/// What "recent" claims cover.
const RECENT: Duration = Duration::from_secs(60);

/// Why a bounded shard's waiting and scheduled counts are not shown.
const BOUNDED: &str = "only ready and running jobs counted: counting the others ran past \
    half the deadline (a long transaction holding the xmin horizon, or millions of such jobs)";

/// One shard's row.
struct ShardRow<'a> {
    shard: &'a ShardOverview,
    connections: Option<Connections>,
    /// Wakes owed to parents on other shards, by destination (`None`: no
    /// answer).
    owed: Option<Vec<OwedToShard>>,
    oldest_ready: Option<Duration>,
    /// Its claims over the last minute; its samples over the last hour.
    recent: ClaimSpan,
    spans: Vec<Option<ClaimSpan>>,
}

impl ShardRow<'_> {
    /// Sick first: no answer, then bounded counts, then the
    /// longest-waiting ready job, then the slowest claims, then the highest
    /// lock-miss rate (of the last minute).
    fn sickness(
        &self,
    ) -> (
        bool,
        bool,
        Reverse<Duration>,
        Reverse<Duration>,
        Reverse<u64>,
    ) {
        let miss = self.recent.miss_rate().unwrap_or(0.0);
        (
            self.shard.error.is_none(),
            !self.shard.bounded,
            Reverse(self.oldest_ready.unwrap_or_default()),
            Reverse(self.recent.mean().unwrap_or_default()),
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

    /// Whether some queue's count of `state` stopped at the cap.
    fn at_least(&self, state: &str) -> bool {
        self.shard.queues.iter().any(|q| q.at_least.contains(state))
    }
}

pub(crate) async fn page(State(state): State<Shared>) -> Html<String> {
    let options = OverviewOptions {
        deadline: state.options.shard_deadline,
        ..OverviewOptions::default()
    };
    // The connections and the wakes owed under the same deadline, at once
    // with the overview.
    let (shards, connections, owed) = tokio::join!(
        state.client.overview(&options),
        state.client.connections(options.deadline),
        state.client.wakes_owed(options.deadline)
    );
    let names: Vec<String> = shards.iter().map(|s| s.shard.clone()).collect();
    let claims = &state.trends.claims;
    let recent_samples =
        (RECENT.as_secs_f64() / state.trends.interval.as_secs_f64().max(1e-3)).ceil() as usize;
    let mut rows: Vec<ShardRow> = shards
        .iter()
        .zip(connections)
        .zip(owed)
        .enumerate()
        .map(|(index, ((shard, connections), owed))| ShardRow {
            shard,
            connections,
            owed,
            oldest_ready: shard.queues.iter().filter_map(|q| q.oldest_ready).max(),
            recent: claims.recent(index, recent_samples),
            spans: claims.spans(index),
        })
        .collect();
    rows.sort_by_key(|r| r.sickness());
    let body = html! {
        (maud::PreEscaped("<meta http-equiv=\"refresh\" content=\"5\">"))
        p class="muted" {
            "Sick shards first: no answer, then bounded counts, then the longest-waiting ready job, then the slowest claims, then the highest lock-miss rate. "
            "Claims as the live workers' heartbeats report them, sampled every " (state.trends.interval.as_secs()) " s."
        }
        (super::overview::bounded_note(&shards))
        table id="shard-rows" {
            tr {
                th class="l" { "Shard" } th class="l" { "Server" } th class="l" { "State" }
                th { "Connections" } th { "Claim time" br; "(1 min)" } th { "Lock misses" br; "(1 min)" }
                th class="l" { "Claims, last hour" } th { "Live workers" }
                th { "Wakes owed" br; "elsewhere" }
                @for c in COLUMNS { th { (c.as_str()) } }
                th { "Oldest ready" }
            }
            @for r in &rows {
                tr data-shard=(r.shard.shard) {
                    td class="l" { (r.shard.shard) }
                    td class="l muted" { (r.shard.target) }
                    @match &r.shard.error {
                        Some(e) => td class="l down" data-state="unreachable" title=(e) { "no answer" },
                        None if r.shard.bounded => td class="l down" data-state="bounded" title=(BOUNDED) { "up, bounded" },
                        None => td class="l up" data-state="up" { "up" },
                    }
                    td { @match r.connections {
                        Some(c) => { (c.total) " of " (c.max) }
                        None => span class="muted" { "?" },
                    } }
                    td class="claim-time" data-us=[r.recent.mean().map(|d| d.as_micros())] {
                        @match r.recent.mean() {
                            Some(d) => (format!("{:.2} ms", d.as_secs_f64() * 1e3)),
                            None => span class="muted" { "–" },
                        }
                    }
                    td class="miss-rate" { @match r.recent.miss_rate() {
                        Some(m) => (format!("{:.1}%", m * 100.0)),
                        None => span class="muted" { "–" },
                    } }
                    td class="l" { (chart::claims(&r.spans)) }
                    td { (r.shard.workers.len()) }
                    (owed_cell(r.owed.as_deref(), &names))
                    @for c in COLUMNS {
                        td class="count" data-shard=(r.shard.shard) data-state=(c.as_str()) {
                            @if !r.shard.counted(c) { span class="muted" title=[r.shard.error.as_deref().or(Some(BOUNDED))] { "?" } }
                            @else { (amount(r.count(c.as_str()), r.at_least(c.as_str()))) }
                        }
                    }
                    td { @match r.oldest_ready { Some(d) => (age(d)), None => span class="muted" { "–" } } }
                }
            }
        }
    };
    layout("Shards", state.options.read_only, body)
}

/// The wakes a shard's children owe parents on other shards: how many,
/// each destination and the oldest's age in the title.
fn owed_cell(owed: Option<&[OwedToShard]>, names: &[String]) -> maud::Markup {
    let Some(owed) = owed else {
        return html! { td class="wakes-owed" { span class="muted" { "?" } } };
    };
    let total: i64 = owed.iter().map(|o| o.pending).sum();
    let title = owed
        .iter()
        .map(|o| {
            let to = names.get(o.to).map_or("another shard", String::as_str);
            format!(
                "{} to {to}, oldest {}",
                o.pending,
                age(Duration::from_secs_f64(o.oldest_s.max(0.0)))
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    html! {
        td class="wakes-owed" data-owed=(total) title=(title) {
            @if total == 0 { span class="muted" { "–" } } @else { (total) }
        }
    }
}

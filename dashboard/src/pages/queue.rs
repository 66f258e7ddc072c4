//! `/queues/{queue}`: a queue across the fleet: its row on each shard, the
//! shard furthest behind, its trend, its recent failures grouped by error,
//! and the workers that serve it.

use super::fleet::{across, shard_queue_row, worker_rows, COLUMNS};
use super::{age, layout, q};
use crate::chart;
use crate::state::Shared;
use axum::extract::{Path, State};
use axum::response::Html;
use maud::{html, Markup};
use shardq::client::{FailureOptions, Failures, OverviewOptions};

pub(crate) async fn page(State(state): State<Shared>, Path(queue): Path<String>) -> Html<String> {
    let options = OverviewOptions {
        deadline: state.options.shard_deadline,
        ..OverviewOptions::default()
    };
    let failure_options = FailureOptions {
        deadline: state.options.shard_deadline,
        ..FailureOptions::default()
    };
    let (shards, failures) = tokio::join!(
        state.client.overview(&options),
        state.client.failures_by_error(&queue, &failure_options)
    );
    let bucket_s = options.bucket.as_secs();
    let window_s = options.window.as_secs();
    let total = across(&shards).into_iter().find(|r| r.queue == queue);
    let unanswered: Vec<&str> = shards
        .iter()
        .filter(|s| s.error.is_some())
        .map(|s| s.shard.as_str())
        .collect();
    let rows: Vec<_> = shards
        .iter()
        .filter_map(|s| s.queues.iter().find(|x| x.queue == queue).map(|x| (s, x)))
        .collect();
    let behind = total
        .as_ref()
        .and_then(|t| t.oldest_ready.as_ref())
        .map(|(_, shard)| shard.clone());
    let serving: Vec<_> = shards
        .iter()
        .flat_map(|s| s.workers.iter().map(move |w| (s, w)))
        .filter(|(_, w)| w.queues.contains(&queue))
        .collect();
    let body = html! {
        (maud::PreEscaped("<meta http-equiv=\"refresh\" content=\"5\">"))
        @if !unanswered.is_empty() {
            p class="down" id="unanswered" { "No answer from " (unanswered.join(", ")) ": their jobs are not counted here." }
        }
        (super::overview::bounded_note(&shards))
        @match &total {
            None => p class="muted" { "No jobs of this queue on any shard that answered." },
            Some(t) => p id="summary" {
                "On " (t.shards) " shards. "
                @if let Some((d, shard)) = &t.oldest_ready {
                    "Oldest ready job: " (age(*d)) " on " strong id="behind" { (shard) } ". "
                }
                "Done per second (" (window_s / 60) " min): "
                (format!("{:.1}", t.completions.iter().sum::<i64>() as f64 / window_s.max(1) as f64))
                " " (chart::completions(&t.completions, bucket_s))
            },
        }
        p id="trend" { "Last hour: " (chart::trend(&state.trends.samples(), Some(&queue))) }
        h2 { "By shard" }
        table id="queue-shards" {
            tr {
                th class="l" { "Shard" }
                @for c in COLUMNS { th { (c.as_str()) } }
                th { "Oldest ready" }
                th { "Done/s (" (window_s / 60) " min)" }
                th class="l" { "Completions per " (bucket_s) " s" }
            }
            @for (s, x) in &rows {
                (shard_queue_row(s, x, bucket_s, window_s, behind.as_deref() == Some(s.shard.as_str())))
            }
        }
        p { a href={"/jobs?state=dead&queue=" (q(&queue))} { "Dead jobs of " (queue) } " · "
            a href={"/jobs?state=retrying&queue=" (q(&queue))} { "retrying" } " · "
            a href={"/limits/" (q(&queue))} { "limits" } }
        h2 { "Failures by error, last " (failure_options.within.as_secs() / 3600) " h" }
        (failure_table(&failures, failure_options.per_shard))
        h2 { "Workers serving it" }
        (worker_rows(&serving))
    };
    layout(&format!("Queue {queue}"), state.options.read_only, body)
}

/// The queue's dead and failed jobs grouped by error, most first: how many,
/// the newest one's error and job.
fn failure_table(failures: &Failures, per_shard: i64) -> Markup {
    html! {
        @if !failures.unanswered.is_empty() {
            p class="down" { "Failures of " (failures.unanswered.join(", ")) " unknown (no answer)." }
        }
        @if !failures.truncated.is_empty() {
            p class="muted" { "Only the newest " (per_shard) " failures of " (failures.truncated.join(", ")) " are counted." }
        }
        @if failures.groups.is_empty() {
            p class="muted" id="no-failures" { "No job of this queue ended dead or failed." }
        } @else {
            table id="failures" {
                tr { th { "Jobs" } th class="l" { "Error (the newest)" } th class="l" { "Newest job" } }
                @for g in &failures.groups {
                    tr data-error=(g.kind) {
                        td class="count" { (g.jobs) }
                        td class="l" title=(g.error) { (g.error.lines().next().unwrap_or_default()) }
                        td class="l" { a href={"/jobs/" (g.example)} { (g.example) } }
                    }
                }
            }
        }
    }
}

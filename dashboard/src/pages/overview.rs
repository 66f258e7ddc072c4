//! `/`: the queues first (one row each over every shard), then how many
//! shards answered and which did not, the live workers; refreshes itself
//! every 5 s.

use super::fleet::{across, amount, worker_rows, COLUMNS};
use super::{age, layout, q};
use crate::chart;
use crate::state::Shared;
use crate::trends::Trends;
use axum::extract::State;
use axum::response::Html;
use maud::{html, Markup, PreEscaped};
use shardq::client::{CheckReport, OverviewOptions, QueueLimit, ShardOverview};
use std::time::Duration;

pub(crate) async fn page(State(state): State<Shared>) -> Html<String> {
    let options = OverviewOptions {
        deadline: state.options.shard_deadline,
        ..OverviewOptions::default()
    };
    // Both under the same per-shard deadline, at once; the invariant
    // verdict comes from the background check (`verdict.rs`).
    let (shards, limits) = tokio::join!(
        state.client.overview(&options),
        state.client.queue_limits_within(Some(options.deadline))
    );
    let report = state.verdict.latest();
    let limits = limits.map_err(|e| e.to_string());
    let bucket_s = options.bucket.as_secs();
    let body = html! {
        (PreEscaped("<meta http-equiv=\"refresh\" content=\"5\">"))
        h2 { "Queues" }
        p id="trend" { "Every queue: " (chart::trend(&state.trends.samples(), None)) }
        (queue_table(&shards, &state.trends, bucket_s, options.window.as_secs()))
        (pause_table(&shards, state.options.read_only))
        (limit_table(&limits, state.options.read_only))
        h2 { "Shards" }
        (invariant_line(&report))
        (shard_table(&shards))
        h2 { "Live workers" }
        (worker_table(&shards))
    };
    layout("Overview", state.options.read_only, body)
}

/// "Invariants: all hold" or "N broken", which ones where, and the shards
/// whose answer is unknown (`shardq check` lists the jobs), as of the
/// latest background check ("checking" before the first).
fn invariant_line(report: &Option<(CheckReport, Duration)>) -> Markup {
    let Some((report, age_of)) = report else {
        return html! {
            p id="invariants" class="muted" { "Invariants: checking every shard…" }
        };
    };
    let broken = report.violations();
    let where_broken: Vec<String> = report
        .shards
        .iter()
        .flat_map(|s| {
            s.findings
                .iter()
                .filter(|f| f.broken > 0)
                .map(move |f| format!("{} on {}: {}", f.invariant, s.shard, f.broken))
        })
        .collect();
    let unknown: Vec<&str> = report
        .unanswered()
        .iter()
        .map(|s| s.shard.as_str())
        .collect();
    html! {
        p id="invariants" data-broken=(broken) data-unanswered=(unknown.len()) {
            "Invariants: "
            @if broken == 0 {
                span class="up" { "all hold" }
            } @else {
                span class="down" { (broken) " broken" }
                " (" (where_broken.join(", ")) "; run " code { "shardq check" } " for the jobs)"
            }
            @if !unknown.is_empty() {
                " · " span class="down" { "unknown on " (unknown.join(", ")) " (did not answer)" }
            }
            span class="muted" { " · checked " (age(*age_of)) " ago" }
        }
    }
}

/// How many shards answered, and a row for each one that did not (all of
/// them are on `/shards`): at fifty shards the queues come first.
fn shard_table(shards: &[ShardOverview]) -> Markup {
    let sick: Vec<&ShardOverview> = shards.iter().filter(|s| s.error.is_some()).collect();
    html! {
        p id="shards-up" data-up=(shards.len() - sick.len()) data-shards=(shards.len()) {
            (shards.len() - sick.len()) " of " (shards.len()) " shards answered"
            " (" a href="/shards" { "each shard" } ")."
        }
        @if !sick.is_empty() {
            table id="shards" {
                tr { th class="l" { "Shard" } th class="l" { "Server" } th class="l" { "State" } }
                @for s in sick {
                    tr data-shard=(s.shard) {
                        td class="l" { (s.shard) }
                        td class="l muted" { (s.target) }
                        td class="l down" data-state="unreachable" title=[s.error.as_deref()] {
                            "unreachable: " (s.error.as_deref().unwrap_or_default())
                        }
                    }
                }
            }
        }
    }
}

/// Which shards' waiting and scheduled jobs are left out of the counts
/// (their read was bounded); nothing when none.
pub(super) fn bounded_note(shards: &[ShardOverview]) -> Markup {
    let bounded: Vec<&str> = shards
        .iter()
        .filter(|s| s.bounded)
        .map(|s| s.shard.as_str())
        .collect();
    html! {
        @if !bounded.is_empty() {
            p class="down" id="bounded" {
                "Waiting, scheduled, retrying and parked counts leave out " (bounded.join(", "))
                ": counting them ran past half the deadline (a long transaction holding the \
                 xmin horizon, or millions of such jobs), so only ready and running jobs \
                 were counted there."
            }
        }
    }
}

/// One row per queue, summed over the shards that answered; its name
/// opens the queue's page (each shard's row, the shard behind, workers).
fn queue_table(shards: &[ShardOverview], trends: &Trends, bucket_s: u64, window_s: u64) -> Markup {
    let rows = across(shards);
    let unanswered: Vec<&str> = shards
        .iter()
        .filter(|s| s.error.is_some())
        .map(|s| s.shard.as_str())
        .collect();
    html! {
        @if !unanswered.is_empty() {
            p class="down" id="partial" { "Totals leave out " (unanswered.join(", ")) " (no answer)." }
        }
        (bounded_note(shards))
        @if rows.is_empty() { p class="muted" { "No jobs on any shard that answered." } }
        @else {
            table id="queues" {
                tr {
                    th class="l" { "Queue" }
                    @for c in COLUMNS { th { (c.as_str()) } }
                    th { "Oldest ready" } th class="l" { "Behind" }
                    th { "Done/s (" (window_s / 60) " min)" }
                    th { "Dead or failed/s (1 min)" }
                    th class="l" { "Completions per " (bucket_s) " s" }
                    th class="l" { "Claiming" }
                }
                @for r in &rows {
                    tr data-queue=(r.queue) {
                        td class="l" { a href={"/queues/" (q(&r.queue))} { (r.queue) } }
                        @for c in COLUMNS {
                            td class="count" data-queue=(r.queue) data-state=(c.as_str()) {
                                @let n = r.count(c.as_str());
                                @if n > 0 {
                                    a href={"/jobs?state=" (c.as_str()) "&queue=" (q(&r.queue))} { (amount(n, r.at_least.contains(c.as_str()))) }
                                } @else { span class="muted" { "0" } }
                            }
                        }
                        @match &r.oldest_ready {
                            Some((d, shard)) => { td { (age(*d)) } td class="l behind" { (shard) } },
                            None => { td { span class="muted" { "–" } } td class="l" {} },
                        }
                        td { (format!("{:.1}", r.completions.iter().sum::<i64>() as f64 / window_s.max(1) as f64)) }
                        @match trends.rates(&r.queue, Duration::from_secs(60)) {
                            Some((_, failed)) => td class=[(failed > 0.0).then_some("down")] data-failed-rate=(format!("{failed:.2}")) { (format!("{failed:.1}")) },
                            None => td { span class="muted" { "–" } },
                        }
                        td class="l" { (chart::completions(&r.completions, bucket_s)) }
                        td class="l paused" {
                            @if r.paused_on.is_empty() { "active" } @else { span class="down" { "paused on " (r.paused_on.join(", ")) } }
                        }
                    }
                }
            }
        }
    }
}

/// Each queue: paused on which shards, and the button that fits.
fn pause_table(shards: &[ShardOverview], read_only: bool) -> Markup {
    let mut names: Vec<&str> = shards
        .iter()
        .flat_map(|s| s.queues.iter().map(|q| q.queue.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    html! {
        @if !names.is_empty() {
            table id="pauses" {
                tr { th class="l" { "Queue" } th class="l" { "Claiming" } @if !read_only { th {} } }
                @for name in names {
                    @let paused: Vec<&str> = shards
                        .iter()
                        .filter(|s| s.queues.iter().any(|q| q.queue == name && q.paused))
                        .map(|s| s.shard.as_str())
                        .collect();
                    tr data-queue=(name) {
                        td class="l" { (name) }
                        td class="l paused" {
                            @if paused.is_empty() { "active" } @else { span class="down" { "paused on " (paused.join(", ")) } }
                        }
                        @if !read_only {
                            td {
                                @let action = if paused.is_empty() { "pause" } else { "resume" };
                                a id={(action) "-" (name)} href={"/queues/" (q(name)) "/" (action)} { button { (action) "…" } }
                                " "
                                a id={"limit-" (name)} href={"/limits/" (q(name))} { button { "limits…" } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The limited queues (`shardq limit`): concurrency and permits in use,
/// rate, each group's limits; or why they could not be read.
fn limit_table(limits: &Result<Vec<QueueLimit>, String>, read_only: bool) -> Markup {
    html! {
        @match limits {
            Err(why) => p class="down" { "Queue limits unknown: " (why) }
            Ok(limits) if limits.is_empty() => p { "No queue is limited (" code { "shardq limit set" } ")." }
            Ok(limits) => table id="limits" {
                tr {
                    th class="l" { "Limited queue" } th { "Concurrency" } th { "In use" }
                    th { "Processes" } th { "Rate" } th { "Each group" } @if !read_only { th {} }
                }
                @for l in limits {
                    tr data-queue=(l.queue) {
                        td class="l" { (l.queue) }
                        td { @if let Some(n) = l.limits.concurrency { (n) } @else { "–" } }
                        td { @if let (Some(_), Some(n)) = (l.limits.concurrency, l.in_use) { (n) } @else { "–" } }
                        td { @if let Some(n) = l.holders { (n) } @else { "?" } }
                        td { @if let Some(r) = l.limits.rate { (r.count) " per " (format!("{:?}", r.per)) } @else { "–" } }
                        td {
                            @if let Some(n) = l.limits.group_concurrency { (n) " at once" }
                            @if l.limits.group_concurrency.is_some() && l.limits.group_rate.is_some() { ", " }
                            @if let Some(r) = l.limits.group_rate { (r.count) " per " (format!("{:?}", r.per)) }
                            @if l.limits.group_concurrency.is_none() && l.limits.group_rate.is_none() { "–" }
                        }
                        @if !read_only {
                            td { a id={"limits-" (l.queue)} href={"/limits/" (q(&l.queue))} { button { "edit…" } } }
                        }
                    }
                }
            }
        }
    }
}

fn worker_table(shards: &[ShardOverview]) -> Markup {
    let rows: Vec<_> = shards
        .iter()
        .flat_map(|s| s.workers.iter().map(move |w| (s, w)))
        .collect();
    worker_rows(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(name: &str, bounded: bool) -> ShardOverview {
        ShardOverview {
            shard: name.into(),
            target: String::new(),
            error: None,
            bounded,
            queues: Vec::new(),
            workers: Vec::new(),
        }
    }

    /// The note names each bounded shard, and only those; none, no note.
    #[test]
    fn the_bounded_note_names_the_shards_whose_waits_were_not_counted() {
        let note = bounded_note(&[shard("s0", false), shard("s1", true)]).into_string();
        assert!(note.contains("id=\"bounded\""), "{note}");
        assert!(note.contains("leave out s1:"), "{note}");
        assert!(!note.contains("s0"), "{note}");
        assert_eq!(bounded_note(&[shard("s0", false)]).into_string(), "");
    }
}

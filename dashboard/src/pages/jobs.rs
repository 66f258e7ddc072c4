//! `/jobs?state=…`: one state's jobs over the shards, filtered, paged by
//! keyset (the "Next" link carries each shard's last position).

use super::{layout, q, PageError};
use crate::cursor;
use crate::state::Shared;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Html;
use maud::html;
use shardq::client::{JobFilter, JobQuery, ListState, PageCursor};

/// The query string of a list page.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct ListParams {
    state: Option<String>,
    queue: Option<String>,
    shard: Option<String>,
    handler: Option<String>,
    key: Option<String>,
    after: Option<String>,
}

fn given(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
}

pub(crate) async fn page(
    State(state): State<Shared>,
    Query(params): Query<ListParams>,
) -> Result<Html<String>, PageError> {
    let name = given(&params.state).unwrap_or_else(|| "ready".into());
    let list = ListState::parse(&name).ok_or_else(|| {
        let known: Vec<_> = ListState::ALL.iter().map(|s| s.as_str()).collect();
        PageError(
            StatusCode::BAD_REQUEST,
            format!("unknown state `{name}`; use one of: {}", known.join(", ")),
        )
    })?;
    let shards = state.client.shards();
    let shard_name = given(&params.shard);
    let shard = match &shard_name {
        None => None,
        Some(n) => Some(
            shards
                .all()
                .iter()
                .find(|s| &s.name == n)
                .map(|s| s.index)
                .ok_or_else(|| {
                    PageError(
                        StatusCode::BAD_REQUEST,
                        format!("no shard named `{n}` in the configuration"),
                    )
                })?,
        ),
    };
    let cursor = match given(&params.after) {
        None => PageCursor::default(),
        Some(text) => cursor::decode(&text).ok_or_else(|| {
            PageError(
                StatusCode::BAD_REQUEST,
                "the page cursor `after` is not one this dashboard made; start from the first page"
                    .into(),
            )
        })?,
    };
    let filter = JobFilter {
        queue: given(&params.queue),
        handler: given(&params.handler),
        key: given(&params.key),
    };
    let query = JobQuery {
        state: list,
        filter: filter.clone(),
        shard,
        cursor,
        limit: state.options.page_size,
        deadline: state.options.shard_deadline,
    };
    let page = state.client.list_jobs(&query).await;
    let keep = |name: &str, value: &Option<String>| {
        value
            .as_ref()
            .map(|v| format!("&{name}={}", q(v)))
            .unwrap_or_default()
    };
    let base = format!(
        "/jobs?state={}{}{}{}{}",
        list.as_str(),
        keep("queue", &filter.queue),
        keep("shard", &shard_name),
        keep("handler", &filter.handler),
        keep("key", &filter.key)
    );
    let order = if list.newest_first() {
        "newest first"
    } else {
        "in the order workers take them"
    };
    let body = html! {
        form method="get" action="/jobs" {
            select name="state" {
                @for s in ListState::ALL {
                    option value=(s.as_str()) selected[s == list] { (s.as_str()) }
                }
            }
            " queue " input name="queue" value=(filter.queue.clone().unwrap_or_default()) size="12";
            " shard " input name="shard" value=(shard_name.clone().unwrap_or_default()) size="8";
            " handler " input name="handler" value=(filter.handler.clone().unwrap_or_default()) size="12";
            " key " input name="key" value=(filter.key.clone().unwrap_or_default()) size="12";
            " " button type="submit" { "Filter" }
        }
        @for (shard, error) in &page.unreachable {
            p class="error" { "Shard " (shard) " did not answer: " (error) }
        }
        p class="muted" { (page.jobs.len()) " jobs on this page, " (order) "." }
        table id="jobs" {
            tr { th class="l" { "Job" } th class="l" { "Shard" } th class="l" { "Queue" } th class="l" { "Handler" }
                 th class="l" { "Key" } th class="l" { "State" } th { "Attempts" } th class="l" { "Due / finished" } th class="l" { "Error" } }
            @for (index, job) in &page.jobs {
                tr class="job" data-id=(job.id) {
                    td class="l" { a href={"/jobs/" (job.id)} { (job.id) } }
                    td class="l" { (shards.get(*index).name) }
                    td class="l" { (job.queue) } td class="l" { (job.handler) }
                    td class="l" { (job.ordering_key.clone().unwrap_or_default()) }
                    td class="l" { (job.status) }
                    td { (job.attempts) "/" (job.max_attempts) }
                    td class="l muted" { (job.finished_at.clone().or(job.run_at.clone()).unwrap_or_default()) }
                    td class="l" { (job.error.clone().unwrap_or_default()) }
                }
            }
        }
        @if let Some(next) = &page.next {
            p { a id="next" href={(base) "&after=" (cursor::encode(next))} { "Next page →" } }
        }
        p { a href=(base) { "First page" } }
    };
    Ok(layout(
        &format!("Jobs: {}", list.as_str()),
        state.options.read_only,
        body,
    ))
}

//! `/jobs/{id}`: one job: payload, output, error, attempts, timing, steps,
//! and the actions that fit its state.

use super::{layout, PageError};
use crate::state::Shared;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Html;
use maud::{html, Markup};
use shardq::{JobId, JobStatus};

#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct JobParams {
    done: Option<String>,
}

pub(crate) fn parse_id(text: &str) -> Result<JobId, PageError> {
    text.parse().map_err(|_| {
        PageError(
            StatusCode::BAD_REQUEST,
            format!("`{text}` is not a job id; ids look like SHARDKEY-ID, e.g. 1234-56"),
        )
    })
}

fn json(v: &Option<serde_json::Value>) -> String {
    v.as_ref()
        .map(|v| serde_json::to_string_pretty(v).unwrap_or_default())
        .unwrap_or_else(|| "—".into())
}

/// The actions a job in `status` allows.
pub(crate) fn actions_for(status: JobStatus) -> &'static [&'static str] {
    match status {
        JobStatus::Dead | JobStatus::Failed | JobStatus::Cancelled => &["retry"],
        JobStatus::Waiting
        | JobStatus::Scheduled
        | JobStatus::Queued
        | JobStatus::Running
        | JobStatus::Held => &["cancel"],
        JobStatus::Succeeded => &[],
    }
}

pub(crate) async fn page(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<JobParams>,
) -> Result<Html<String>, PageError> {
    let id = parse_id(&id)?;
    let detail = state
        .client
        .job_detail(id)
        .await
        .map_err(|e| PageError(StatusCode::BAD_GATEWAY, shardq::error_chain(&e)))?
        .ok_or_else(|| PageError(StatusCode::NOT_FOUND, format!("no shard has job {id}")))?;
    let j = &detail.info;
    let row = |name: &str, value: Markup| html! { tr { th class="l" { (name) } td class="l" { (value) } } };
    let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".into());
    let body = html! {
        @if let Some(done) = &params.done { p class="notice" id="done" { (done) } }
        table id="job" {
            (row("Shard", html! { (detail.shard) }))
            (row("Queue", html! { (j.queue) }))
            (row("Handler", html! { (j.handler) }))
            (row("State", html! { span id="status" { (j.status) } @if j.cancel_requested { " (cancel requested)" } }))
            (row("Attempts", html! { (j.attempts) " of " (j.max_attempts) }))
            (row("Ordering key", html! { (text(&j.ordering_key)) }))
            (row("Priority", html! { (j.priority) }))
            (row("Deduplication id", html! { (text(&j.dedup_id)) }))
            (row("Worker", html! { (text(&j.owner)) }))
            (row("Created", html! { (text(&j.created_at)) }))
            (row("Due", html! { (text(&j.run_at)) }))
            @if let Some(waiting) = &j.waiting_for { (row("Waiting for", html! { span id="waiting-for" { (waiting) } })) }
            (row("Last started", html! { (text(&j.started_at)) }))
            (row("Finished", html! { (text(&j.finished_at)) }))
        }
        @if !state.options.read_only {
            @for action in actions_for(j.status) {
                a class="action" id={"action-" (action)} href={"/jobs/" (id) "/" (action)} { button { (action) "…" } } " "
            }
        }
        h2 { "Payload" } pre id="payload" { (json(&Some(j.payload.clone()))) }
        h2 { "Output" } pre id="output" { (json(&j.output)) }
        h2 { "Error" } pre id="error" { (text(&j.error)) }
        h2 { "Steps" }
        @if detail.steps.is_empty() { p class="muted" { "No recorded steps." } }
        @else {
            table id="steps" {
                tr { th class="l" { "Step" } th class="l" { "Recorded" } th class="l" { "Output" } th class="l" { "Error" } }
                @for s in &detail.steps {
                    tr { td class="l" { (s.name) } td class="l muted" { (s.created_at) }
                         td class="l" { pre { (json(&s.output)) } } td class="l" { (text(&s.error)) } }
                }
            }
        }
    };
    Ok(layout(&format!("Job {id}"), state.options.read_only, body))
}

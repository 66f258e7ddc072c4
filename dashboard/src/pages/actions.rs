//! Actions on one job: `GET /jobs/{id}/{action}` asks for confirmation,
//! `POST` (with the CSRF token) does it and goes back to the job.

use super::job::{actions_for, parse_id};
use super::{layout, PageError};
use crate::csrf;
use crate::state::Shared;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use maud::html;
use std::collections::HashMap;

fn known(action: &str) -> Result<(), PageError> {
    match action {
        "retry" | "cancel" => Ok(()),
        other => Err(PageError(
            StatusCode::NOT_FOUND,
            format!("no action `{other}`; a job can be retried or cancelled"),
        )),
    }
}

pub(crate) async fn confirm(
    State(state): State<Shared>,
    Path((id, action)): Path<(String, String)>,
) -> Result<Html<String>, PageError> {
    known(&action)?;
    if state.options.read_only {
        return Err(PageError(
            StatusCode::FORBIDDEN,
            "the dashboard is read-only".into(),
        ));
    }
    let id = parse_id(&id)?;
    let job = state
        .client
        .job(id)
        .await
        .map_err(|e| PageError(StatusCode::BAD_GATEWAY, shardq::error_chain(&e)))?
        .ok_or_else(|| PageError(StatusCode::NOT_FOUND, format!("no shard has job {id}")))?;
    let allowed = actions_for(job.status).contains(&action.as_str());
    let body = html! {
        p { "Job " a href={"/jobs/" (id)} { (id) } " (" (job.queue) ", " (job.handler) ") is " strong { (job.status) } "." }
        @if allowed {
            form method="post" action={"/jobs/" (id) "/" (action)} {
                input type="hidden" name=(csrf::FIELD) value=(state.csrf.value());
                button type="submit" id="confirm" { "Yes, " (action) " job " (id) }
                " " a href={"/jobs/" (id)} { "No, go back" }
            }
        } @else {
            p class="error" { "A " (job.status) " job cannot be " (if action == "retry" { "retried" } else { "cancelled" }) "." }
        }
    };
    Ok(layout(&format!("{action} job {id}?"), false, body))
}

pub(crate) async fn perform(
    State(state): State<Shared>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    known(&action)?;
    if let Some(why) = state
        .csrf
        .refusal(&headers, form.get(csrf::FIELD).map(String::as_str))
    {
        return Err(PageError(StatusCode::FORBIDDEN, format!("refused: {why}")));
    }
    let id = parse_id(&id)?;
    let failed =
        |e: shardq::ClientError| PageError(StatusCode::BAD_GATEWAY, shardq::error_chain(&e));
    let done = match action.as_str() {
        "retry" => match state.client.retry(id).await.map_err(failed)? {
            true => "Retried: the job is back in its queue with fresh attempts.".to_string(),
            false => "Not retried: the job is not dead, failed or cancelled.".to_string(),
        },
        _ => match state.client.cancel(id).await.map_err(failed)? {
            Some(status) if status == "running" => {
                "Cancellation asked: the running handler is told to stop.".to_string()
            }
            Some(_) => "Cancelled.".to_string(),
            None => "Not cancelled: the job had already finished.".to_string(),
        },
    };
    tracing::info!(job = %id, action, "dashboard action");
    Ok(Redirect::to(&format!("/jobs/{id}?done={}", super::q(&done))).into_response())
}

fn known_queue_action(action: &str) -> Result<(), PageError> {
    match action {
        "pause" | "resume" => Ok(()),
        other => Err(PageError(
            StatusCode::NOT_FOUND,
            format!("no action `{other}`; a queue can be paused or resumed"),
        )),
    }
}

pub(crate) async fn queue_confirm(
    State(state): State<Shared>,
    Path((queue, action)): Path<(String, String)>,
) -> Result<Html<String>, PageError> {
    known_queue_action(&action)?;
    if state.options.read_only {
        return Err(PageError(
            StatusCode::FORBIDDEN,
            "the dashboard is read-only".into(),
        ));
    }
    let what = if action == "pause" {
        "No worker claims its jobs until it is resumed; running jobs finish, enqueueing goes on."
    } else {
        "Workers claim its jobs again at once."
    };
    let body = html! {
        p { (action) " queue " strong { (queue) } " on every shard. " (what) }
        form method="post" action={"/queues/" (super::q(&queue)) "/" (action)} {
            input type="hidden" name=(csrf::FIELD) value=(state.csrf.value());
            button type="submit" id="confirm" { "Yes, " (action) " " (queue) }
            " " a href="/" { "No, go back" }
        }
    };
    Ok(layout(&format!("{action} queue {queue}?"), false, body))
}

pub(crate) async fn queue_perform(
    State(state): State<Shared>,
    Path((queue, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    known_queue_action(&action)?;
    if let Some(why) = state
        .csrf
        .refusal(&headers, form.get(csrf::FIELD).map(String::as_str))
    {
        return Err(PageError(StatusCode::FORBIDDEN, format!("refused: {why}")));
    }
    let done = if action == "pause" {
        state.client.pause_queue(&queue).await
    } else {
        state.client.resume_queue(&queue).await
    };
    // A shard that did not answer is named; the others made the change.
    done.map_err(|e| PageError(StatusCode::BAD_GATEWAY, shardq::error_chain(&e)))?;
    tracing::info!(queue, action, "dashboard action");
    Ok(Redirect::to("/").into_response())
}

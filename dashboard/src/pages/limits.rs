//! A queue's fleet-wide limits (`shardq limit`): `GET /limits/{queue}`
//! shows them in a form, `POST` (with the CSRF token) replaces them and
//! goes back to the overview. An empty field lifts that limit.

use super::{layout, PageError};
use crate::csrf;
use crate::state::Shared;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup};
use shardq::client::{QueueLimits, StartRate};
use std::collections::HashMap;
use std::time::Duration;

/// The periods the form offers, as (name, length).
const PERIODS: [(&str, Duration); 3] = [
    ("second", Duration::from_secs(1)),
    ("minute", Duration::from_secs(60)),
    ("hour", Duration::from_secs(3_600)),
];

fn writable(state: &Shared) -> Result<(), PageError> {
    if state.options.read_only {
        return Err(PageError(
            StatusCode::FORBIDDEN,
            "the dashboard is read-only".into(),
        ));
    }
    Ok(())
}

pub(crate) async fn form(
    State(state): State<Shared>,
    Path(queue): Path<String>,
) -> Result<Html<String>, PageError> {
    writable(&state)?;
    let all = state
        .client
        .queue_limits()
        .await
        .map_err(|e| PageError(StatusCode::BAD_GATEWAY, shardq::error_chain(&e)))?;
    let now = all
        .into_iter()
        .find(|l| l.queue == queue)
        .map(|l| l.limits)
        .unwrap_or_default();
    let odd_period =
        |r: Option<StartRate>| r.is_some_and(|r| !PERIODS.iter().any(|(_, d)| *d == r.per));
    let body = html! {
        p { "Limits of queue " strong { (queue) } " across every worker process and shard. An empty field lifts that limit; workers follow within a second." }
        @if odd_period(now.rate) || odd_period(now.group_rate) {
            p class="error" { "A rate's period is not one of these; saving sets the one chosen here." }
        }
        form method="post" action={"/limits/" (super::q(&queue))} {
            input type="hidden" name=(csrf::FIELD) value=(state.csrf.value());
            (concurrency_field("concurrency", "At most ", now.concurrency))
            (rate_field(("rate", "per"), "At most ", now.rate))
            (concurrency_field("group_concurrency", "Each group: at most ", now.group_concurrency))
            (rate_field(("group_rate", "group_per"), "Each group: at most ", now.group_rate))
            button type="submit" id="confirm" { "Set the limits of " (queue) }
            " " a href="/" { "No, go back" }
        }
    };
    Ok(layout(&format!("limits of {queue}"), false, body))
}

/// A concurrency's input, named `name`, holding `now`.
fn concurrency_field(name: &str, label: &str, now: Option<u32>) -> Markup {
    html! {
        p {
            label for=(name) { (label) }
            input type="number" min="1" id=(name) name=(name)
                value=(now.map(|n| n.to_string()).unwrap_or_default());
            " jobs running at once"
        }
    }
}

/// A rate's inputs: its count (`count`) and its period (`per`), holding `now`.
fn rate_field((count, per): (&str, &str), label: &str, now: Option<StartRate>) -> Markup {
    let period = now.map_or(Duration::from_secs(1), |r| r.per);
    html! {
        p {
            label for=(count) { (label) }
            input type="number" min="1" id=(count) name=(count)
                value=(now.map(|r| r.count.to_string()).unwrap_or_default());
            " jobs started per "
            select name=(per) id=(per) {
                @for (name, length) in PERIODS {
                    option value=(name) selected[length == period] { (name) }
                }
            }
        }
    }
}

pub(crate) async fn set(
    State(state): State<Shared>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    writable(&state)?;
    if let Some(why) = state
        .csrf
        .refusal(&headers, form.get(csrf::FIELD).map(String::as_str))
    {
        return Err(PageError(StatusCode::FORBIDDEN, format!("refused: {why}")));
    }
    let limits = parse(&form).map_err(|why| PageError(StatusCode::BAD_REQUEST, why))?;
    state
        .client
        .set_queue_limits(&queue, limits)
        .await
        .map_err(|e| PageError(StatusCode::BAD_GATEWAY, shardq::error_chain(&e)))?;
    tracing::info!(queue, ?limits, "dashboard limits");
    Ok(Redirect::to("/").into_response())
}

/// The form's limits: an empty or missing field is no limit.
fn parse(form: &HashMap<String, String>) -> Result<QueueLimits, String> {
    let number = |field: &str| -> Result<Option<u32>, String> {
        match form.get(field).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .map(Some)
                .ok_or_else(|| {
                    format!("{field} `{v}`: give a whole number of 1 or more, or nothing")
                }),
        }
    };
    let rate = |count_field: &str, per_field: &str| -> Result<Option<StartRate>, String> {
        let Some(count) = number(count_field)? else {
            return Ok(None);
        };
        let name = form.get(per_field).map_or("second", String::as_str);
        let (_, per) = PERIODS
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| format!("{per_field} `{name}`: give second, minute or hour"))?;
        Ok(Some(StartRate { count, per: *per }))
    };
    Ok(QueueLimits {
        concurrency: number("concurrency")?,
        rate: rate("rate", "per")?,
        group_concurrency: number("group_concurrency")?,
        group_rate: rate("group_rate", "group_per")?,
    })
}

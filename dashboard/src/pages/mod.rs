//! The pages: one module each, a shared layout and error page.

pub(crate) mod actions;
pub(crate) mod fleet;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod limits;
pub(crate) mod overview;
pub(crate) mod queue;
pub(crate) mod shards;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use std::time::Duration;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.2em;color:#1d2329}\
    table{border-collapse:collapse;margin:.6em 0 1.4em}\
    th,td{border-bottom:1px solid #dde2e6;padding:.25em .6em;text-align:right;vertical-align:middle}\
    th{background:#f0f3f5}td.l,th.l{text-align:left}td.claim-time,td.miss-rate{white-space:nowrap}\
    .down{color:#b00020;font-weight:bold}.up{color:#11703a}.muted{color:#6b7780}\
    nav a{margin-right:1em}pre{background:#f4f6f8;padding:.6em;overflow:auto;max-width:70em}\
    .notice{background:#eef6ee;border:1px solid #9c9;padding:.5em}\
    .error{background:#fdecee;border:1px solid #e99;padding:.5em}\
    button{padding:.3em 1em}form.inline{display:inline}";

/// A whole page: title, navigation, `body`.
pub(crate) fn layout(title: &str, read_only: bool, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { (title) " · shardq" }
                    style { (maud::PreEscaped(STYLE)) }
                }
                body {
                    nav {
                        strong { "shardq" } " "
                        a href="/" { "Overview" }
                        a href="/shards" { "Shards" }
                        a href="/jobs?state=ready" { "Ready" }
                        a href="/jobs?state=running" { "Running" }
                        a href="/jobs?state=retrying" { "Retrying" }
                        a href="/jobs?state=dead" { "Dead" }
                        a href="/jobs?state=succeeded" { "Succeeded" }
                        @if read_only { span class="muted" { "read-only" } }
                    }
                    h1 { (title) }
                    (body)
                }
            }
        }
        .into_string(),
    )
}

/// A page that failed: status and what to do.
pub(crate) struct PageError(pub StatusCode, pub String);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let body = layout(
            self.0.canonical_reason().unwrap_or("Error"),
            false,
            html! { p class="error" { (self.1) } },
        );
        (self.0, body).into_response()
    }
}

/// `d` as `1h 02m`, `3m 04s`, `5.2s`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// `text` as a URL query value.
pub(crate) fn q(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

//! The charts, inline SVG drawn on the server (no JavaScript): completion
//! bars per time bucket, the trend lines of the last hour, and a shard's
//! claims over the last hour.

use crate::claim_trends::ClaimSpan;
use crate::trends::Sample;
use maud::{html, Markup};

const WIDTH: f64 = 150.0;
const HEIGHT: f64 = 28.0;

/// Bars for `counts` (oldest first), each bucket `bucket_s` seconds wide,
/// scaled to the largest; each bar's title says its rate.
pub(crate) fn completions(counts: &[i64], bucket_s: u64) -> Markup {
    let max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = counts.len().max(1) as f64;
    let bar = WIDTH / n;
    html! {
        svg class="chart" width=(WIDTH) height=(HEIGHT) viewBox={"0 0 " (WIDTH) " " (HEIGHT)}
            role="img" aria-label="completions per second" {
            rect x="0" y="0" width=(WIDTH) height=(HEIGHT) fill="#f4f6f8" {}
            @for (i, &c) in counts.iter().enumerate() {
                @let h = if c > 0 { (c as f64 / max * (HEIGHT - 2.0)).max(1.0) } else { 0.0 };
                rect x=(format!("{:.1}", i as f64 * bar)) y=(format!("{:.1}", HEIGHT - h))
                    width=(format!("{:.1}", (bar - 0.5).max(0.5))) height=(format!("{:.1}", h))
                    fill="#3b7dd8" {
                    title { (format!("{:.1}", c as f64 / bucket_s.max(1) as f64)) " jobs/s" }
                }
            }
        }
    }
}

const TREND_WIDTH: f64 = 360.0;
const TREND_HEIGHT: f64 = 60.0;

/// The trend of `queue` (every queue when `None`) over `samples`, oldest
/// first: completions per second (blue) and failures per second (red) as
/// two lines scaled to the largest rate, with the totals it shows in
/// `data-done` and `data-failed`.
pub(crate) fn trend(samples: &[Sample], queue: Option<&str>) -> Markup {
    let rates: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| {
            let (done, failed) = s.of(queue);
            let secs = s.span.as_secs_f64().max(1e-3);
            (done as f64 / secs, failed as f64 / secs)
        })
        .collect();
    let (done, failed) = samples.iter().fold((0, 0), |(d, f), s| {
        let (ds, fs) = s.of(queue);
        (d + ds, f + fs)
    });
    let top = rates.iter().map(|(d, _)| *d).fold(1.0, f64::max);
    let step = TREND_WIDTH / rates.len().saturating_sub(1).max(1) as f64;
    let line = |pick: fn(&(f64, f64)) -> f64| -> String {
        rates
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let y = TREND_HEIGHT - 2.0 - pick(r) / top * (TREND_HEIGHT - 4.0);
                format!("{:.1},{:.1}", i as f64 * step, y)
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let minutes = samples
        .iter()
        .map(|s| s.span)
        .sum::<std::time::Duration>()
        .as_secs()
        / 60;
    html! {
        svg class="trend" width=(TREND_WIDTH) height=(TREND_HEIGHT)
            viewBox={"0 0 " (TREND_WIDTH) " " (TREND_HEIGHT)} role="img"
            aria-label="completions and failures per second"
            data-done=(done) data-failed=(failed) data-samples=(samples.len()) {
            rect x="0" y="0" width=(TREND_WIDTH) height=(TREND_HEIGHT) fill="#f4f6f8" {}
            polyline points=(line(|r| r.0)) fill="none" stroke="#3b7dd8" stroke-width="1.5" {}
            polyline points=(line(|r| r.1)) fill="none" stroke="#b00020" stroke-width="1.5" {}
            title { (format!("up to {top:.1} jobs/s")) }
        }
        " "
        span class="muted" {
            "last " (minutes) " min: " (done) " done, " span class=[(failed > 0).then_some("down")] { (failed) " dead or failed" }
            ", top " (format!("{top:.1}")) " jobs/s"
        }
    }
}

const CLAIMS_WIDTH: f64 = 200.0;

/// One shard's claims over `spans`, oldest first: the mean claim time
/// (blue, scaled to its largest) and the lock-miss rate (orange, 0–100 %).
/// A sample no heartbeat reached (workers beat every 5 s, the sampler may
/// ask more often) or without an answer repeats the one before.
pub(crate) fn claims(spans: &[Option<ClaimSpan>]) -> Markup {
    let carried = |value: fn(&ClaimSpan) -> Option<f64>| -> Vec<f64> {
        let mut last = 0.0;
        spans
            .iter()
            .map(|s| {
                last = s.as_ref().and_then(value).unwrap_or(last);
                last
            })
            .collect()
    };
    let times = carried(|s| s.mean().map(|d| d.as_secs_f64() * 1e3));
    let misses = carried(ClaimSpan::miss_rate);
    let top_ms = times.iter().copied().fold(0.0, f64::max);
    let step = CLAIMS_WIDTH / spans.len().saturating_sub(1).max(1) as f64;
    let line = |values: &[f64], top: f64| -> String {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let y = HEIGHT - 2.0 - v / top.max(1e-9) * (HEIGHT - 4.0);
                format!("{:.1},{:.1}", i as f64 * step, y)
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        svg class="chart" width=(CLAIMS_WIDTH) height=(HEIGHT)
            viewBox={"0 0 " (CLAIMS_WIDTH) " " (HEIGHT)} role="img"
            aria-label="claim time and lock-miss rate" data-samples=(spans.len()) {
            rect x="0" y="0" width=(CLAIMS_WIDTH) height=(HEIGHT) fill="#f4f6f8" {}
            polyline points=(line(&misses, 1.0)) fill="none" stroke="#d88a3b" stroke-width="1.2" {}
            polyline points=(line(&times, top_ms)) fill="none" stroke="#3b7dd8" stroke-width="1.5" {}
            title { (format!("claim time up to {top_ms:.2} ms (blue); lock-miss rate 0–100 % (orange)")) }
        }
    }
}

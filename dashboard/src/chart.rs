//! The completions chart: inline SVG bars, one per time bucket, drawn on
//! the server (no JavaScript).

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

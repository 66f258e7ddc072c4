//! The throughput-over-time plot of the disturbance runs: one panel per
//! run, one line per shard, the disturbance window shaded.

use super::plot_style::{color, err, legend};
use super::result::RunResult;
use anyhow::Result;
use plotters::prelude::*;
use std::path::Path;

/// One panel per disturbance run: completions/s of every shard over time,
/// the disturbance window shaded.
pub fn draw(runs: &[&RunResult], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 380 * runs.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    // Catch-up bursts can be many times the steady rate: cap the axis at 3×
    // the median bin so the steady lines stay readable (bursts are clipped).
    let mut bins: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.fine.iter().flat_map(|(_, v)| v.iter().copied()))
        .filter(|v| *v > 0.0)
        .collect();
    bins.sort_by(f64::total_cmp);
    let median = bins.get(bins.len() / 2).copied().unwrap_or(1.0);
    let ymax = bins
        .last()
        .copied()
        .unwrap_or(1.0)
        .min(3.0 * median)
        .max(1.0)
        * 1.1;
    for (panel, run) in root.split_evenly((runs.len(), 1)).iter().zip(runs) {
        let Some(d) = &run.disturbance else { continue };
        let xmax = run.fine.last().map_or(1.0, |(t, _)| *t + 0.5);
        let title = format!(
            "{} — {:?} on shard {} ({} shards, {} dequeuers/shard)",
            run.mode.name(),
            d.plan.kind,
            d.plan.shard,
            run.shards,
            run.dequeuers_per_shard
        );
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..xmax, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds since start")
            .y_desc("completed jobs/s (0.25 s bins, clipped at 3× median)")
            .draw()
            .map_err(err)?;
        let shade = Rectangle::new(
            [(d.window.start_s, 0.0), (d.window.end_s, ymax)],
            BLACK.mix(0.12).filled(),
        );
        chart.draw_series(std::iter::once(shade)).map_err(err)?;
        for shard in 0..run.shards {
            let c = color(run.mode, shard);
            let points = run
                .fine
                .iter()
                .map(|(t, v)| (*t, v.get(shard).copied().unwrap_or(0.0)));
            let width = if shard == d.plan.shard { 3 } else { 1 };
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(width)))
                .map_err(err)?
                .label(if shard == d.plan.shard {
                    format!("shard {shard} (disturbed)")
                } else {
                    format!("shard {shard}")
                })
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width))
                });
        }
        legend(&mut chart)?;
    }
    root.present().map_err(err)
}

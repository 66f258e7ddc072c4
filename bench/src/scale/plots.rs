//! SVG plots of an invocation, beside the JSON: the disturbance runs'
//! throughput over time, jobs/s against shards and against dequeuers, and
//! claim latency percentiles against dequeuers.

use super::plan::Mode;
use super::plot_style::{color, err, legend};
use super::result::RunResult;
use anyhow::Result;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// A run's position on an axis.
type Key = fn(&RunResult) -> usize;

/// A run's measured value.
type Value = fn(&RunResult) -> f64;

/// Draws every plot that has data; returns the files written.
pub fn draw(runs: &[RunResult], dir: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let disturbed: Vec<&RunResult> = runs
        .iter()
        .filter(|r| r.ok && r.disturbance.is_some())
        .collect();
    if !disturbed.is_empty() {
        let path = dir.join("throughput_timeline.svg");
        super::plot_timeline::draw(&disturbed, &path)?;
        written.push(path);
    }
    let sweep: Vec<&RunResult> = runs.iter().filter(|r| r.ok && r.kind == "sweep").collect();
    if !sweep.is_empty() {
        let path = dir.join("jobs_vs_shards.svg");
        versus(&sweep, &path, Axis::Shards)?;
        written.push(path);
        let path = dir.join("jobs_vs_dequeuers.svg");
        versus(&sweep, &path, Axis::Dequeuers)?;
        written.push(path);
        let path = dir.join("latency_vs_dequeuers.svg");
        latency(&sweep, &path)?;
        written.push(path);
    }
    Ok(written)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Axis {
    Shards,
    Dequeuers,
}

/// Median of `f` over runs of a cell.
fn median(runs: &[&RunResult], f: impl Fn(&RunResult) -> f64) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(|r| f(r)).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn values(runs: &[&RunResult], f: Key) -> Vec<usize> {
    let mut v: Vec<usize> = runs.iter().map(|r| f(r)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// (x, median y) of the runs of `mode` whose other axis equals `other`.
fn series(
    runs: &[&RunResult],
    mode: Mode,
    x: Key,
    other: Key,
    o: usize,
    y: Value,
) -> Vec<(f64, f64)> {
    values(runs, x)
        .into_iter()
        .filter_map(|xv| {
            let cell: Vec<&RunResult> = runs
                .iter()
                .copied()
                .filter(|r| r.mode == mode && x(r) == xv && other(r) == o)
                .collect();
            (!cell.is_empty()).then(|| (xv as f64, median(&cell, y)))
        })
        .collect()
}

/// Jobs/s against shards (one line per mode × dequeuers) or against
/// dequeuers (one line per mode × shards).
fn versus(runs: &[&RunResult], path: &Path, axis: Axis) -> Result<()> {
    let (x, other, xname, oname): (Key, Key, &str, &str) = match axis {
        Axis::Shards => (
            |r| r.shards,
            |r| r.dequeuers_per_shard,
            "shards (log)",
            "dequeuers/shard",
        ),
        Axis::Dequeuers => (
            |r| r.dequeuers_per_shard,
            |r| r.shards,
            "dequeuers per shard (log)",
            "shards",
        ),
    };
    let xs = values(runs, x);
    let (lo, hi) = (
        *xs.first().unwrap_or(&1) as f64,
        *xs.last().unwrap_or(&1) as f64,
    );
    let ymax = runs.iter().map(|r| r.jobs_per_s).fold(1.0, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let caption = format!("completed jobs/s vs {xname} (median of repeats)");
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(75);
    let mut lines = Vec::new();
    for mode in [Mode::Gated, Mode::Ungated] {
        for (i, o) in values(runs, other).into_iter().enumerate() {
            let s = series(runs, mode, x, other, o, |r| r.jobs_per_s);
            if !s.is_empty() {
                lines.push((format!("{} {o} {oname}", mode.name()), color(mode, i), s));
            }
        }
    }
    let mut chart = builder
        .build_cartesian_2d((lo * 0.8..hi * 1.25).log_scale(), 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(xname)
        .y_desc("jobs/s")
        .draw()
        .map_err(err)?;
    for (label, c, s) in lines {
        chart
            .draw_series(LineSeries::new(s.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(s.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    legend(&mut chart)?;
    root.present().map_err(err)
}

/// Claim latency p50 (left) and p99 (right) against dequeuers, log scales,
/// one line per mode × shards.
fn latency(runs: &[&RunResult], path: &Path) -> Result<()> {
    let xs = values(runs, |r| r.dequeuers_per_shard);
    let (lo, hi) = (
        *xs.first().unwrap_or(&1) as f64,
        *xs.last().unwrap_or(&1) as f64,
    );
    let root = SVGBackend::new(path, (1200, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 2));
    let pick: [(&str, Value); 2] = [
        ("p50", |r| r.claim_latency_ms.p50),
        ("p99", |r| r.claim_latency_ms.p99),
    ];
    for (panel, (name, y)) in panels.iter().zip(pick) {
        let ymax = runs.iter().map(|r| y(r)).fold(1.0, f64::max) * 2.0;
        let ymin = runs
            .iter()
            .map(|r| y(r))
            .fold(f64::INFINITY, f64::min)
            .max(0.01)
            / 2.0;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("claim latency {name} (enqueue → handler start)"),
                ("sans-serif", 18),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((lo * 0.8..hi * 1.25).log_scale(), (ymin..ymax).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("dequeuers per shard (log)")
            .y_desc("ms (log)")
            .draw()
            .map_err(err)?;
        for mode in [Mode::Gated, Mode::Ungated] {
            for (i, n) in values(runs, |r| r.shards).into_iter().enumerate() {
                let s = series(runs, mode, |r| r.dequeuers_per_shard, |r| r.shards, n, y);
                if s.is_empty() {
                    continue;
                }
                let c = color(mode, i);
                chart
                    .draw_series(LineSeries::new(s.clone(), c.stroke_width(2)))
                    .map_err(err)?
                    .label(format!("{} {n} shards", mode.name()))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                    });
                chart
                    .draw_series(s.into_iter().map(|p| Circle::new(p, 4, c.filled())))
                    .map_err(err)?;
            }
        }
        legend(&mut chart)?;
    }
    root.present().map_err(err)
}

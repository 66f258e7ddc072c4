//! What the plots share: series colours, the legend, plotting errors.

use super::plan::Mode;
use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// Line colours: blues for gated, reds for ungated, by series number.
const GATED: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(23, 190, 207),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];
const UNGATED: [RGBColor; 4] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];

/// The colour of series `i` of `mode`.
pub fn color(mode: Mode, i: usize) -> RGBColor {
    match mode {
        Mode::Gated => GATED[i % GATED.len()],
        Mode::Ungated => UNGATED[i % UNGATED.len()],
    }
}

/// A plotting error as an error of the run.
pub fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw a plot: {e}")
}

/// Draws the legend box of `chart`.
pub fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

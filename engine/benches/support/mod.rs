//! What the engine's bench programs share: where the workspace and the figures folder are, the
//! median / mean / p90 they report, the figures table their reports open with, and the frame of
//! their charts.

// Each bench program compiles this module on its own and uses only a part of it.
#![allow(dead_code)]

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub mod llamacpp;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// The workspace root.
pub fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The folder a run's figures go to (`BENCH_FIGURES_DIR`, by default the report's run folder),
/// created if missing.
pub fn figures_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::var_os("BENCH_FIGURES_DIR")
        .map_or_else(|| root().join("target/bench-report/figures-run"), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Median, mean and 90th percentile.
pub type Stats = (f64, f64, f64);

/// Median, mean and 90th percentile of `v`.
pub fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(f64::total_cmp);
    let n = v.len().max(1);
    let mean = v.iter().sum::<f64>() / n as f64;
    (v[n / 2], mean, v[((n as f64 * 0.9).ceil() as usize).clamp(1, n) - 1])
}

/// A Markdown table of a flat JSON object of figures, one row each.
pub fn figures_table(md: &mut String, figures: &serde_json::Value) {
    md.push_str("| figure | value |\n|---|---:|\n");
    for (k, v) in figures.as_object().into_iter().flatten() {
        // Writing to a String cannot fail.
        let _ = writeln!(md, "| `{k}` | {:.3} |", v.as_f64().unwrap_or(f64::NAN));
    }
}

/// A chart drawn to an SVG file over the ranges `X` and `Y`.
pub type SvgChart<'a, 'b, X, Y> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<<X as AsRangedCoord>::CoordDescType, <Y as AsRangedCoord>::CoordDescType>,
>;

/// The charts' frame: a chart on `area` titled `caption`, over the ranges `x` and `y`, with room
/// for the axes' labels, its mesh drawn with the axes described as `x_desc` and `y_desc`.
pub fn chart<'a, 'b, X: AsRangedCoord, Y: AsRangedCoord>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    (x, y): (X, Y),
    (x_desc, y_desc): (&str, &str),
) -> Result<SvgChart<'a, 'b, X, Y>, Box<dyn Error>>
where
    X::CoordDescType: ValueFormatter<X::Value>,
    Y::CoordDescType: ValueFormatter<Y::Value>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(x, y)?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw()?;
    Ok(chart)
}

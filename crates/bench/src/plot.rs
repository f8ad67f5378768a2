//! The picture of a controller suite, as SVG (plotters' SVG backend, no system libraries): objects
//! converged over time for the controller and its floor and, when several sizes ran, how time and
//! peak RSS grow with size.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::report::{Report, ScalePoint, Series};

const COLORS: [RGBColor; 2] = [RGBColor(200, 60, 40), RGBColor(40, 90, 200)];

/// Writes the suite's picture to `path`.
pub fn write_svg(report: &Report, path: &Path) -> Result<()> {
    let panels = if report.scaling.len() > 1 { 3 } else { 1 };
    let root = SVGBackend::new(path, (520 * panels, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let areas = root.split_evenly((1, panels as usize));
    convergence(&areas[0], &report.title, &report.convergence)?;
    if panels > 1 {
        let unit = &report.size_unit;
        scaling(
            &areas[1],
            &format!("time to converge by {unit}"),
            unit,
            "seconds",
            &report.scaling,
            |p| [Some(p.seconds), Some(p.floor_seconds)],
            ["controller", "floor"],
        )?;
        scaling(
            &areas[2],
            &format!("controller peak RSS by {unit}"),
            unit,
            "MiB",
            &report.scaling,
            |p| [Some(p.peak_rss_mib), None],
            ["controller", ""],
        )?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

fn plot_error(err: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the SVG: {err}")
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn convergence(area: &Area<'_>, title: &str, series: &[Series]) -> Result<()> {
    let max_t = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0_f64, f64::max)
        .max(1e-3);
    let max_n = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_t * 1.05, 0usize..max_n + max_n / 20 + 1)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_desc("objects converged")
        .draw()
        .map_err(plot_error)?;
    for (s, color) in series.iter().zip(COLORS.iter().cycle()) {
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color))
            .map_err(plot_error)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

fn scaling(
    area: &Area<'_>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    points: &[ScalePoint],
    values: impl Fn(&ScalePoint) -> [Option<f64>; 2],
    labels: [&str; 2],
) -> Result<()> {
    let max_size = points.iter().map(|p| p.size).max().unwrap_or(1).max(1);
    let max_y = points
        .iter()
        .flat_map(|p| values(p).into_iter().flatten())
        .fold(0.0_f64, f64::max)
        .max(1e-3);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0usize..max_size + max_size / 20 + 1, 0.0..max_y * 1.1)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(plot_error)?;
    for (index, (label, color)) in labels.iter().zip(COLORS.iter()).enumerate() {
        let line: Vec<(usize, f64)> = points
            .iter()
            .filter_map(|p| values(p)[index].map(|v| (p.size, v)))
            .collect();
        if line.is_empty() {
            continue;
        }
        chart
            .draw_series(PointSeries::of_element(
                line.clone(),
                3,
                color,
                &|c, s, st| Circle::new(c, s, st.filled()),
            ))
            .map_err(plot_error)?;
        chart
            .draw_series(LineSeries::new(line, color))
            .map_err(plot_error)?
            .label(label.to_string())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

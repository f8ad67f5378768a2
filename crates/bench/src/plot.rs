//! The picture of a controller suite, as SVG (plotters' SVG backend, no system libraries): objects
//! converged over time for the controller and its floor and, when several sizes ran, how time and
//! peak RSS grow with size.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::report::{Chart, Report, ScalePoint, Series};

const COLORS: [RGBColor; 4] = [
    RGBColor(200, 60, 40),
    RGBColor(40, 90, 200),
    RGBColor(40, 150, 70),
    RGBColor(120, 120, 120),
];

/// Writes the suite's picture to `path`.
pub fn write_svg(report: &Report, path: &Path) -> Result<()> {
    if let Some(chart) = &report.chart {
        return write_chart_svg(report, chart, path);
    }
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

/// A suite with a [`Chart`]: the chart, then the convergence curves when there are any.
fn write_chart_svg(report: &Report, chart: &Chart, path: &Path) -> Result<()> {
    let panels = if report.convergence.is_empty() { 1 } else { 2 };
    let root = SVGBackend::new(path, (520 * panels, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let areas = root.split_evenly((1, panels as usize));
    lines(&areas[0], chart)?;
    if panels > 1 {
        convergence(&areas[1], &report.title, &report.convergence)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

fn lines(area: &Area<'_>, chart: &Chart) -> Result<()> {
    let xs = || {
        chart
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.0))
    };
    let min_x = xs().fold(f64::INFINITY, f64::min);
    let max_x = xs().fold(f64::NEG_INFINITY, f64::max);
    let (min_x, max_x) = if min_x.is_finite() {
        (min_x, max_x)
    } else {
        (0.0, 1.0)
    };
    let pad = ((max_x - min_x) * 0.05).max(0.2);
    let max_y = chart
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1e-3);
    let mut plot = ChartBuilder::on(area)
        .caption(&chart.title, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        // Headroom above the lines for the legend.
        .build_cartesian_2d(min_x - pad..max_x + pad, 0.0..max_y * 1.6)
        .map_err(plot_error)?;
    plot.configure_mesh()
        // About one label per whole x (replicas), not plotters' halves.
        .x_labels(((max_x - min_x).round() as usize + 1).clamp(2, 12))
        .x_desc(chart.x_desc.as_str())
        .y_desc(chart.y_desc.as_str())
        .draw()
        .map_err(plot_error)?;
    for line in &chart.lines {
        let color = COLORS[line.color % COLORS.len()];
        let points = line.points.iter().copied();
        let drawn = if line.dashed {
            plot.draw_series(DashedLineSeries::new(points, 6, 4, color.stroke_width(1)))
        } else {
            plot.draw_series(PointSeries::of_element(
                line.points.clone(),
                3,
                color,
                &|c, s, st| Circle::new(c, s, st.filled()),
            ))
            .map_err(plot_error)?;
            plot.draw_series(LineSeries::new(points, color.stroke_width(2)))
        };
        drawn
            .map_err(plot_error)?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    plot.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

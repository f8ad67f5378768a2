//! The one table every run prints: figure, value, floor measured in the same run, ratio, target,
//! met or not. Plain text, one row per figure, so two runs can be read side by side.

use std::fmt;

use crate::report::Row;

/// A number as the table prints it: 3 significant decimals below 10, fewer above.
pub fn number(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_string();
    }
    let magnitude = value.abs();
    if magnitude >= 1000.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}

fn with_unit(value: f64, unit: &str) -> String {
    if unit.is_empty() {
        number(value)
    } else {
        format!("{} {unit}", number(value))
    }
}

/// Writes `rows` as aligned columns with a header line.
pub fn write(f: &mut impl fmt::Write, rows: &[Row]) -> fmt::Result {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|row| {
            [
                row.figure.clone(),
                with_unit(row.value, &row.unit),
                row.floor
                    .map_or_else(|| "-".to_string(), |floor| with_unit(floor, &row.unit)),
                row.ratio
                    .map_or_else(|| "-".to_string(), |r| format!("{r:.2}x")),
                row.target.clone().unwrap_or_else(|| "-".to_string()),
                match row.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                }
                .to_string(),
            ]
        })
        .collect();
    let header = ["figure", "value", "floor", "ratio", "target", "met"];
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |f: &mut dyn fmt::Write, cells: [&str; 6]| {
        writeln!(
            f,
            "  {:<w0$}  {:>w1$}  {:>w2$}  {:>w3$}  {:<w4$}  {}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4],
        )
    };
    line(f, header)?;
    for row in &cells {
        line(f, [&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]])?;
    }
    Ok(())
}

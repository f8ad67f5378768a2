//! A suite's results: rows of `{figure, value, unit, floor, ratio, target, met}` (the JSON and the
//! one table are made of them), plus convergence samples and scaling points for the pictures.

use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One figure. `floor` and `ratio` are set when the figure was compared with a floor measured in
/// the same run; `met` when the target is numeric (`<= 1.3x`, `< 64`, `>= 0.5x`, `= 0`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub figure: String,
    pub value: f64,
    pub unit: String,
    pub floor: Option<f64>,
    pub ratio: Option<f64>,
    pub target: Option<String>,
    pub met: Option<bool>,
    /// What the figure is compared with, or detail (free text; not compared).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// Objects converged over time (seconds since the start) of one run.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, usize)>,
}

/// One size of a scaling run: what the picture's scaling curve plots.
#[derive(Debug, Clone, Default)]
pub struct ScalePoint {
    pub size: usize,
    pub seconds: f64,
    pub floor_seconds: f64,
    pub requests: u64,
    pub peak_rss_mib: f64,
}

/// A figure against a parameter of the suite (peak RSS per replica against replicas), one line
/// per variant: the picture of a suite that has no scaling curve (`plot.rs`).
#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub lines: Vec<Line>,
}

#[derive(Debug, Clone, Default)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Index into the picture's colours, so a goal can share its measurement's colour.
    pub color: usize,
    /// A goal rather than a measurement: drawn dashed, without points.
    pub dashed: bool,
}

#[derive(Default)]
pub struct Report {
    pub title: String,
    pub rows: Vec<Row>,
    /// Convergence over time, controller and floor, of the largest size run.
    pub convergence: Vec<Series>,
    pub scaling: Vec<ScalePoint>,
    /// Unit of the scaling sizes ("nodes", "machines"); empty when the suite has no picture.
    pub size_unit: String,
    /// Drawn instead of the scaling curve, beside the convergence curves (if any).
    pub chart: Option<Chart>,
}

impl Report {
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            ..Self::default()
        }
    }

    /// A measurement given as text (`"1.000"`, `"42.1 MiB"`, `"12.30ms"`), with a note (what it is
    /// compared with, or the target). The leading number becomes the value, the rest the unit;
    /// a note of the form `target <op> N ...` is checked against the value.
    pub fn row(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
        note: impl Into<String>,
    ) {
        let (value, unit) = split_value(&value.into());
        let note = note.into();
        let target = note
            .strip_prefix("target ")
            .and_then(Target::parse_leading)
            .map(|t| t.with_default_op(Op::AtMost));
        self.rows.push(Row {
            figure: name.into(),
            value,
            unit,
            floor: None,
            ratio: None,
            met: target.map(|t| t.met(value)),
            target: target.map(|t| t.to_string()),
            note,
        });
    }

    /// `subject / floor` of two durations measured in this run; `target` like `"<= 1.3x"` is
    /// checked against the ratio, any other text is kept as said.
    pub fn ratio(&mut self, name: &str, subject: Duration, floor: Duration, target: &str) {
        let ratio = subject.as_secs_f64() / floor.as_secs_f64().max(f64::EPSILON);
        let parsed = Target::parse_leading(target);
        self.rows.push(Row {
            figure: name.to_string(),
            value: subject.as_secs_f64(),
            unit: "s".to_string(),
            floor: Some(floor.as_secs_f64()),
            ratio: Some(ratio),
            target: Some(parsed.map_or_else(|| target.to_string(), |t| format!("{t}x"))),
            met: parsed.map(|t| t.met(ratio)),
            note: String::new(),
        });
    }

    /// A count per object of the side under test against the floor's in the same run (writes or
    /// reads per machine), with their ratio; no target.
    pub fn per_object(&mut self, name: &str, value: f64, floor: f64, note: &str) {
        self.rows.push(Row {
            figure: name.to_string(),
            value,
            unit: String::new(),
            floor: Some(floor),
            ratio: (floor > 0.0).then(|| value / floor),
            target: None,
            met: None,
            note: note.to_string(),
        });
    }

    /// A count per object of the side under test against a floor computed for the same run, with
    /// their ratio checked against `target` like `"<= 1.2x"` (as [`Report::ratio`] does).
    pub fn per_object_against(
        &mut self,
        name: &str,
        value: f64,
        floor: f64,
        target: &str,
        note: &str,
    ) {
        let ratio = value / floor.max(f64::EPSILON);
        let parsed = Target::parse_leading(target);
        self.rows.push(Row {
            figure: name.to_string(),
            value,
            unit: String::new(),
            floor: Some(floor),
            ratio: Some(ratio),
            target: Some(parsed.map_or_else(|| target.to_string(), |t| format!("{t}x"))),
            met: parsed.map(|t| t.met(ratio)),
            note: note.to_string(),
        });
    }

    /// Prefixes every figure (e.g. with the size, when a suite runs at several sizes).
    pub fn prefix_figures(&mut self, prefix: &str) {
        for row in &mut self.rows {
            row.figure = format!("{prefix}{}", row.figure);
        }
    }
}

impl Report {
    /// One report of a suite run at several sizes: the figures of each size prefixed with it
    /// (unchanged when only one size ran), the scaling points in size order, and the
    /// convergence curves of the largest size.
    pub fn merge_sizes(mut reports: Vec<(usize, Report)>, size_unit: &str) -> Report {
        reports.sort_by_key(|(size, _)| *size);
        let several = reports.len() > 1;
        let mut merged = Report {
            size_unit: size_unit.to_string(),
            ..Report::default()
        };
        for (size, mut report) in reports {
            for point in report.scaling.clone() {
                report.row(
                    "API requests to converge",
                    point.requests.to_string(),
                    "every verb of the side under test (the suite's per-object rows say what is counted)",
                );
            }
            if several {
                report.prefix_figures(&format!("{size} {size_unit}: "));
            }
            merged.title = report.title;
            merged.rows.append(&mut report.rows);
            merged.scaling.append(&mut report.scaling);
            merged.convergence = report.convergence;
        }
        merged
    }
}

impl Report {
    /// Repeated runs of one size as one report: every time (a row in seconds) is the median of
    /// its runs, subject and floor each, with the ratio and target check redone; every other row,
    /// the curves and the scaling point's counts come from the run whose first time is the median.
    pub fn median_of(mut runs: Vec<Report>) -> Report {
        let first_time = |r: &Report| {
            r.rows
                .iter()
                .find(|row| row.unit == "s")
                .map_or(0.0, |row| row.value)
        };
        runs.sort_by(|a, b| first_time(a).total_cmp(&first_time(b)));
        let times = |figure: &str, of: fn(&Row) -> Option<f64>| -> Vec<Duration> {
            runs.iter()
                .filter_map(|r| r.rows.iter().find(|row| row.figure == figure))
                .filter_map(of)
                .map(Duration::from_secs_f64)
                .collect()
        };
        let count = runs.len();
        let mut medians = Vec::new();
        if let Some(base) = runs.get(count / 2) {
            for row in base.rows.iter().filter(|row| row.unit == "s") {
                let value = median(&times(&row.figure, |r| Some(r.value)));
                let floor = row
                    .floor
                    .map(|_| median(&times(&row.figure, |r| r.floor)).as_secs_f64());
                medians.push((row.figure.clone(), value.as_secs_f64(), floor));
            }
        }
        let Some(mut merged) = (!runs.is_empty()).then(|| runs.swap_remove(count / 2)) else {
            return Report::default();
        };
        for row in &mut merged.rows {
            let Some((_, value, floor)) = medians.iter().find(|(f, ..)| *f == row.figure) else {
                continue;
            };
            row.value = *value;
            row.floor = *floor;
            let checked = match (row.floor, row.ratio) {
                (Some(floor), Some(_)) => {
                    let ratio = value / floor.max(f64::EPSILON);
                    row.ratio = Some(ratio);
                    ratio
                }
                _ => *value,
            };
            if let Some(target) = row.target.as_deref().and_then(Target::parse_leading) {
                row.met = Some(target.met(checked));
            }
            row.note = format!("median of {count} runs");
        }
        if let Some(point) = merged.scaling.last_mut() {
            let converge = merged.rows.iter().find(|row| row.unit == "s");
            if let Some(row) = converge {
                point.seconds = row.value;
                point.floor_seconds = row.floor.unwrap_or(point.floor_seconds);
            }
        }
        merged.title = format!("{}, median of {count} runs", merged.title);
        merged
    }
}

/// Samples of a converged count while a completion watch runs: about 200 per curve, plus the last.
pub struct Samples {
    step: usize,
    total: usize,
    pub points: Vec<(Instant, usize)>,
}

impl Samples {
    pub fn new(total: usize) -> Self {
        Self {
            step: (total / 200).max(1),
            total,
            points: Vec::new(),
        }
    }

    pub fn record(&mut self, converged: usize) {
        if converged.is_multiple_of(self.step) || converged >= self.total {
            self.points.push((Instant::now(), converged));
        }
    }
}

/// The median of plain values (rates): the middle one, or the mean of the two middle ones.
pub fn median_value(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The median of repeated samples of a time (the mean of the two middle ones for an even count);
/// zero for none.
pub fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    match sorted.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2,
    }
}

/// Samples as seconds since `start`, beginning at (0, 0).
pub fn since(start: Instant, samples: Vec<(Instant, usize)>) -> Vec<(f64, usize)> {
    std::iter::once((0.0, 0))
        .chain(
            samples
                .into_iter()
                .map(|(at, n)| (at.saturating_duration_since(start).as_secs_f64(), n)),
        )
        .collect()
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\n{}", self.title)?;
        crate::table::write(f, &self.rows)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    AtMost,
    Below,
    AtLeast,
    Above,
    Equal,
}

/// A numeric target such as `<= 1.3` or `< 64`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Target {
    op: Option<Op>,
    bound: f64,
}

impl Target {
    /// `"<= 1.3x ..."`, `"< 64 MiB"`, `"0"`: the operator (if any) and the number at the start.
    fn parse_leading(text: &str) -> Option<Self> {
        let text = text.trim_start();
        let (op, rest) = [
            ("<=", Op::AtMost),
            (">=", Op::AtLeast),
            ("<", Op::Below),
            (">", Op::Above),
            ("=", Op::Equal),
        ]
        .iter()
        .find_map(|(s, op)| text.strip_prefix(s).map(|rest| (Some(*op), rest)))
        .unwrap_or((None, text));
        let rest = rest.trim_start();
        let (bound, len) = leading_number(rest)?;
        // A time bound is compared in seconds, as the row's value is (see `split_value`).
        let unit = rest[len..].trim_start();
        let unit = &unit[..unit
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(unit.len())];
        let bound = bound * time_scale(unit).unwrap_or(1.0);
        Some(Self { op, bound })
    }

    fn with_default_op(self, op: Op) -> Self {
        Self {
            op: self.op.or(Some(op)),
            ..self
        }
    }

    fn met(self, value: f64) -> bool {
        // Values printed to 3 decimals are compared as printed.
        let value = (value * 1000.0).round() / 1000.0;
        match self.op.unwrap_or(Op::AtMost) {
            Op::AtMost => value <= self.bound,
            Op::Below => value < self.bound,
            Op::AtLeast => value >= self.bound,
            Op::Above => value > self.bound,
            Op::Equal => value == self.bound,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op.unwrap_or(Op::AtMost) {
            Op::AtMost => "<=",
            Op::Below => "<",
            Op::AtLeast => ">=",
            Op::Above => ">",
            Op::Equal => "=",
        };
        write!(f, "{op} {}", self.bound)
    }
}

/// The number at the start of `text` and the byte length it took.
fn leading_number(text: &str) -> Option<(f64, usize)> {
    let end = text
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || (*i == 0 && *c == '-')))
        .map_or(text.len(), |(i, _)| i);
    text[..end].parse().ok().map(|n| (n, end))
}

/// `"42.1 MiB"` -> `(42.1, "MiB")`; a duration printed by `{:?}` (`"12.30ms"`) -> seconds.
/// Seconds per `unit`, for the units smaller than a second that rows are written in.
fn time_scale(unit: &str) -> Option<f64> {
    match unit {
        "ns" => Some(1e-9),
        "µs" | "us" => Some(1e-6),
        "ms" => Some(1e-3),
        _ => None,
    }
}

fn split_value(text: &str) -> (f64, String) {
    let Some((number, len)) = leading_number(text.trim()) else {
        return (f64::NAN, text.to_string());
    };
    let unit = text.trim()[len..].trim().to_string();
    match time_scale(&unit) {
        Some(scale) => (number * scale, "s".to_string()),
        None => (number, unit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_target_is_compared_in_the_units_of_the_value() {
        let mut report = Report::new("t");
        report.row("cpu", "14.0 ms", "target <= 7 ms: half of before");
        report.row("cpu", "6.5 ms", "target <= 7 ms");
        report.row("cpu", "6.5 ms", "target <= 5000 us");
        let met: Vec<_> = report.rows.iter().map(|r| r.met).collect();
        assert_eq!(met, [Some(false), Some(true), Some(false)]);
        assert_eq!(report.rows[0].value, 0.014);
    }

    #[test]
    fn a_ratio_row_is_checked_against_its_target() {
        let mut report = Report::new("t");
        report.ratio(
            "converge",
            Duration::from_millis(1300),
            Duration::from_secs(1),
            "<= 1.3x",
        );
        report.ratio(
            "fan-out",
            Duration::from_millis(1400),
            Duration::from_secs(1),
            "<= 1.3x",
        );
        report.ratio(
            "list",
            Duration::from_secs(1),
            Duration::from_secs(1),
            "as low as possible",
        );
        let met: Vec<_> = report.rows.iter().map(|r| r.met).collect();
        assert_eq!(met, [Some(true), Some(false), None]);
        assert_eq!(report.rows[0].target.as_deref(), Some("<= 1.3x"));
        assert_eq!(report.rows[0].floor, Some(1.0));
        assert_eq!(report.rows[2].target.as_deref(), Some("as low as possible"));
    }

    #[test]
    fn a_count_against_its_floor_is_checked_against_the_target_ratio() {
        let mut report = Report::new("t");
        report.per_object_against("writes", 6.0, 5.0, "<= 1.2x", "n");
        report.per_object_against("writes", 6.5, 5.0, "<= 1.2x", "n");
        let met: Vec<_> = report.rows.iter().map(|r| r.met).collect();
        assert_eq!(met, [Some(true), Some(false)]);
        assert_eq!(report.rows[0].target.as_deref(), Some("<= 1.2x"));
        assert_eq!(report.rows[0].floor, Some(5.0));
    }

    #[test]
    fn repeated_runs_report_the_median_time_and_ratio() {
        let run = |subject_ms: u64, floor_ms: u64, writes: &str| {
            let mut report = Report::new("t");
            report.ratio(
                "converge",
                Duration::from_millis(subject_ms),
                Duration::from_millis(floor_ms),
                "<= 1.3x",
            );
            report.row("writes per node", writes, "target 1");
            report
        };
        let merged = Report::median_of(vec![
            run(300, 100, "1.5"),
            run(120, 100, "1.0"),
            run(200, 180, "1.2"),
        ]);
        let converge = &merged.rows[0];
        assert!((converge.value - 0.2).abs() < 1e-9, "{converge:?}");
        assert_eq!(converge.floor, Some(0.1));
        assert!((converge.ratio.expect("ratio") - 2.0).abs() < 1e-9);
        assert_eq!(converge.met, Some(false));
        assert_eq!(converge.note, "median of 3 runs");
        // The other rows are the median run's (its first time is 0.2 s).
        assert_eq!(merged.rows[1].value, 1.2);
        assert_eq!(merged.title, "t, median of 3 runs");
    }

    #[test]
    fn the_median_of_repeated_samples() {
        let ms = Duration::from_millis;
        assert_eq!(median(&[ms(30), ms(10), ms(20)]), ms(20));
        assert_eq!(median(&[ms(40), ms(10), ms(20), ms(30)]), ms(25));
        assert_eq!(median(&[ms(7)]), ms(7));
        assert_eq!(median(&[]), Duration::ZERO);
    }

    #[test]
    fn text_rows_become_value_and_unit_and_targets_in_notes_are_checked() {
        let mut report = Report::new("t");
        report.row("rss", "70.5 MiB", "target < 64 MiB");
        report.row("writes", "1.000", "target 1 (reads: list+watch only)");
        report.row("list", "206.00ms", "target well under 1 s");
        report.row("steady", "2", "target 0");
        let rows = &report.rows;
        assert_eq!((rows[0].value, rows[0].unit.as_str()), (70.5, "MiB"));
        assert_eq!(rows[0].target.as_deref(), Some("< 64"));
        assert_eq!(rows[0].met, Some(false));
        assert_eq!(rows[1].met, Some(true));
        assert!((rows[2].value - 0.206).abs() < 1e-9);
        assert_eq!(rows[2].unit, "s");
        assert_eq!(rows[2].met, None);
        assert_eq!(rows[3].met, Some(false));
    }
}

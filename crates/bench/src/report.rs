//! A benchmark report: named measurements and the ratios between them, printed as a table.

use std::fmt;
use std::time::Duration;

#[derive(Default)]
pub struct Report {
    title: String,
    rows: Vec<(String, String, String)>,
}

impl Report {
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            rows: Vec::new(),
        }
    }

    /// A measurement, with a note (what it is compared with, or the target).
    pub fn row(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
        note: impl Into<String>,
    ) {
        self.rows.push((name.into(), value.into(), note.into()));
    }

    /// `subject / floor` of two durations measured in this run.
    pub fn ratio(&mut self, name: &str, subject: Duration, floor: Duration, target: &str) {
        let ratio = subject.as_secs_f64() / floor.as_secs_f64().max(f64::EPSILON);
        self.row(
            name,
            format!("{ratio:.2}x"),
            format!("{:.2?} vs floor {:.2?}; target {target}", subject, floor),
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\n{}", self.title)?;
        let width = self.rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        for (name, value, note) in &self.rows {
            writeln!(f, "  {name:<width$}  {value:>10}  {note}")?;
        }
        Ok(())
    }
}

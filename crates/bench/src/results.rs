//! Results kept between runs: `{commit, rows}` as JSON under `target/bench/`, and the change per
//! figure between two such files (`--compare OLD.json`), so one commit can be held against the next.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::report::Row;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub commit: String,
    pub rows: Vec<Row>,
}

impl Results {
    /// Writes `<dir>/<name>-<commit>.json` and returns its path.
    pub fn write(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let short: String = self.commit.chars().take(12).collect();
        let path = dir.join(format!("{name}-{short}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: not a capstan-bench result file", path.display()))
    }
}

/// The commit being measured (`git rev-parse HEAD`), or `"unknown"` outside a git checkout.
pub fn head_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The change per figure from `old` to `new`: values, ratios against their floors, and figures
/// only one side has.
pub fn compare(old: &Results, new: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nChange per figure, {} -> {}",
        short(&old.commit),
        short(&new.commit)
    );
    let width = new
        .rows
        .iter()
        .chain(&old.rows)
        .map(|r| r.figure.chars().count())
        .max()
        .unwrap_or(0);
    for row in &new.rows {
        let Some(before) = old.rows.iter().find(|r| r.figure == row.figure) else {
            let _ = writeln!(out, "  {:<width$}  new figure", row.figure);
            continue;
        };
        let (from, to) = match (before.ratio, row.ratio) {
            (Some(a), Some(b)) => (format!("{a:.2}x"), format!("{b:.2}x")),
            _ => (
                crate::table::number(before.value),
                crate::table::number(row.value),
            ),
        };
        let (a, b) = (
            before.ratio.unwrap_or(before.value),
            row.ratio.unwrap_or(row.value),
        );
        let change = if a != 0.0 && a.is_finite() && b.is_finite() {
            format!("{:+.1}%", (b - a) / a.abs() * 100.0)
        } else if a == b {
            "+0.0%".to_string()
        } else {
            "changed".to_string()
        };
        let met = match (before.met, row.met) {
            (Some(true), Some(false)) => "  (target now missed)",
            (Some(false), Some(true)) => "  (target now met)",
            _ => "",
        };
        let _ = writeln!(
            out,
            "  {:<width$}  {from:>10} -> {to:>10}  {change:>8} {}{met}",
            row.figure, row.unit
        );
    }
    for row in &old.rows {
        if !new.rows.iter().any(|r| r.figure == row.figure) {
            let _ = writeln!(out, "  {:<width$}  gone", row.figure);
        }
    }
    out
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(figure: &str, value: f64, ratio: Option<f64>) -> Row {
        Row {
            figure: figure.to_string(),
            value,
            unit: "s".to_string(),
            floor: ratio.map(|r| value / r),
            ratio,
            target: Some("<= 1.3x".to_string()),
            met: ratio.map(|r| r <= 1.3),
            note: String::new(),
        }
    }

    #[test]
    fn compare_names_each_change_new_and_gone_figures() {
        let old = Results {
            commit: "a".repeat(40),
            rows: vec![row("converge", 2.0, Some(1.5)), row("old only", 1.0, None)],
        };
        let new = Results {
            commit: "b".repeat(40),
            rows: vec![row("converge", 1.2, Some(1.2)), row("new only", 1.0, None)],
        };
        let text = compare(&old, &new);
        assert!(text.contains("aaaaaaaaaaaa -> bbbbbbbbbbbb"), "{text}");
        let converge = text
            .lines()
            .find(|l| l.contains("converge"))
            .expect("converge line");
        assert!(converge.contains("1.50x ->"), "{converge}");
        assert!(converge.contains("1.20x"), "{converge}");
        assert!(converge.contains("-20.0%"), "{converge}");
        assert!(converge.contains("(target now met)"), "{converge}");
        assert!(
            text.lines()
                .any(|l| l.contains("new only") && l.ends_with("new figure"))
        );
        assert!(
            text.lines()
                .any(|l| l.contains("old only") && l.ends_with("gone"))
        );
    }
}

//! `cargo xtask crdgen [--check]`: render the CRDs of `capstan_apis::crds` into the chart.
//!
//! Files are only rewritten when their content changes, and generated files (those starting
//! with the generated-by header) that no longer correspond to a CRD are removed. `--check`
//! changes nothing and fails listing every file that would change.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use capstan_apis::crds;

#[derive(clap::Args)]
pub struct Args {
    /// Do not write; exit non-zero listing the files that differ from the types.
    #[arg(long)]
    check: bool,
    /// Output directory (default: <workspace>/charts/capstan/crds).
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl Args {
    /// `--check` against the chart's CRD folder, as CI runs it.
    pub fn check_chart() -> Self {
        Self {
            check: true,
            dir: None,
        }
    }
}

/// What must happen to one file for the directory to match the types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Create(String),
    Update(String),
    /// A generated file no CRD produces any more.
    Remove(String),
}

impl Change {
    fn describe(&self) -> String {
        match self {
            Change::Create(f) => format!("{f}: missing"),
            Change::Update(f) => format!("{f}: differs from the Rust types"),
            Change::Remove(f) => format!("{f}: stale (no such CRD any more)"),
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| crate::workspace_root().join(crds::CHART_CRD_DIR));
    let wanted = crds::rendered_files().context("rendering CRDs")?;
    if args.check {
        let changes = check(&dir, &wanted)?;
        if !changes.is_empty() {
            let list: Vec<String> = changes.iter().map(Change::describe).collect();
            bail!(
                "CRD files in {} are out of date (run `cargo xtask crdgen`):\n  {}",
                dir.display(),
                list.join("\n  ")
            );
        }
        println!(
            "{} CRD files in {} are up to date",
            wanted.len(),
            dir.display()
        );
    } else {
        let changes = write(&dir, &wanted)?;
        for change in &changes {
            println!("{}", change.describe());
        }
        println!(
            "{} CRDs in {}, {} file(s) changed",
            wanted.len(),
            dir.display(),
            changes.len()
        );
    }
    Ok(())
}

/// The changes that would make `dir` match `wanted`, without touching anything.
pub fn check(dir: &Path, wanted: &[(String, String)]) -> Result<Vec<Change>> {
    Ok(plan(&read_generated(dir, wanted)?, wanted))
}

/// Brings `dir` in line with `wanted` and returns what changed.
pub fn write(dir: &Path, wanted: &[(String, String)]) -> Result<Vec<Change>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let changes = plan(&read_generated(dir, wanted)?, wanted);
    let contents: BTreeMap<&str, &str> = wanted
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    for change in &changes {
        match change {
            Change::Create(name) | Change::Update(name) => {
                let path = dir.join(name);
                let content = contents.get(name.as_str()).copied().unwrap_or_default();
                fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
            }
            Change::Remove(name) => {
                let path = dir.join(name);
                fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    Ok(changes)
}

/// Pure diff of the generated files found (`name -> content`) against the wanted ones.
pub fn plan(existing: &BTreeMap<String, String>, wanted: &[(String, String)]) -> Vec<Change> {
    let mut changes = Vec::new();
    for (name, content) in wanted {
        match existing.get(name) {
            None => changes.push(Change::Create(name.clone())),
            Some(old) if old != content => changes.push(Change::Update(name.clone())),
            Some(_) => {}
        }
    }
    for name in existing.keys() {
        if !wanted.iter().any(|(n, _)| n == name) {
            changes.push(Change::Remove(name.clone()));
        }
    }
    changes
}

/// YAML files in `dir`: every file a CRD would be written to, and any other file carrying the
/// generated header (hand-written files without it are left alone). A missing dir is empty.
fn read_generated(dir: &Path, wanted: &[(String, String)]) -> Result<BTreeMap<String, String>> {
    let mut found = BTreeMap::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let content =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        if content.starts_with(crds::HEADER) || wanted.iter().any(|(n, _)| *n == name) {
            found.insert(name, content);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted() -> Vec<(String, String)> {
        crds::rendered_files().expect("renders")
    }

    #[test]
    fn plan_lists_missing_changed_and_stale_files() {
        let wanted = vec![
            ("a.yaml".to_owned(), "A".to_owned()),
            ("b.yaml".to_owned(), "B".to_owned()),
        ];
        let existing: BTreeMap<String, String> = [("b.yaml", "old"), ("z.yaml", "Z")]
            .map(|(n, c)| (n.to_owned(), c.to_owned()))
            .into();
        assert_eq!(
            plan(&existing, &wanted),
            [
                Change::Create("a.yaml".into()),
                Change::Update("b.yaml".into()),
                Change::Remove("z.yaml".into())
            ]
        );
        let current: BTreeMap<String, String> = wanted.iter().cloned().collect();
        assert_eq!(plan(&current, &wanted), []);
    }

    #[test]
    fn write_then_check_is_clean_and_edits_are_detected() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("crds");
        let wanted = wanted();
        assert_eq!(
            check(&dir, &wanted).expect("check").len(),
            wanted.len(),
            "empty dir: all missing"
        );
        assert_eq!(write(&dir, &wanted).expect("write").len(), wanted.len());
        assert_eq!(check(&dir, &wanted).expect("check"), []);
        assert_eq!(
            write(&dir, &wanted).expect("write"),
            [],
            "second write changes nothing"
        );

        let (first, _) = &wanted[0];
        fs::write(dir.join(first), "hand edit\n").expect("edit");
        let stale = format!("{}\nkind: CustomResourceDefinition\n", crds::HEADER);
        fs::write(dir.join("old.example.com.yaml"), stale).expect("stale");
        fs::write(dir.join("README.yaml"), "hand-written, no header\n").expect("other");
        assert_eq!(
            check(&dir, &wanted).expect("check"),
            [
                Change::Update(first.clone()),
                Change::Remove("old.example.com.yaml".into())
            ]
        );
        write(&dir, &wanted).expect("write");
        assert_eq!(check(&dir, &wanted).expect("check"), []);
        assert!(
            dir.join("README.yaml").exists(),
            "files without the header are not ours"
        );
    }
}

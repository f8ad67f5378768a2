//! The chart's committed CRD files must be exactly what the Rust types render
//! (`cargo xtask crdgen` rewrites them).

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use capstan_apis::crds;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(crds::CHART_CRD_DIR)
}

#[test]
fn committed_crd_files_match_the_types() {
    let dir = crd_dir();
    let wanted = crds::rendered_files().expect("CRDs render");
    let mut drift = Vec::new();
    for (name, content) in &wanted {
        match fs::read_to_string(dir.join(name)) {
            Ok(committed) if committed == *content => {}
            Ok(_) => drift.push(format!("{name}: differs")),
            Err(e) => drift.push(format!("{name}: {e}")),
        }
    }
    // Generated files nobody produces any more are drift too.
    let wanted_names: BTreeMap<&str, ()> = wanted.iter().map(|(n, _)| (n.as_str(), ())).collect();
    for entry in fs::read_dir(&dir).expect("chart CRD dir exists") {
        let path = entry.expect("readable entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let generated = fs::read_to_string(&path).is_ok_and(|c| c.starts_with(crds::HEADER));
        if generated && !wanted_names.contains_key(name.as_str()) {
            drift.push(format!("{name}: stale"));
        }
    }
    assert!(
        drift.is_empty(),
        "CRD files in {} are out of date; run `cargo xtask crdgen`:\n{}",
        dir.display(),
        drift.join("\n")
    );
}

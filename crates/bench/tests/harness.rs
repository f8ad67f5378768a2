//! The benchmark harness end to end at tiny sizes (CI), so it cannot rot: every suite runs, the
//! JSON results and the SVG pictures are written and parse, and `compare` prints the change per
//! figure between two result files. No timing is asserted: tiny figures mean nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_capstan-bench");

/// The controller binaries the suites spawn live next to the harness (target/debug); build them
/// if this test runs before anything else built them.
fn bin_dir() -> PathBuf {
    let dir = Path::new(BENCH)
        .parent()
        .expect("binary folder")
        .to_path_buf();
    let needed = [
        "nodeslo-controller",
        "machineclass-controller",
        "gw-recycler",
        "gw-sidecar",
        "router-sidecar",
    ];
    if needed.iter().any(|bin| !dir.join(bin).exists()) {
        let status = Command::new(env!("CARGO"))
            .arg("build")
            .args(needed.iter().flat_map(|bin| ["--bin", *bin]))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .status()
            .expect("running cargo build");
        assert!(status.success(), "cargo build of the controllers: {status}");
    }
    dir
}

fn files_with_extension(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("out dir")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

#[test]
fn every_suite_runs_at_tiny_sizes_and_writes_json_and_svg_that_compare_reads() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(BENCH)
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out-dir")
        .arg(out.path())
        .args(["all", "--tiny"])
        .output()
        .expect("running capstan-bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");

    // One table with the columns, a progress line per suite.
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["figure", "value", "floor", "ratio", "target", "met"]),
        "{stdout}"
    );
    let suites = [
        "kube-sim",
        "nodeslo",
        "sharding",
        "machineclass",
        "sidecars",
        "recycler",
    ];
    for (index, suite) in suites.iter().enumerate() {
        assert!(
            stderr.contains(&format!("[{}/{}] {suite}", index + 1, suites.len())),
            "{stderr}"
        );
        assert!(
            stdout.contains(&format!("\n  {suite}: ")),
            "{suite}: {stdout}"
        );
    }

    // The JSON: {commit, rows: [{figure, value, unit, floor, ratio, target, met}]}.
    let json = files_with_extension(out.path(), "json");
    assert_eq!(json.len(), 1, "{json:?}");
    assert!(stdout.contains(&format!("results: {}", json[0].display())));
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json[0]).expect("read json")).expect("json");
    let commit = results["commit"].as_str().expect("commit");
    assert!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
    let rows = results["rows"].as_array().expect("rows");
    for row in rows {
        for key in ["figure", "value", "unit", "floor", "ratio", "target", "met"] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
    }
    let figure = |name: &str| {
        rows.iter()
            .find(|r| r["figure"] == name)
            .unwrap_or_else(|| panic!("no figure {name} in {rows:?}"))
    };
    let converge = figure("nodeslo: 20 nodes: converge (create all NodeSLOs)");
    assert!(converge["floor"].as_f64().expect("floor") > 0.0);
    assert_eq!(converge["target"], "<= 1.3x");
    assert!(converge["met"].is_boolean());
    figure("nodeslo: 10 nodes: controller peak RSS");
    // Sharding: RSS against one replica of the same mode, writes against the unsharded run.
    for mode in ["all Nodes watched", "--shard-node-labels"] {
        let rss = figure(&format!(
            "sharding: {mode}, 2 replicas: peak RSS per replica (largest)"
        ));
        assert!(rss["floor"].as_f64().expect("floor") > 0.0, "{rss}");
        assert_eq!(rss["unit"], "MiB", "{rss}");
        let writes = figure(&format!(
            "sharding: {mode}, 2 replicas: NodeSLO writes per node on create"
        ));
        assert_eq!(writes["floor"].as_f64(), Some(1.0), "{writes}");
        assert_eq!(writes["target"], "<= 1x", "{writes}");
        let takeover = figure(&format!(
            "sharding: {mode}, 2 replicas: takeover, a killed shard's NodeSLOs labelled to live shards"
        ));
        assert_eq!(takeover["floor"].as_f64(), Some(4.0), "{takeover}");
        assert!(takeover["met"].is_boolean(), "{takeover}");
    }
    figure("sharding: unsharded (--shards off): peak RSS");
    let mc_converge =
        figure("machineclass: 12 machines: converge (finalizers, all machines Running)");
    assert!(mc_converge["floor"].as_f64().expect("floor") > 0.0);
    // The floor's writes are counted by kube-sim, not assumed: 9 per machine, one per class
    // and one for the Secret, over 12 machines of 2 classes.
    let writes = figure("machineclass: 12 machines: writes per machine to Running");
    assert_eq!(
        writes["floor"].as_f64(),
        Some((12.0 * 9.0 + 2.0 + 1.0) / 12.0),
        "{writes}"
    );
    assert!(writes["value"].as_f64().expect("value") >= 9.0, "{writes}");
    // Reads are reported for both sides: the controller lists and watches, the floor reads nothing.
    let reads =
        figure("machineclass: 12 machines: reads (get, list, watch) per machine to Running");
    assert!(reads["value"].as_f64().expect("value") > 0.0, "{reads}");
    assert_eq!(reads["floor"].as_f64(), Some(0.0), "{reads}");
    figure("machineclass: 12 machines: GETs per machine to Running");

    let list = figure("kube-sim: list of 50");
    assert!(list["floor"].as_f64().expect("floor") > 0.0, "{list}");
    let create = figure("kube-sim: create (per request)");
    assert!(create["floor"].as_f64().expect("floor") > 0.0, "{create}");
    let memory = figure("kube-sim: resident memory per stored object");
    assert!(memory["value"].as_f64().expect("value") > 0.0, "{memory}");

    let get_status = figure("sidecars: memory GetStatus x4 req/s");
    assert!(
        get_status["value"].as_f64().expect("value") > 0.0,
        "{get_status}"
    );
    // Failed calls have their own row, apart from throughput; none fail here.
    let failed = figure("sidecars: memory failed calls");
    assert_eq!(failed["value"].as_f64(), Some(0.0), "{failed}");
    assert_eq!(failed["floor"].as_f64(), Some(0.0), "{failed}");
    assert_eq!(failed["target"], "= 0");
    assert_eq!(failed["met"], true);
    let recycle = figure("recycler: one recycle (median) vs its round trips");
    assert!(recycle["floor"].as_f64().expect("floor") > 0.0);
    assert_eq!(recycle["target"], "<= 2x");
    // The floor is the recycle's 19 round trips (8 hub writes, 3 SliceGateway status writes, the
    // gateway start, 4 router calls, 2 labels and the delete), each measured (none zero), summed.
    let parts: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| {
            r["figure"]
                .as_str()
                .is_some_and(|f| f.starts_with("recycler: floor part: "))
        })
        .map(|r| {
            let count = r["note"]
                .as_str()
                .and_then(|n| n.strip_prefix('x')?.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("count in {r}"));
            (count, r["value"].as_f64().expect("part value"))
        })
        .collect();
    assert_eq!(parts.len(), 9, "{parts:?}");
    assert_eq!(parts.iter().map(|(count, _)| count).sum::<f64>(), 19.0);
    assert!(parts.iter().all(|(_, took)| *took > 0.0), "{parts:?}");
    let sum: f64 = parts.iter().map(|(count, took)| count * took).sum();
    let floor = recycle["floor"].as_f64().expect("floor");
    assert!(
        (floor - sum).abs() <= 1e-6 * sum,
        "floor {floor} vs parts {sum}"
    );
    figure("recycler: 2 pairs recycled at once vs one recycle");
    // Every suite says how much CPU the hypervisor took meanwhile.
    for suite in [
        "kube-sim",
        "nodeslo",
        "sharding",
        "machineclass",
        "sidecars",
        "recycler",
    ] {
        let stolen = figure(&format!("{suite}: CPU stolen by the hypervisor"));
        assert_eq!(stolen["unit"], "%", "{stolen}");
        let percent = stolen["value"].as_f64().expect("percent");
        assert!((0.0..=100.0).contains(&percent), "{stolen}");
    }
    // The CPU bound of N at once: N times one recycle's CPU over the cores, in seconds; the
    // machine-wide CPU per recycle is counted in 10 ms ticks, so a tiny run may count none.
    let cpu_bound = figure("recycler: 2 pairs at once vs their CPU bound");
    assert!(
        cpu_bound["value"].as_f64().expect("time") > 0.0,
        "{cpu_bound}"
    );
    assert!(
        cpu_bound["floor"].as_f64().expect("bound") >= 0.0,
        "{cpu_bound}"
    );
    for alone_or_not in ["one alone", "2 at once"] {
        let cpu = figure(&format!(
            "recycler: CPU per recycle, every process ({alone_or_not})"
        ));
        assert_eq!(cpu["unit"], "s", "{cpu}");
        assert!(cpu["value"].as_f64().expect("cpu") >= 0.0, "{cpu}");
    }

    // An SVG per controller suite, named in the output, that parses as XML with drawn lines.
    let svgs = files_with_extension(out.path(), "svg");
    assert_eq!(svgs.len(), 3, "{svgs:?}");
    for svg in &svgs {
        assert!(stdout.contains(&format!("picture: {}", svg.display())));
        let text = std::fs::read_to_string(svg).expect("read svg");
        let doc = roxmltree::Document::parse(&text).expect("svg is XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        assert!(
            doc.descendants()
                .filter(|n| n.tag_name().name() == "polyline")
                .count()
                >= 4,
            "convergence and scaling (or RSS) lines in {}",
            svg.display()
        );
        let sharding = svg
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("sharding-"));
        let legend = if sharding {
            "goal: 0.35x of 1 replica"
        } else {
            "floor (bare client)"
        };
        assert!(text.contains(legend), "{}", svg.display());
    }

    // compare: an older file where the converge took twice as long.
    let mut old = results.clone();
    old["commit"] = "0".repeat(40).into();
    for row in old["rows"].as_array_mut().expect("rows") {
        if row["figure"] == "nodeslo: 20 nodes: converge (create all NodeSLOs)" {
            row["ratio"] = (row["ratio"].as_f64().expect("ratio") * 2.0).into();
        }
    }
    old["rows"].as_array_mut().expect("rows").push(
        serde_json::json!({"figure": "retired figure", "value": 1.0, "unit": "",
            "floor": null, "ratio": null, "target": null, "met": null}),
    );
    let old_path = out.path().join("old.json");
    std::fs::write(&old_path, serde_json::to_vec(&old).expect("json")).expect("write old");
    let compared = Command::new(BENCH)
        .arg("compare")
        .arg(&old_path)
        .arg(&json[0])
        .output()
        .expect("running capstan-bench compare");
    let text = String::from_utf8_lossy(&compared.stdout);
    assert!(compared.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("nodeslo: 20 nodes: converge"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("-50.0%"), "{line}");
    assert!(
        text.lines()
            .any(|l| l.contains("retired figure") && l.ends_with("gone")),
        "{text}"
    );
    assert!(
        text.contains(&format!("000000000000 -> {}", &commit[..12])),
        "{text}"
    );
}

//! `require` under the real test harness: this binary runs its own probe test as a child
//! process, once as CI does (`CAPSTAN_REQUIRE_ALL_TESTS=1`) and once as a developer does.

use std::process::{Command, Output};

use capstan_testkit::require::{REQUIRE_ALL_ENV, SKIP_LEDGER};
use capstan_testkit::{on_path, require};

/// Run only as a child of the tests below (it is ignored in a normal run).
#[test]
#[ignore = "a probe run by the other tests of this file"]
fn probe_needs_a_missing_program() {
    if !require(
        "capstan-no-such-program",
        on_path("capstan-no-such-program"),
    ) {
        return;
    }
    panic!("a missing program was reported as present");
}

fn run_probe(require_all: Option<&str>, ledger_dir: &std::path::Path) -> Output {
    // The child is a copy of this binary in its own directory, so its ledger is not the suite's.
    let exe = std::env::current_exe().expect("test binary");
    let copy = ledger_dir.join("probe");
    std::fs::copy(&exe, &copy).expect("copy test binary");
    let mut command = Command::new(&copy);
    command.args([
        "--exact",
        "probe_needs_a_missing_program",
        "--ignored",
        "--nocapture",
    ]);
    command.env_remove(REQUIRE_ALL_ENV);
    if let Some(value) = require_all {
        command.env(REQUIRE_ALL_ENV, value);
    }
    command.output().expect("probe runs")
}

#[test]
fn in_ci_a_missing_requirement_fails_the_test_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run_probe(Some("1"), dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "CAPSTAN_REQUIRE_ALL_TESTS=1 and test probe_needs_a_missing_program needs \
             capstan-no-such-program, which is missing: `capstan-no-such-program` is not on PATH"
        ),
        "{stderr}"
    );
    assert!(!dir.path().join(SKIP_LEDGER).exists());
}

#[test]
fn elsewhere_a_missing_requirement_is_a_visible_skip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run_probe(None, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = "SKIPPED: probe_needs_a_missing_program: needs capstan-no-such-program: \
                `capstan-no-such-program` is not on PATH";
    assert!(stderr.contains(line), "{stderr}");
    let ledger = std::fs::read_to_string(dir.path().join(SKIP_LEDGER)).expect("ledger written");
    assert_eq!(ledger, format!("{line}\n"));
}

//! Loud skips. A test that needs something the machine may lack (root, a program, a Python
//! module) asks [`require`] first: in CI (`CAPSTAN_REQUIRE_ALL_TESTS=1`) a missing need fails the
//! test naming it; on a developer's machine the test is skipped where a person sees it.
//!
//! Test harnesses hide a passing test's output (nextest and libtest both do), so a `SKIPPED:` line
//! on stderr alone is not seen. Every skip is therefore also appended to a ledger next to the test
//! binaries (`target/<profile>/capstan-skipped-tests.txt`), which `cargo xtask ci` empties before
//! the test run and prints after nextest's summary.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Set to `1` (CI does) to turn every skip into a failure.
pub const REQUIRE_ALL_ENV: &str = "CAPSTAN_REQUIRE_ALL_TESTS";

/// The ledger's file name, in the profile directory (`target/debug`).
pub const SKIP_LEDGER: &str = "capstan-skipped-tests.txt";

/// Whether the environment asks for every test to run (`CAPSTAN_REQUIRE_ALL_TESTS=1`).
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL_ENV).is_ok_and(|value| matches!(value.trim(), "1" | "true"))
}

/// `true` when `available` is `Ok`: the test goes on. Otherwise the calling test needs `what`
/// and the machine lacks it (`available` says why): under `CAPSTAN_REQUIRE_ALL_TESTS=1` this
/// panics naming `what`; without it, it reports the skip (stderr and the ledger) and returns
/// `false`, and the test returns at once.
///
/// ```no_run
/// # fn a_test() {
/// use capstan_testkit::{on_path, require};
/// if !require("kubectl", on_path("kubectl")) {
///     return;
/// }
/// # }
/// ```
#[must_use = "the test must return when its requirement is missing"]
pub fn require(what: &str, available: Result<(), String>) -> bool {
    let Err(reason) = available else {
        return true;
    };
    let test = current_test();
    if require_all() {
        panic!("{REQUIRE_ALL_ENV}=1 and test {test} needs {what}, which is missing: {reason}");
    }
    let line = skip_line(&test, what, &reason);
    eprintln!("{line} (set {REQUIRE_ALL_ENV}=1 to make this a failure)");
    if let Some(ledger) = ledger_path() {
        record(&ledger, &line);
    }
    false
}

/// [`require`] for a need already known to be missing: fails under `CAPSTAN_REQUIRE_ALL_TESTS=1`,
/// otherwise reports the skip; the caller returns.
pub fn skip_or_fail(what: &str, reason: String) {
    let _skipped = require(what, Err(reason));
}

/// The line a skip leaves on stderr and in the ledger.
pub fn skip_line(test: &str, what: &str, reason: &str) -> String {
    format!("SKIPPED: {test}: needs {what}: {reason}")
}

/// `Ok` when this process runs as root (effective uid 0).
pub fn root() -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|error| format!("cannot read /proc/self/status: {error}"))?;
    let euid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .ok_or("no effective uid in /proc/self/status")?;
    if euid == "0" {
        Ok(())
    } else {
        Err(format!("not running as root (effective uid {euid})"))
    }
}

/// `Ok` when an executable file named `program` is in a `PATH` directory.
pub fn on_path(program: &str) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| is_executable(&dir.join(program)));
    if found {
        Ok(())
    } else {
        Err(format!("`{program}` is not on PATH"))
    }
}

/// `Ok` when `python3` imports every module in `modules`.
pub fn python_modules(modules: &[&str]) -> Result<(), String> {
    on_path("python3")?;
    let import = format!("import {}", modules.join(", "));
    let out = std::process::Command::new("python3")
        .args(["-c", &import])
        .output()
        .map_err(|error| format!("python3 does not run: {error}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "python3 cannot `{import}` (pip install -r .ci/requirements.txt): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The ledger of the profile directory `profile_dir` (`target/debug`).
pub fn ledger_in(profile_dir: &Path) -> PathBuf {
    profile_dir.join(SKIP_LEDGER)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// libtest (and nextest through it) runs each test on a thread named after the test.
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("<unnamed test>")
        .to_owned()
}

/// The profile directory of the running test binary: `target/debug/deps/<test>` -> `target/debug`.
fn ledger_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let profile_dir = if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent()?
    } else {
        dir
    };
    Some(ledger_in(profile_dir))
}

/// Appends one line; `O_APPEND` keeps lines of concurrent test processes whole.
fn record(ledger: &Path, line: &str) {
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(error) = written {
        eprintln!("could not record the skip in {}: {error}", ledger.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_named() {
        assert_eq!(
            on_path("capstan-no-such-program"),
            Err("`capstan-no-such-program` is not on PATH".to_owned())
        );
        assert_eq!(on_path("sh"), Ok(()));
    }

    #[test]
    fn skips_are_appended_as_whole_lines() {
        let dir = std::env::temp_dir().join(format!("capstan-ledger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ledger = ledger_in(&dir);
        record(&ledger, &skip_line("a::b", "root", "not running as root"));
        record(
            &ledger,
            &skip_line("c", "kubectl", "`kubectl` is not on PATH"),
        );
        let text = std::fs::read_to_string(&ledger).expect("ledger");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(
            text,
            "SKIPPED: a::b: needs root: not running as root\n\
             SKIPPED: c: needs kubectl: `kubectl` is not on PATH\n"
        );
    }
}

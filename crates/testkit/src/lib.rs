//! The test kit every Capstan test suite shares, so that no suite keeps its own copy.
//!
//! Dev-only: no production crate depends on it (xtask and the benches may, for the small
//! non-test helpers such as installing the CRDs).

pub mod require;

pub use require::{REQUIRE_ALL_ENV, on_path, python_modules, require, root, skip_or_fail};

//! The test kit every Capstan test suite shares, so that no suite keeps its own copy: loud skips
//! ([`require`]), refused command lines ([`cli`]), polling ([`eventually`]), leader-election
//! Leases ([`lease`]), throw-away network namespaces ([`netns`]), binaries under test and their
//! process contract ([`process`]), Capstan's CRDs installed and Established ([`crds`]), object builders
//! ([`objects`], and a KubeSlice worker's in [`kubeslice`]) and an in-process OTLP trace
//! collector ([`otlp`]).
//!
//! Dev-only: no production crate depends on it (xtask and the benches use [`crds`] and
//! [`kubeslice`], the sidecar bench [`netns`]). It depends on neither kube-sim nor
//! capstan-runtime, so both can use it in their own tests without a dependency cycle.

pub mod cli;
pub mod crds;
pub mod eventually;
pub mod kubeslice;
pub mod lease;
pub mod netns;
pub mod objects;
pub mod otlp;
pub mod process;
pub mod require;

pub use crds::{install_capstan_crds, install_crds};
pub use eventually::{eventually, eventually_with};
pub use require::{REQUIRE_ALL_ENV, on_path, python_modules, require, root, skip_or_fail};

//! Helpers shared by the cross-component scenarios in this folder. Each scenario is a `[[test]]`
//! of this crate (see `Cargo.toml`); crate-local end-to-end tests stay in each crate's `tests/`.

// The crate root sits beside the scenarios, so its modules live in support/ (explicit paths).
#[path = "support/helm.rs"]
pub mod helm;
#[path = "support/journal.rs"]
pub mod journal;
#[path = "support/slice.rs"]
pub mod slice;
#[path = "support/tools.rs"]
pub mod tools;

//! Helpers shared by the cross-component scenarios in this folder. Each scenario is a `[[test]]`
//! of this crate (see `Cargo.toml`); crate-local end-to-end tests stay in each crate's `tests/`.

//! Compiles `proto/*.proto` with protox (pure Rust, ships the well-known
//! types) so the build needs no system `protoc`.

use std::path::PathBuf;

const PROTO_FILES: [&str; 3] = [
    "router_sidecar.proto",
    "gw_sidecar.proto",
    "machine_driver.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }
    let descriptors = protox::compile(PROTO_FILES, [&proto_dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

// mimalloc: glibc malloc showed as a large share of CPU in profiles (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    capstan_nodeslo_controller::main_with(Parser::parse()).await
}

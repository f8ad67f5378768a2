// mimalloc: glibc malloc showed as a large share of CPU in profiles (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    capstan_gw_recycler::main_with(capstan_gw_recycler::cli::Args::parse_checked()).await
}

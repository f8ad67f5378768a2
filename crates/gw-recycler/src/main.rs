use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    capstan_gw_recycler::main_with(Parser::parse()).await
}

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    capstan_nodeslo_controller::main_with(Parser::parse()).await
}

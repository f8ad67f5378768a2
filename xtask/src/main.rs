//! `cargo xtask <command>`: workspace automation. One module per subcommand; this file only
//! parses the command line and dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod chart;
mod ci;
mod crdgen;
mod demo;
mod demo_slice;
mod image;
mod paths;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Capstan workspace automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write every CRD as YAML into charts/capstan/crds (or check that the files are current).
    Crdgen(crdgen::Args),
    /// Run kube-sim with Capstan's CRDs and every controller against it (the README's first command).
    Demo(demo::Args),
    /// Build in release mode and run the benchmarks (all, or one: `cargo xtask bench nodeslo -- --sizes 1000,10000`); one table, JSON and SVG under target/bench.
    Bench(bench::Args),
    /// Build the container image (all binaries, FROM scratch, non-root) as an OCI archive under target/.
    Image(image::Args),
    /// Check the Helm chart with Helm's own library: lint, values schema, install/upgrade into kube-sim.
    Chart(chart::Args),
    /// Run every gate CI runs: fmt, CRD drift, chart lint, clippy, doctests, the test suite (with the demo smoke scenario).
    Ci,
}

pub use paths::{target_dir, workspace_root};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crdgen(args) => crdgen::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Ci => ci::run(),
        Command::Bench(args) => bench::run(&args),
        Command::Image(args) => image::run(&args),
        Command::Chart(args) => chart::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

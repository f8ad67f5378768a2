//! `capstan-bench`: benchmarks run by `cargo xtask bench [target]` in release mode.
//!
//! Every figure that depends on the machine is reported as a ratio against a baseline measured in
//! the same process on the same kube-sim (the "floor"), so results compare across machines and
//! nothing here asserts a wall-clock time. Every run prints one table, writes it as JSON (with the
//! commit) under `--out-dir`, and an SVG per controller suite next to it.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod cluster;
mod kube_sim;
mod machineclass;
mod machineset;
mod nodeslo;
mod plot;
mod programs;
mod recycler;
mod report;
mod results;
mod sharding;
mod sidecars;
mod table;

use report::Report;
use results::Results;

#[derive(Parser)]
#[command(
    name = "capstan-bench",
    about = "Capstan benchmarks (ratios against an in-run baseline)"
)]
struct Cli {
    /// Folder holding the release binaries under test.
    #[arg(long, global = true, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Where the results (JSON) and pictures (SVG) are written.
    #[arg(long, global = true, default_value = "target/bench")]
    out_dir: PathBuf,
    /// A previous results file: print the change per figure against this run.
    #[arg(long, global = true)]
    compare: Option<PathBuf>,
    #[command(subcommand)]
    target: Target,
}

#[derive(Subcommand)]
enum Target {
    /// Every suite with its default sizes (or tiny ones), in one table.
    All(AllArgs),
    /// machineclass-controller: classes finalized and machines Running against a bare client, writes per machine, peak RSS.
    Machineclass(machineclass::Args),
    /// machineset-controller: a roll of MachineDeployments, writes per replaced machine and time against floors, peak RSS.
    Machineset(machineset::Args),
    /// NodeSLO controller: convergence and config fan-out against a bare client, writes per node, peak RSS.
    Nodeslo(nodeslo::Args),
    /// nodeslo-controller sharded: peak RSS per replica with 1, 2, 4 replicas (all Nodes watched, or labelled), writes per node, takeover of a killed shard.
    Sharding(sharding::Args),
    /// kube-sim: creates/s, a list of 10,000 objects, watch fan-out under load, memory per object.
    KubeSim(kube_sim::Args),
    /// router-sidecar and gw-sidecar: requests/s and p50/p99 per method and stream count, as a ratio to an empty handler.
    Sidecars(sidecars::Args),
    /// gw-recycler: one recycle (drain delay 0) against its API and gRPC round trips, N pairs at once against one.
    Recycler(recycler::Args),
    /// Print the change per figure between two results files, without running anything.
    Compare { old: PathBuf, new: PathBuf },
    /// kube-sim's memory per object, in this fresh process (run by `kube-sim`; prints JSON).
    #[command(hide = true)]
    KubeSimMemory {
        #[arg(long)]
        objects: usize,
        #[arg(long)]
        concurrency: usize,
    },
}

#[derive(clap::Args)]
struct AllArgs {
    /// Tiny sizes and short cases: checks the harness end to end in seconds (CI); the figures
    /// mean nothing.
    #[arg(long)]
    tiny: bool,
}

/// Each suite's arguments for `all`: defaults, or tiny sizes (two sizes per controller suite, so
/// the scaling curve is drawn too).
const TINY: [(&str, &[&str]); 6] = [
    (
        "kube-sim",
        &[
            "--objects",
            "50",
            "--watchers",
            "2",
            "--write-rate",
            "100",
            "--seconds",
            "1",
        ],
    ),
    ("nodeslo", &["--sizes", "10,20", "--runs", "2"]),
    (
        "sharding",
        &["--nodes", "30", "--replicas", "1,2", "--kills", "1"],
    ),
    (
        "machineclass",
        &["--classes", "2", "--sizes", "6,12", "--runs", "2"],
    ),
    (
        "sidecars",
        &[
            "--seconds",
            "0.2",
            "--concurrency",
            "1,4",
            "--backends",
            "memory",
        ],
    ),
    (
        "recycler",
        &[
            "--pairs",
            "2",
            "--singles",
            "1",
            "--samples",
            "1",
            "--instances",
            "1",
        ],
    ),
];

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Warnings and errors of the code under test (servers, backends) on stderr, next to the
    // progress lines; RUST_LOG overrides.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    if let Target::Compare { old, new } = &cli.target {
        print!(
            "{}",
            results::compare(&Results::read(old)?, &Results::read(new)?)
        );
        return Ok(());
    }
    if let Target::KubeSimMemory {
        objects,
        concurrency,
    } = cli.target
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        return runtime.block_on(kube_sim::memory_probe(objects, concurrency));
    }
    // Read before running, so a wrong path fails in a second rather than after the run.
    let old = cli.compare.as_deref().map(Results::read).transpose()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let reports = runtime.block_on(run(&cli))?;
    let commit = results::head_commit();
    let short: String = commit.chars().take(12).collect();

    let mut rows = Vec::new();
    let mut pictures = Vec::new();
    for (suite, mut report) in reports {
        if !report.convergence.is_empty() || report.chart.is_some() {
            std::fs::create_dir_all(&cli.out_dir)
                .with_context(|| format!("creating {}", cli.out_dir.display()))?;
            let path = cli.out_dir.join(format!("{suite}-{short}.svg"));
            plot::write_svg(&report, &path)?;
            pictures.push(path);
        }
        report.prefix_figures(&format!("{suite}: "));
        rows.append(&mut report.rows);
    }
    let name = match &cli.target {
        Target::All(_) => "all",
        Target::Machineclass(_) => "machineclass",
        Target::Machineset(_) => "machineset",
        Target::Nodeslo(_) => "nodeslo",
        Target::Sharding(_) => "sharding",
        Target::KubeSim(_) => "kube-sim",
        Target::Sidecars(_) => "sidecars",
        Target::Recycler(_) => "recycler",
        Target::Compare { .. } | Target::KubeSimMemory { .. } => unreachable!("handled above"),
    };
    let new = Results { commit, rows };
    let mut table = String::new();
    table::write(&mut table, &new.rows)?;
    println!("\ncapstan-bench {name} at {short}\n{table}");
    let json = new.write(&cli.out_dir, name)?;
    println!("results: {}", json.display());
    for picture in &pictures {
        println!("picture: {}", picture.display());
    }
    if let Some(old) = old {
        print!("{}", results::compare(&old, &new));
    }
    Ok(())
}

/// Runs the chosen suites, each announced on stderr, and returns their reports by suite name.
async fn run(cli: &Cli) -> Result<Vec<(&'static str, Report)>> {
    let bin_dir = cli.bin_dir.as_path();
    let mut reports = Vec::new();
    match &cli.target {
        Target::All(all) => {
            for (index, (suite, tiny)) in TINY.iter().enumerate() {
                eprintln!("[{}/{}] {suite}", index + 1, TINY.len());
                let argv: &[&str] = if all.tiny { tiny } else { &[] };
                let report = with_stolen_cpu(run_suite(bin_dir, suite, argv))
                    .await
                    .with_context(|| format!("suite {suite}"))?;
                reports.push((*suite, report));
            }
        }
        Target::Machineclass(args) => reports.push((
            "machineclass",
            with_stolen_cpu(machineclass::run(bin_dir, args)).await?,
        )),
        Target::Machineset(args) => reports.push((
            "machineset",
            with_stolen_cpu(machineset::run(bin_dir, args)).await?,
        )),
        Target::Nodeslo(args) => reports.push((
            "nodeslo",
            with_stolen_cpu(nodeslo::run(bin_dir, args)).await?,
        )),
        Target::Sharding(args) => reports.push((
            "sharding",
            with_stolen_cpu(sharding::run(bin_dir, args)).await?,
        )),
        Target::KubeSim(args) => {
            reports.push(("kube-sim", with_stolen_cpu(kube_sim::run(args)).await?))
        }
        Target::Sidecars(args) => {
            reports.push(("sidecars", with_stolen_cpu(sidecars::run(args)).await?))
        }
        Target::Recycler(args) => reports.push((
            "recycler",
            with_stolen_cpu(recycler::run(bin_dir, args)).await?,
        )),
        Target::Compare { .. } | Target::KubeSimMemory { .. } => {}
    }
    Ok(reports)
}

/// Runs a suite and adds a row with the share of the machine's CPU time the hypervisor took for
/// other guests meanwhile: on a shared virtual machine it slows the floor and the subject
/// unevenly, so a suite whose share is high says its ratios are less sure.
async fn with_stolen_cpu(suite: impl Future<Output = Result<Report>>) -> Result<Report> {
    let before = cluster::MachineCpu::now()?;
    let mut report = suite.await?;
    let spent = cluster::MachineCpu::now()?.since(&before);
    report.row(
        "CPU stolen by the hypervisor",
        format!("{:.1} %", spent.stolen_percent()),
        format!(
            "of {:.0?} of CPU time over every core during the suite (/proc/stat); above a few \
             percent the ratios move with it",
            spent.total
        ),
    );
    Ok(report)
}

async fn run_suite(bin_dir: &Path, suite: &str, argv: &[&str]) -> Result<Report> {
    match suite {
        "kube-sim" => kube_sim::run(&suite_args(argv)?).await,
        "nodeslo" => nodeslo::run(bin_dir, &suite_args(argv)?).await,
        "sharding" => sharding::run(bin_dir, &suite_args(argv)?).await,
        "machineclass" => machineclass::run(bin_dir, &suite_args(argv)?).await,
        "machineset" => machineset::run(bin_dir, &suite_args(argv)?).await,
        "sidecars" => sidecars::run(&suite_args(argv)?).await,
        "recycler" => recycler::run(bin_dir, &suite_args(argv)?).await,
        other => anyhow::bail!("unknown suite {other}"),
    }
}

/// A suite's arguments parsed from `argv` as its own subcommand would (so `all` uses the same
/// defaults as `capstan-bench <suite>`).
fn suite_args<T: clap::Args + clap::FromArgMatches>(argv: &[&str]) -> Result<T> {
    let command = T::augment_args(clap::Command::new("suite").no_binary_name(true));
    let matches = command.try_get_matches_from(argv)?;
    Ok(T::from_arg_matches(&matches)?)
}

//! The subcommands of `rpc-bench`.

mod compare;
mod counts;
mod doctor;
mod exec;
mod plan;
mod server;
mod smoke;

pub use exec::{execute, Group, Outcome, ServerSpec};
pub use plan::{listen_address, run_groups, sweep_groups};

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{Cli, Cmd, OutputArgs};
use crate::env::Environment;
use crate::report::{self, Report};
use crate::BenchError;

/// Runs a parsed command line on the current runtime.
pub async fn dispatch(cli: Cli) -> Result<(), BenchError> {
    match cli.cmd {
        Cmd::Server(a) => server::serve(a).await,
        Cmd::Run(a) => {
            let groups = run_groups(&a)?;
            let location = exec::location_label(&groups);
            let env = Environment::capture(&a.placement, &a.proto, &location);
            finish(&a.output, "run", env, execute(&groups, &a.placement, &a.proto).await?)
        }
        Cmd::Sweep(a) => {
            let groups = sweep_groups(&a)?;
            let location = exec::location_label(&groups);
            let env = Environment::capture(&a.placement, &a.proto, &location);
            finish(&a.output, "sweep", env, execute(&groups, &a.placement, &a.proto).await?)
        }
        Cmd::Compare(a) => compare::compare(a).await,
        Cmd::Counts(a) => counts::counts(a).await,
        Cmd::Smoke(a) => smoke::smoke(a).await,
        Cmd::Doctor(a) => doctor::doctor(a),
    }
}

/// Prints the counters, writes JSON/CSV/plots, and prints where they went.
fn finish(
    output: &OutputArgs,
    default_name: &str,
    env: Environment,
    outcome: Outcome,
) -> Result<(), BenchError> {
    let report = Report { environment: env, points: outcome.points, servers: outcome.servers };
    report::print_counters(&mut std::io::stdout().lock(), &report.servers)?;
    let files = write_outputs(output, default_name, &report)?;
    println!();
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// Writes the report's files and (unless disabled) its plots.
pub fn write_outputs(
    output: &OutputArgs,
    default_name: &str,
    report: &Report,
) -> Result<Vec<PathBuf>, BenchError> {
    let prefix = output.name.clone().unwrap_or_else(|| default_name.to_string());
    let mut files = report::write_files(&output.out, &prefix, report)?;
    if !output.no_plots {
        files.extend(crate::plot::draw_all(&output.out, &prefix, &report.points)?);
    }
    Ok(files)
}

/// A progress bar over `n` points, hidden when stdout is not a terminal.
pub fn progress(n: u64) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} points {elapsed} {msg}") {
        bar.set_style(style);
    }
    bar
}

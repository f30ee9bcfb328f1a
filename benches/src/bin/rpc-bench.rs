//! `rpc-bench`: perftest-style RPC benchmarks. See BENCHMARKS.md at the repository root.

use std::process::ExitCode;

use benches::cli::{Affinity, Cli};
use benches::env::{pin_to, runtime, unpin, BUSY_POLL_ENV};
use clap::Parser;

/// With `count-allocs`, allocations are counted (for `rpc-bench counts`).
#[cfg(feature = "count-allocs")]
#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let (affinity, threads, busy_poll) = cli.process_setup();
    if let Some(us) = busy_poll {
        // Before any thread exists: the child server processes inherit it too.
        std::env::set_var(BUSY_POLL_ENV, us.to_string());
    }
    // Pin before the runtime starts: every thread it creates inherits the affinity.
    let pinned = match affinity {
        Affinity::Pin(cpu) => pin_to(cpu),
        Affinity::Unpin => unpin(),
        Affinity::Inherit => Ok(()),
    };
    if let Err(e) = pinned {
        eprintln!("rpc-bench: {e}");
        return ExitCode::FAILURE;
    }
    let rt = match runtime(threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rpc-bench: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(benches::commands::dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpc-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

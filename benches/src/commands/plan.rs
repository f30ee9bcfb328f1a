//! Turning command lines into groups of points.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::exec::{Group, ServerSpec};
use crate::cli::{LoadArgs, RunArgs, SweepArgs};
use crate::load::{Budget, Concurrency, PointSpec};
use crate::target::System;
use crate::workload::{parse_size, parse_sizes, Workload};
use crate::BenchError;

static MEM_NAMES: AtomicUsize = AtomicUsize::new(0);

/// Expands the shorthands `tcp` and `mem`; other strings are addresses as given.
pub fn listen_address(s: &str) -> String {
    match s {
        "tcp" => "tcp://127.0.0.1:0".to_string(),
        "mem" => {
            format!("mem://rpc-bench-{}-{}", std::process::id(), MEM_NAMES.fetch_add(1, Ordering::Relaxed))
        }
        other => other.to_string(),
    }
}

/// A server spec for `listen`: mem is always in-process (it cannot cross processes).
fn server_for(listen: &str, in_process: bool) -> ServerSpec {
    let addr = listen_address(listen);
    if in_process || addr.starts_with("mem://") {
        ServerSpec::InProcess(addr)
    } else {
        ServerSpec::Child(addr)
    }
}

/// Warm-up and measured budgets for one size.
fn budgets(load: &LoadArgs, size: usize) -> Result<(Budget, Budget), BenchError> {
    if let Some(secs) = load.duration {
        if !(secs.is_finite() && secs > 0.0) {
            return Err(BenchError::Usage("--duration must be a positive number of seconds".into()));
        }
        let d = Duration::from_secs_f64(secs);
        return Ok((Budget::Time(d / 5), Budget::Time(d)));
    }
    let max_bytes = parse_size(&load.max_bytes).map_err(BenchError::Usage)?;
    let calls = (max_bytes / size.max(1)).max(20) as u64;
    let calls = calls.min(load.iters.max(1));
    let warmup = load.warmup.unwrap_or((calls / 10).clamp(1, 1000));
    Ok((Budget::Calls(warmup), Budget::Calls(calls)))
}

/// The points of one workload description, sizes varying fastest.
pub fn load_points(load: &LoadArgs) -> Result<Vec<PointSpec>, BenchError> {
    let sizes = parse_sizes(&load.sizes, load.step).map_err(BenchError::Usage)?;
    let mut points = Vec::new();
    for &workload in &load.workload {
        for &outstanding in &load.outstanding {
            for &size in &sizes {
                let (warmup, budget) = budgets(load, size)?;
                let concurrency = Concurrency {
                    connections: load.connections.max(1),
                    tasks: load.tasks.max(1),
                    outstanding: outstanding.max(1),
                };
                points.push(PointSpec { workload, size, concurrency, warmup, budget });
            }
        }
    }
    Ok(points)
}

/// The groups of `rpc-bench run`.
pub fn run_groups(a: &RunArgs) -> Result<Vec<Group>, BenchError> {
    let points = load_points(&a.load)?;
    if let Some(addr) = &a.connect {
        return Ok(vec![Group { system: a.system, server: ServerSpec::Remote(addr.clone()), points }]);
    }
    let listens = if a.listen.is_empty() { vec!["tcp".to_string()] } else { a.listen.clone() };
    Ok(listens
        .iter()
        .map(|l| Group { system: a.system, server: server_for(l, a.in_process), points: points.clone() })
        .collect())
}

fn timed(workload: Workload, size: usize, outstanding: usize, secs: f64) -> PointSpec {
    let d = Duration::from_secs_f64(secs.max(0.01));
    PointSpec {
        workload,
        size,
        concurrency: Concurrency { outstanding, ..Concurrency::SERIAL },
        warmup: Budget::Time(d / 5),
        budget: Budget::Time(d),
    }
}

/// The groups of `rpc-bench sweep`: per transport, an echo size sweep, upload and download
/// at a rendezvous size, and throughput against outstanding calls at 32 B.
pub fn sweep_groups(a: &SweepArgs) -> Result<Vec<Group>, BenchError> {
    if !(a.duration.is_finite() && a.duration > 0.0) {
        return Err(BenchError::Usage("--duration must be a positive number of seconds".into()));
    }
    let sizes =
        if a.full { parse_sizes("8:64M", 2) } else { parse_sizes("8:4M", 4) }.map_err(BenchError::Usage)?;
    let mut points: Vec<PointSpec> = sizes.iter().map(|&s| timed(Workload::Echo, s, 1, a.duration)).collect();
    for workload in [Workload::Upload, Workload::Download] {
        for size in [64 << 10, 1 << 20] {
            points.push(timed(workload, size, 1, a.duration));
        }
    }
    for outstanding in [2, 4, 8, 16, 32, 64] {
        points.push(timed(Workload::Echo, 32, outstanding, a.duration));
    }
    Ok(a.transports
        .iter()
        .map(|t| Group { system: System::RpcCore, server: server_for(t, false), points: points.clone() })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn run(args: &[&str]) -> RunArgs {
        let cli = crate::cli::Cli::try_parse_from(std::iter::once("rpc-bench").chain(args.iter().copied()))
            .unwrap();
        match cli.cmd {
            crate::cli::Cmd::Run(a) => a,
            other => panic!("not run: {other:?}"),
        }
    }

    #[test]
    fn mem_is_in_process_and_tcp_a_child_by_default() {
        let groups =
            run_groups(&run(&["run", "--listen", "tcp", "--listen", "mem", "--sizes", "32"])).unwrap();
        assert!(matches!(&groups[0].server, ServerSpec::Child(a) if a == "tcp://127.0.0.1:0"));
        assert!(matches!(&groups[1].server, ServerSpec::InProcess(a) if a.starts_with("mem://")));
        let groups = run_groups(&run(&["run", "--in-process", "--sizes", "32"])).unwrap();
        assert!(matches!(&groups[0].server, ServerSpec::InProcess(_)));
    }

    #[test]
    fn connect_is_client_mode() {
        let groups =
            run_groups(&run(&["run", "--connect", "rdma://10.0.0.1:7471", "--sizes", "32"])).unwrap();
        assert!(matches!(&groups[0].server, ServerSpec::Remote(a) if a == "rdma://10.0.0.1:7471"));
    }

    #[test]
    fn large_sizes_get_fewer_calls_and_points_cover_the_product() {
        let a = run(&[
            "run",
            "--sizes",
            "8,64M",
            "--outstanding",
            "1,4",
            "--workload",
            "echo,upload",
            "--iters",
            "500",
        ]);
        let points = load_points(&a.load).unwrap();
        assert_eq!(points.len(), 2 * 2 * 2);
        assert_eq!(points[0].budget, Budget::Calls(500));
        assert_eq!(points[1].budget, Budget::Calls(20));
        assert_eq!(points[2].concurrency.outstanding, 4);
        assert_eq!(points[4].workload, Workload::Upload);
    }

    #[test]
    fn duration_replaces_the_call_count() {
        let a = run(&["run", "--sizes", "32", "--duration", "0.5"]);
        let points = load_points(&a.load).unwrap();
        assert_eq!(points[0].budget, Budget::Time(Duration::from_millis(500)));
        assert_eq!(points[0].warmup, Budget::Time(Duration::from_millis(100)));
        assert!(load_points(&run(&["run", "--duration", "0"]).load).is_err());
    }
}

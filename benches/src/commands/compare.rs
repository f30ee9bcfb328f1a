//! `rpc-bench compare`: rpc-core, tarpc and a raw TCP ping-pong on the same workloads over TCP
//! loopback, servers in child processes, in one run, with the ratios printed. By default both
//! processes are pinned to CPU 0 with current-thread runtimes (the reference setup).
//!
//! The ratios are paired: each run measures every system on a workload one after the other
//! (seconds apart), and a run's ratio compares those neighbours. A shared machine drifts by
//! tens of percent over a minute, much more than over the seconds of one run, so the median of
//! the runs' ratios (printed with their range) is a steadier figure than the ratio of the
//! medians (the table's value columns), which pairs measurements taken far apart. Each run
//! starts with the next system in turn, so that none is always measured first.

use std::time::Duration;

use serde::Serialize;

use crate::cli::CompareArgs;
use crate::env::{Environment, Placement};
use crate::load::{Budget, Concurrency, PointSpec};
use crate::report::{Point, Report};
use crate::server_proc::{ServerCommand, ServerProcess};
use crate::target::System;
use crate::workload::Workload;
use crate::BenchError;

use super::exec::measure_point;

/// One compared figure.
#[derive(Debug, Clone, Copy)]
struct Metric {
    name: &'static str,
    size: usize,
    outstanding: usize,
    pick: fn(&Point) -> Option<f64>,
    lower_is_better: bool,
}

const METRICS: [Metric; 7] = [
    Metric {
        name: "32 B echo p50 [us]",
        size: 32,
        outstanding: 1,
        pick: |p| Some(p.latency_us.p50),
        lower_is_better: true,
    },
    // The same calls' fastest: what one call's path costs with no wait for the scheduler. On
    // two processes sharing a CPU the p50 also holds how the two are scheduled, which can flip
    // between runs of the same binary (BENCHMARKS.md, session 32); the minimum does not.
    Metric {
        name: "32 B echo min [us]",
        size: 32,
        outstanding: 1,
        pick: |p| Some(p.latency_us.min),
        lower_is_better: true,
    },
    // What a call costs the machine: CPU time per call, the client's process and the server's
    // together, read from the same calls as the p50 (see `crate::cpu`). With both processes on
    // one CPU a round trip is about the sum of their work, so this tracks the p50 without the
    // scheduling that moves it between runs.
    Metric {
        name: "32 B echo CPU/call c+s [us]",
        size: 32,
        outstanding: 1,
        pick: |p| p.cpu_us_per_call.and_then(|c| c.total_us()),
        lower_is_better: true,
    },
    Metric {
        name: "32 B echo, 64 outstanding [calls/s]",
        size: 32,
        outstanding: 64,
        pick: |p| Some(p.calls_per_sec),
        lower_is_better: false,
    },
    Metric {
        name: "32 B, 64 outst., CPU/call c+s [us]",
        size: 32,
        outstanding: 64,
        pick: |p| p.cpu_us_per_call.and_then(|c| c.total_us()),
        lower_is_better: true,
    },
    Metric {
        name: "1 MiB echo [GB/s]",
        size: 1 << 20,
        outstanding: 1,
        pick: |p| Some(p.gb_per_sec),
        lower_is_better: false,
    },
    Metric {
        name: "16 MiB echo [GB/s]",
        size: 16 << 20,
        outstanding: 1,
        pick: |p| Some(p.gb_per_sec),
        lower_is_better: false,
    },
];

const SYSTEMS: [System; 3] = [System::RpcCore, System::Tarpc, System::RawTcp];

/// The raw ping-pong runs one call at a time per connection: no pipelined figure for it.
fn applies(system: System, m: &Metric) -> bool {
    !(system == System::RawTcp && m.outstanding > 1)
}

/// The medians of one run.
#[derive(Debug, Clone, Serialize)]
struct Row {
    metric: &'static str,
    lower_is_better: bool,
    /// Median per system, in [`SYSTEMS`] order (`None`: not measured).
    medians: Vec<Option<f64>>,
    /// rpc-core's advantage over tarpc (> 1: rpc-core better): the median of the runs' ratios.
    rpc_core_vs_tarpc: Option<f64>,
    /// The smallest and largest of the runs' ratios over tarpc.
    rpc_core_vs_tarpc_range: Option<(f64, f64)>,
    /// rpc-core's advantage over raw TCP (> 1: rpc-core better): the median of the runs' ratios.
    rpc_core_vs_raw_tcp: Option<f64>,
    /// The smallest and largest of the runs' ratios over raw TCP.
    rpc_core_vs_raw_tcp_range: Option<(f64, f64)>,
    /// Raw TCP's advantage over tarpc, the same way: what rpc-core's ratio to tarpc would be if
    /// it matched the raw ping-pong (a goal above it asks rpc-core to beat raw TCP).
    raw_tcp_vs_tarpc: Option<f64>,
    /// The smallest and largest of the runs' ratios of raw TCP over tarpc.
    raw_tcp_vs_tarpc_range: Option<(f64, f64)>,
}

/// The advantage of the system at `base` over the one at `other` in each run where both were
/// measured (`runs[r][s]`: run `r`'s figure of system `s`), then their median and range.
fn paired(
    runs: &[Vec<Option<f64>>],
    base: usize,
    other: usize,
    lower_is_better: bool,
) -> (Option<f64>, Option<(f64, f64)>) {
    let ratios: Vec<f64> =
        runs.iter().filter_map(|run| advantage(run[base], run[other], lower_is_better)).collect();
    let range = ratios
        .iter()
        .copied()
        .fold(None, |acc: Option<(f64, f64)>, x| Some(acc.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x)))));
    (median(ratios), range)
}

/// The earlier metric whose measurement metric `m` reads too (the same workload and load): it is
/// taken from that point rather than measured again.
fn shares_point(m: usize) -> Option<usize> {
    let (size, outstanding) = (METRICS[m].size, METRICS[m].outstanding);
    METRICS[..m].iter().position(|e| e.size == size && e.outstanding == outstanding)
}

/// The order run `run` measures the systems in: each run starts with the next one.
fn order(run: usize) -> impl Iterator<Item = usize> {
    (0..SYSTEMS.len()).map(move |k| (k + run) % SYSTEMS.len())
}

#[derive(Debug, Serialize)]
struct CompareReport {
    #[serde(flatten)]
    report: Report,
    repeat: usize,
    rows: Vec<Row>,
    mem_floor: MemFloor,
}

/// In-process `mem` echo of [`FLOOR_SIZE`] against the floor of moving it: two memcpys.
#[derive(Debug, Clone, Copy, Serialize)]
struct MemFloor {
    size: usize,
    /// Median over runs of the echo's p50, in microseconds.
    echo_p50_us: f64,
    /// Median of two 16 MiB memcpys (to a buffer and back), in microseconds.
    two_memcpy_us: f64,
    /// `echo_p50_us / two_memcpy_us` (the goal is at most 2).
    ratio: f64,
}

const FLOOR_SIZE: usize = 16 << 20;

/// Times two memcpys of `size` bytes (there and back, like an echo's payload), `iters` times;
/// returns the median in microseconds. Buffers are written first, so no page fault is timed.
fn two_memcpys_us(size: usize, iters: usize) -> f64 {
    let mut a = vec![1u8; size];
    let mut b = vec![2u8; size];
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters {
        let start = std::time::Instant::now();
        b.copy_from_slice(std::hint::black_box(&a));
        a.copy_from_slice(std::hint::black_box(&b));
        times.push(start.elapsed().as_secs_f64() * 1e6);
        a[i % size] = i as u8;
    }
    median(times).unwrap_or(f64::NAN)
}

/// The in-process `mem` echo of 16 MiB next to its floor, measured in this run.
async fn mem_floor(a: &CompareArgs, runs: usize) -> Result<MemFloor, BenchError> {
    let listen = super::listen_address("mem");
    let server = crate::peers::RunningServer::start(System::RpcCore, &listen, &a.proto).await?;
    let metric = Metric {
        name: "16 MiB echo over mem",
        size: FLOOR_SIZE,
        outstanding: 1,
        pick: |p| Some(p.latency_us.p50),
        lower_is_better: true,
    };
    let mut echo = Vec::new();
    let mut copies = Vec::new();
    for _ in 0..runs {
        let spec = spec(&metric, a.duration);
        let measured = measure_point(System::RpcCore, &server.local_addr(), &a.proto, &spec, None).await?;
        echo.extend((metric.pick)(&Point::new(System::RpcCore, "mem", &spec, &measured)));
        copies.push(two_memcpys_us(FLOOR_SIZE, 20));
    }
    server.stop().await;
    let (echo_p50_us, two_memcpy_us) = (median(echo).unwrap_or(f64::NAN), median(copies).unwrap_or(f64::NAN));
    let floor = MemFloor { size: FLOOR_SIZE, echo_p50_us, two_memcpy_us, ratio: echo_p50_us / two_memcpy_us };
    println!(
        "\n# in-process mem echo of 16 MiB vs its floor (medians of {runs} run(s))\n\
         {:<36} {:>12.0} us\n{:<36} {:>12.0} us\n{:<36} {:>15.2}x  (goal <= 2)",
        "16 MiB echo over mem, p50",
        floor.echo_p50_us,
        "2 x memcpy of 16 MiB",
        floor.two_memcpy_us,
        "echo / floor",
        floor.ratio
    );
    Ok(floor)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

fn advantage(rpc: Option<f64>, other: Option<f64>, lower_is_better: bool) -> Option<f64> {
    let (r, o) = (rpc?, other?);
    let ratio = if lower_is_better { o / r } else { r / o };
    ratio.is_finite().then_some(ratio)
}

fn spec(m: &Metric, secs: f64) -> PointSpec {
    let d = Duration::from_secs_f64(secs.max(0.05));
    PointSpec {
        workload: Workload::Echo,
        size: m.size,
        concurrency: Concurrency { outstanding: m.outstanding, ..Concurrency::SERIAL },
        warmup: Budget::Time(d / 4),
        budget: Budget::Time(d),
    }
}

fn fmt(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x >= 1000.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.3}"),
    }
}

pub(super) async fn compare(a: CompareArgs) -> Result<(), BenchError> {
    let placement = Placement {
        client_cpu: (!a.unpinned).then_some(a.client_cpu),
        server_cpu: (!a.unpinned).then_some(a.server_cpu),
        threads: a.threads.max(1),
        busy_poll_us: None,
    };
    let env = Environment::capture(&placement, &a.proto, "child process");
    println!("{}", env.summary());
    let mut servers = Vec::new();
    for system in SYSTEMS {
        let cmd = ServerCommand {
            system,
            listen: "tcp://127.0.0.1:0".into(),
            settings: a.proto,
            cpu: placement.server_cpu,
            threads: placement.threads,
        };
        servers.push(ServerProcess::spawn(&cmd)?);
    }
    let runs = a.repeat.max(1);
    let measured_metrics = (0..METRICS.len()).filter(|&m| shares_point(m).is_none()).count();
    let bar = super::progress((runs * SYSTEMS.len() * measured_metrics) as u64);
    let mut points: Vec<Point> = Vec::new();
    // values[run][m][s]: run `run`'s figure of system `s` on metric `m`.
    let mut values = vec![vec![vec![None; SYSTEMS.len()]; METRICS.len()]; runs];
    for (run, per_metric) in values.iter_mut().enumerate() {
        // at[m][s]: where this run's point of system `s` for metric `m` is in `points`.
        let mut at = vec![vec![None; SYSTEMS.len()]; METRICS.len()];
        for (m, metric) in METRICS.iter().enumerate() {
            if let Some(first) = shares_point(m) {
                for s in 0..SYSTEMS.len() {
                    let point = at[first][s].map(|i: usize| &points[i]);
                    per_metric[m][s] = point.and_then(metric.pick);
                }
                continue;
            }
            for s in order(run) {
                let system = SYSTEMS[s];
                bar.inc(1);
                if !applies(system, metric) {
                    continue;
                }
                bar.set_message(format!("{} {}", system.name(), metric.name));
                let spec = spec(metric, a.duration);
                let measured =
                    measure_point(system, servers[s].addr(), &a.proto, &spec, Some(servers[s].id())).await?;
                let point = Point::new(system, "tcp", &spec, &measured);
                per_metric[m][s] = (metric.pick)(&point);
                at[m][s] = Some(points.len());
                points.push(point);
            }
        }
    }
    bar.finish_and_clear();
    for server in servers {
        server.stop()?;
    }
    let rows: Vec<Row> = METRICS
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let per_run: Vec<Vec<Option<f64>>> = values.iter().map(|run| run[i].clone()).collect();
            let medians: Vec<Option<f64>> = (0..SYSTEMS.len())
                .map(|s| median(per_run.iter().filter_map(|run| run[s]).collect()))
                .collect();
            let (vs_tarpc, vs_tarpc_range) = paired(&per_run, 0, 1, m.lower_is_better);
            let (vs_raw, vs_raw_range) = paired(&per_run, 0, 2, m.lower_is_better);
            let (raw_vs_tarpc, raw_vs_tarpc_range) = paired(&per_run, 2, 1, m.lower_is_better);
            Row {
                metric: m.name,
                lower_is_better: m.lower_is_better,
                medians,
                rpc_core_vs_tarpc: vs_tarpc,
                rpc_core_vs_tarpc_range: vs_tarpc_range,
                rpc_core_vs_raw_tcp: vs_raw,
                rpc_core_vs_raw_tcp_range: vs_raw_range,
                raw_tcp_vs_tarpc: raw_vs_tarpc,
                raw_tcp_vs_tarpc_range: raw_vs_tarpc_range,
            }
        })
        .collect();
    print_rows(&rows, runs);
    let floor = mem_floor(&a, runs).await?;
    let report = CompareReport {
        report: Report { environment: env, points, servers: Vec::new() },
        repeat: runs,
        rows,
        mem_floor: floor,
    };
    let out = &a.output.out;
    std::fs::create_dir_all(out).map_err(|e| BenchError::output(out, e))?;
    let path = out.join(format!("{}.json", a.output.name.as_deref().unwrap_or("compare")));
    let text = serde_json::to_string_pretty(&report).map_err(|e| BenchError::output(&path, e))?;
    std::fs::write(&path, text).map_err(|e| BenchError::output(&path, e))?;
    println!("\nwrote {}", path.display());
    Ok(())
}

fn print_rows(rows: &[Row], runs: usize) {
    println!(
        "\n# medians of {runs} run(s); advantage = how many times better rpc-core is (> 1: rpc-core better),"
    );
    println!(
        "# the median of the runs' ratios (each run measures the systems seconds apart) and their range;"
    );
    println!("# raw-tcp vs tarpc: where rpc-core's ratio to tarpc would be if it matched the raw ping-pong");
    println!(
        "{:<36} {:>12} {:>12} {:>12} {:>22} {:>22} {:>22}",
        "metric", "rpc-core", "tarpc", "raw-tcp", "vs tarpc", "vs raw-tcp", "raw-tcp vs tarpc"
    );
    for r in rows {
        println!(
            "{:<36} {:>12} {:>12} {:>12} {:>22} {:>22} {:>22}",
            r.metric,
            fmt(r.medians[0]),
            fmt(r.medians[1]),
            fmt(r.medians[2]),
            fmt_advantage(r.rpc_core_vs_tarpc, r.rpc_core_vs_tarpc_range),
            fmt_advantage(r.rpc_core_vs_raw_tcp, r.rpc_core_vs_raw_tcp_range),
            fmt_advantage(r.raw_tcp_vs_tarpc, r.raw_tcp_vs_tarpc_range),
        );
    }
}

/// `1.25x (1.10-1.40)`: the median ratio and the range of the runs' ratios.
fn fmt_advantage(median: Option<f64>, range: Option<(f64, f64)>) -> String {
    match (median, range) {
        (Some(m), Some((lo, hi))) if lo < hi => format!("{m:.2}x ({lo:.2}-{hi:.2})"),
        (Some(m), _) => format!("{m:.2}x"),
        (None, _) => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantage_reads_the_right_way_round() {
        assert_eq!(advantage(Some(10.0), Some(20.0), true), Some(2.0));
        assert_eq!(advantage(Some(20.0), Some(10.0), false), Some(2.0));
        assert_eq!(advantage(None, Some(1.0), false), None);
        assert_eq!(advantage(Some(0.0), Some(1.0), true), None);
    }

    #[test]
    fn ratios_pair_the_systems_of_each_run() {
        // Run 1 is slow for everyone (the machine drifted): its ratio is still 2.
        let runs = vec![
            vec![Some(10.0), Some(20.0), Some(5.0)],
            vec![Some(40.0), Some(80.0), None],
            vec![Some(10.0), Some(15.0), Some(10.0)],
        ];
        assert_eq!(paired(&runs, 0, 1, true), (Some(2.0), Some((1.5, 2.0))));
        // Raw TCP was measured in two runs only: 0.5 and 1.0; the median of two is the upper.
        assert_eq!(paired(&runs, 0, 2, true), (Some(1.0), Some((0.5, 1.0))));
        // Higher is better (calls/s): rpc-core / other.
        assert_eq!(paired(&runs, 0, 1, false), (Some(0.5), Some((0.5, 0.6666666666666666))));
        assert_eq!(paired(&[vec![Some(1.0), None, None]], 0, 1, true), (None, None));
        // Raw TCP against tarpc, in the two runs that measured both: 4.0 and 1.5.
        assert_eq!(paired(&runs, 2, 1, true), (Some(4.0), Some((1.5, 4.0))));
    }

    #[test]
    fn each_run_starts_with_the_next_system() {
        assert_eq!(order(0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(order(1).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(order(2).collect::<Vec<_>>(), vec![2, 0, 1]);
        assert_eq!(order(3).collect::<Vec<_>>(), vec![0, 1, 2]);
    }

    #[test]
    fn an_advantage_prints_with_its_range() {
        assert_eq!(fmt_advantage(Some(1.254), Some((1.1, 1.4))), "1.25x (1.10-1.40)");
        assert_eq!(fmt_advantage(Some(2.0), Some((2.0, 2.0))), "2.00x");
        assert_eq!(fmt_advantage(None, None), "-");
    }

    #[test]
    fn the_minimum_and_cpu_time_are_read_from_their_latency_points_and_nothing_else_is_shared() {
        let at = |name: &str| METRICS.iter().position(|m| m.name == name).unwrap();
        let p50 = at("32 B echo p50 [us]");
        let pipelined = at("32 B echo, 64 outstanding [calls/s]");
        assert_eq!(shares_point(at("32 B echo min [us]")), Some(p50));
        assert_eq!(shares_point(at("32 B echo CPU/call c+s [us]")), Some(p50));
        assert_eq!(shares_point(at("32 B, 64 outst., CPU/call c+s [us]")), Some(pipelined));
        let shared: Vec<usize> = (0..METRICS.len()).filter(|&m| shares_point(m).is_some()).collect();
        assert_eq!(shared.len(), 3);
    }

    #[test]
    fn median_of_three_is_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![]), None);
    }
}

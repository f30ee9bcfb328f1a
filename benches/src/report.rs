//! Results: the per-point record, the perftest-like table, JSON and CSV files.

use std::io::Write;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::counters::Counters;
use crate::cpu::CpuPerCall;
use crate::env::Environment;
use crate::load::{Concurrency, Measured, PathTally, PointSpec};
use crate::target::System;
use crate::workload::format_size;
use crate::BenchError;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl Latency {
    /// The percentiles of a histogram of nanoseconds.
    pub fn of(h: &Histogram<u64>) -> Latency {
        Latency {
            min: us(h.min()),
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// The latency CDF as `[latency_us, fraction]` pairs, dense in the tail.
pub fn cdf(h: &Histogram<u64>) -> Vec<[f64; 2]> {
    let mut qs: Vec<f64> = (0..100).map(|i| f64::from(i) / 100.0).collect();
    qs.extend((1..10).map(|i| 0.99 + f64::from(i) / 1000.0));
    qs.extend([0.9995, 0.9999, 1.0]);
    qs.into_iter().map(|q| [us(h.value_at_quantile(q)), q]).collect()
}

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The system under test.
    pub system: System,
    /// The transport (address scheme).
    pub transport: String,
    /// The call.
    pub workload: String,
    /// Its size in bytes.
    pub size: usize,
    /// Request payload bytes.
    pub request_bytes: usize,
    /// Response payload bytes.
    pub response_bytes: usize,
    /// Calls in flight.
    pub concurrency: Concurrency,
    /// Calls measured.
    pub calls: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Calls per second.
    pub calls_per_sec: f64,
    /// The larger payload direction in GB/s (10^9 bytes): `max(request, response) × calls/s`.
    pub gb_per_sec: f64,
    /// Latency percentiles.
    pub latency_us: Latency,
    /// Paths taken (rpc-core only).
    pub paths: PathTally,
    /// rpc-core client counters of this point's connections.
    pub counters: Option<Counters>,
    /// CPU time per call of the client's process and the server's (see [`crate::cpu`]).
    pub cpu_us_per_call: Option<CpuPerCall>,
    /// Latency CDF (`[us, fraction]`).
    pub cdf: Vec<[f64; 2]>,
}

impl Point {
    /// The record of a measured point.
    pub fn new(system: System, transport: &str, spec: &PointSpec, m: &Measured) -> Point {
        let (request_bytes, response_bytes) = spec.workload.bytes(spec.size);
        let seconds = m.elapsed.as_secs_f64().max(1e-9);
        let calls_per_sec = m.calls as f64 / seconds;
        Point {
            system,
            transport: transport.to_string(),
            workload: spec.workload.name().to_string(),
            size: spec.size,
            request_bytes,
            response_bytes,
            concurrency: spec.concurrency,
            calls: m.calls,
            seconds,
            calls_per_sec,
            gb_per_sec: request_bytes.max(response_bytes) as f64 * calls_per_sec / 1e9,
            latency_us: Latency::of(&m.histogram),
            paths: m.paths,
            counters: m.counters,
            cpu_us_per_call: m.cpu,
            cdf: cdf(&m.histogram),
        }
    }

    /// `system/transport`, the name of a series in tables and plots.
    pub fn series(&self) -> String {
        match self.system {
            System::RpcCore => self.transport.clone(),
            other => format!("{}/{}", other.name(), self.transport),
        }
    }
}

/// Counters of one server run, with its clients' totals.
#[derive(Debug, Clone, Serialize)]
pub struct ServerRun {
    /// The system.
    pub system: System,
    /// The transport.
    pub transport: String,
    /// Where the server ran.
    pub location: String,
    /// Client-side counters over all points.
    pub client: Option<Counters>,
    /// Server-side counters over all connections.
    pub server: Option<Counters>,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where and how it ran.
    pub environment: Environment,
    /// The points.
    pub points: Vec<Point>,
    /// Per server run: the protocol counters.
    pub servers: Vec<ServerRun>,
}

/// The table header line.
pub fn table_header() -> String {
    format!(
        "{:>8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>12} {:>8}  {:<5} {:>15}",
        "#bytes",
        "#calls",
        "p50[us]",
        "p90[us]",
        "p99[us]",
        "p99.9[us]",
        "max[us]",
        "calls/s",
        "GB/s",
        "path",
        "cpu/call c/s[us]"
    )
}

/// One table row.
pub fn table_row(p: &Point) -> String {
    let l = &p.latency_us;
    format!(
        "{:>8} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>10.2} {:>12.0} {:>8.3}  {:<5} {:>15}",
        format_size(p.size),
        p.calls,
        l.p50,
        l.p90,
        l.p99,
        l.p999,
        l.max,
        p.calls_per_sec,
        p.gb_per_sec,
        p.paths.label(),
        cpu_cell(p.cpu_us_per_call)
    )
}

/// `client/server` CPU time per call in microseconds; `-` for a figure not measured (a server
/// in-process counts in the client's).
fn cpu_cell(cpu: Option<CpuPerCall>) -> String {
    match cpu {
        None => "-".into(),
        Some(c) => match c.server_us {
            Some(s) => format!("{:.2}/{s:.2}", c.client_us),
            None => format!("{:.2}/-", c.client_us),
        },
    }
}

/// The title of a group of rows that share everything but the size.
pub fn group_title(p: &Point) -> String {
    let c = p.concurrency;
    format!(
        "# {} over {}: {} | {} conn x {} task x {} outstanding",
        p.system.name(),
        p.transport,
        p.workload,
        c.connections,
        c.tasks,
        c.outstanding
    )
}

/// Writes the table of `points` (grouped as they come) to `out`.
pub fn print_table(out: &mut impl Write, points: &[Point]) -> std::io::Result<()> {
    let mut last = String::new();
    for p in points {
        let title = group_title(p);
        if title != last {
            writeln!(out, "\n{title}\n{}", table_header())?;
            last = title;
        }
        writeln!(out, "{}", table_row(p))?;
    }
    Ok(())
}

/// Writes the counters of each server run, client and server side by side.
pub fn print_counters(out: &mut impl Write, runs: &[ServerRun]) -> std::io::Result<()> {
    for run in runs.iter().filter(|r| r.client.is_some() || r.server.is_some()) {
        writeln!(
            out,
            "\n# {} over {} (server {}): protocol counters",
            run.system.name(),
            run.transport,
            run.location
        )?;
        writeln!(out, "{:<22} {:>14} {:>14}", "counter", "client", "server")?;
        let client = run.client.unwrap_or_default().rows();
        let server = run.server.map(|s| s.rows());
        for (i, (name, c)) in client.iter().enumerate() {
            let s = server.map_or("-".to_string(), |rows| rows[i].1.to_string());
            writeln!(out, "{name:<22} {c:>14} {s:>14}")?;
        }
    }
    Ok(())
}

/// One CSV row.
#[derive(Debug, Serialize)]
struct CsvRow<'a> {
    system: &'static str,
    transport: &'a str,
    workload: &'a str,
    size: usize,
    request_bytes: usize,
    response_bytes: usize,
    connections: usize,
    tasks: usize,
    outstanding: usize,
    calls: u64,
    seconds: f64,
    calls_per_sec: f64,
    gb_per_sec: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    mean_us: f64,
    path: &'static str,
    /// CPU time per call of the client's process (empty: not measured).
    client_cpu_us: Option<f64>,
    /// CPU time per call of the server's process (empty: not measured, or in-process).
    server_cpu_us: Option<f64>,
}

/// Writes `report.json`, `report.csv` (and returns their paths) under `dir` with `prefix`.
pub fn write_files(dir: &Path, prefix: &str, report: &Report) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::output(dir, e))?;
    let json = dir.join(format!("{prefix}.json"));
    let text = serde_json::to_string_pretty(report).map_err(|e| BenchError::output(&json, e))?;
    std::fs::write(&json, text).map_err(|e| BenchError::output(&json, e))?;
    let csv = dir.join(format!("{prefix}.csv"));
    let mut w = csv::Writer::from_path(&csv).map_err(|e| BenchError::output(&csv, e))?;
    for p in &report.points {
        let l = &p.latency_us;
        let row = CsvRow {
            system: p.system.name(),
            transport: &p.transport,
            workload: &p.workload,
            size: p.size,
            request_bytes: p.request_bytes,
            response_bytes: p.response_bytes,
            connections: p.concurrency.connections,
            tasks: p.concurrency.tasks,
            outstanding: p.concurrency.outstanding,
            calls: p.calls,
            seconds: p.seconds,
            calls_per_sec: p.calls_per_sec,
            gb_per_sec: p.gb_per_sec,
            p50_us: l.p50,
            p90_us: l.p90,
            p99_us: l.p99,
            p999_us: l.p999,
            max_us: l.max,
            mean_us: l.mean,
            path: p.paths.label(),
            client_cpu_us: p.cpu_us_per_call.map(|c| c.client_us),
            server_cpu_us: p.cpu_us_per_call.and_then(|c| c.server_us),
        };
        w.serialize(row).map_err(|e| BenchError::output(&csv, e))?;
    }
    w.flush().map_err(|e| BenchError::output(&csv, e))?;
    Ok(vec![json, csv])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::new_histogram;

    #[test]
    fn latency_percentiles_are_in_microseconds() {
        let mut h = new_histogram();
        for ns in 1..=1000u64 {
            h.saturating_record(ns * 1000);
        }
        let l = Latency::of(&h);
        assert!((l.p50 - 500.0).abs() < 2.0, "{l:?}");
        assert!((l.p99 - 990.0).abs() < 3.0, "{l:?}");
        assert!(l.max >= 999.0 && l.min <= 1.01, "{l:?}");
        let c = cdf(&h);
        assert_eq!(c.first().map(|p| p[1]), Some(0.0));
        assert_eq!(c.last().map(|p| p[1]), Some(1.0));
        assert!(c.windows(2).all(|w| w[0][0] <= w[1][0] && w[0][1] < w[1][1]));
    }
}

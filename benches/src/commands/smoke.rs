//! `rpc-bench smoke`: a few seconds over mem (in-process) and tcp (child process), every workload
//! on both paths, and the tarpc, raw-TCP and raw-transport clients briefly; checks every call, the
//! path each took, the counters, and the files written. Any failure makes the command fail.

use crate::cli::SmokeArgs;
use crate::env::{Environment, Placement};
use crate::load::{Budget, Concurrency, PointSpec};
use crate::report::{Point, Report};
use crate::target::{ProtoSettings, System};
use crate::workload::Workload;
use crate::BenchError;

use super::exec::{execute, location_label, Group, ServerSpec};
use super::plan::listen_address;

/// Small threshold so that rendezvous is cheap to exercise.
const THRESHOLD: usize = 4096;
const LARGE: usize = 16 << 10;
const CALLS: u64 = 40;

fn point(workload: Workload, size: usize, concurrency: Concurrency) -> PointSpec {
    PointSpec { workload, size, concurrency, warmup: Budget::Calls(4), budget: Budget::Calls(CALLS) }
}

fn rpc_points() -> Vec<PointSpec> {
    let serial = Concurrency::SERIAL;
    let busy = Concurrency { connections: 2, tasks: 2, outstanding: 8 };
    vec![
        point(Workload::Echo, 32, serial),
        point(Workload::Echo, LARGE, serial),
        point(Workload::Upload, LARGE, serial),
        point(Workload::Download, LARGE, serial),
        point(Workload::Echo, 32, busy),
        point(Workload::Echo, LARGE, busy),
    ]
}

fn peer_points() -> Vec<PointSpec> {
    vec![
        point(Workload::Echo, 32, Concurrency::SERIAL),
        point(Workload::Download, LARGE, Concurrency::SERIAL),
    ]
}

/// The raw transport ping-pong sends one message each way: sizes up to a receive buffer.
fn raw_transport_points() -> Vec<PointSpec> {
    vec![
        point(Workload::Echo, 32, Concurrency::SERIAL),
        point(Workload::Download, THRESHOLD, Concurrency::SERIAL),
    ]
}

/// The path label every rpc-core point must show.
fn expected_path(p: &Point) -> &'static str {
    let large = |n: usize| n > THRESHOLD;
    match (p.system, large(p.request_bytes), large(p.response_bytes)) {
        (System::RpcCore, false, false) => "E/E",
        (System::RpcCore, false, true) => "E/R",
        (System::RpcCore, true, false) => "R/E",
        (System::RpcCore, true, true) => "R/R",
        _ => "E/E",
    }
}

/// What must hold; returns the failures.
fn check(report: &Report) -> (usize, Vec<String>) {
    let mut passed = 0;
    let mut failed = Vec::new();
    let mut expect = |ok: bool, what: String| match ok {
        true => passed += 1,
        false => failed.push(what),
    };
    for p in &report.points {
        let name = format!(
            "{} {} {} {}B x{}",
            p.system.name(),
            p.transport,
            p.workload,
            p.size,
            p.concurrency.in_flight()
        );
        expect(p.calls == CALLS, format!("{name}: {} calls measured, expected {CALLS}", p.calls));
        expect(
            p.paths.label() == expected_path(p),
            format!("{name}: path {} expected {}", p.paths.label(), expected_path(p)),
        );
        expect(p.latency_us.p50 > 0.0, format!("{name}: no latency recorded"));
    }
    for run in report.servers.iter().filter(|r| r.system == System::RpcCore) {
        for (side, c) in [("client", run.client), ("server", run.server)] {
            let name = format!("{} {side}", run.transport);
            let Some(c) = c else {
                expect(false, format!("{name}: no counters"));
                continue;
            };
            expect(c.recv_unexpected == 0, format!("{name}: {} receives unexpected", c.recv_unexpected));
            expect(c.reads_refused == 0, format!("{name}: {} READs refused", c.reads_refused));
            expect(c.rendezvous_sent > 0, format!("{name}: no rendezvous payload sent"));
            expect(c.driver_polls > 0, format!("{name}: driver polls not counted"));
            expect(
                c.regions_registered == c.keys_revoked,
                format!("{name}: {} regions, {} revoked", c.regions_registered, c.keys_revoked),
            );
        }
    }
    (passed, failed)
}

pub(super) async fn smoke(args: SmokeArgs) -> Result<(), BenchError> {
    let settings = ProtoSettings { eager_threshold: THRESHOLD, recv_depth: 16, ..ProtoSettings::default() };
    let placement = Placement::default();
    let groups = vec![
        Group {
            system: System::RpcCore,
            server: ServerSpec::InProcess(listen_address("mem")),
            points: rpc_points(),
        },
        Group {
            system: System::RpcCore,
            server: ServerSpec::Child(listen_address("tcp")),
            points: rpc_points(),
        },
        Group {
            system: System::Tarpc,
            server: ServerSpec::Child(listen_address("tcp")),
            points: peer_points(),
        },
        Group {
            system: System::RawTcp,
            server: ServerSpec::InProcess(listen_address("tcp")),
            points: peer_points(),
        },
        Group {
            system: System::RawTransport,
            server: ServerSpec::InProcess(listen_address("mem")),
            points: raw_transport_points(),
        },
        Group {
            system: System::RawTransport,
            server: ServerSpec::Child(listen_address("tcp")),
            points: raw_transport_points(),
        },
    ];
    let env = Environment::capture(&placement, &settings, &location_label(&groups));
    let outcome = execute(&groups, &placement, &settings).await?;
    let report = Report { environment: env, points: outcome.points, servers: outcome.servers };
    crate::report::print_counters(&mut std::io::stdout().lock(), &report.servers)?;
    let files = super::write_outputs(&args.output, "smoke", &report)?;
    let (mut passed, mut failed) = check(&report);
    for f in &files {
        let size = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        match size > 0 {
            true => passed += 1,
            false => failed.push(format!("{} is missing or empty", f.display())),
        }
    }
    let plots = files.iter().filter(|f| f.extension().is_some_and(|e| e == "png")).count();
    match plots == 3 {
        true => passed += 1,
        false => failed.push(format!("{plots} plots written, expected 3")),
    }
    println!();
    for f in &failed {
        println!("FAILED: {f}");
    }
    println!("smoke: {passed} passed, {} failed", failed.len());
    match failed.is_empty() {
        true => Ok(()),
        false => Err(BenchError::Call(format!("{} smoke checks failed", failed.len()))),
    }
}

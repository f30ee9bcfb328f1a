//! Runs groups of points: starts each group's server (child process, in-process or remote),
//! measures its points while printing the table, stops the server and gathers its counters.

use crate::counters::Counters;
use crate::env::Placement;
use crate::load::{measure, Measured, PointSpec};
use crate::peers::raw_tcp::RawTarget;
use crate::peers::raw_transport::RawTransportTarget;
use crate::peers::tarpc::TarpcTarget;
use crate::peers::RunningServer;
use crate::report::{group_title, table_header, table_row, Point, ServerRun};
use crate::server_proc::{ServerCommand, ServerProcess};
use crate::target::{ProtoSettings, RpcTarget, System};
use crate::BenchError;

/// Where a group's server runs.
#[derive(Debug, Clone)]
pub enum ServerSpec {
    /// Already running at this address (client mode).
    Remote(String),
    /// A child process of this binary bound to this address.
    Child(String),
    /// In this process, on the client's runtime, bound to this address.
    InProcess(String),
}

/// Points measured against one server.
#[derive(Debug, Clone)]
pub struct Group {
    /// The system.
    pub system: System,
    /// Its server.
    pub server: ServerSpec,
    /// The points, in order.
    pub points: Vec<PointSpec>,
}

/// What [`execute`] produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Every point.
    pub points: Vec<Point>,
    /// Every server run with its counters.
    pub servers: Vec<ServerRun>,
}

/// A started server.
enum Handle {
    Remote(String),
    Child(ServerProcess),
    InProcess(RunningServer),
}

impl Handle {
    async fn start(
        system: System,
        spec: &ServerSpec,
        placement: &Placement,
        settings: &ProtoSettings,
    ) -> Result<Handle, BenchError> {
        Ok(match spec {
            ServerSpec::Remote(addr) => Handle::Remote(addr.clone()),
            ServerSpec::InProcess(listen) => {
                Handle::InProcess(RunningServer::start(system, listen, settings).await?)
            }
            ServerSpec::Child(listen) => Handle::Child(ServerProcess::spawn(&ServerCommand {
                system,
                listen: listen.clone(),
                settings: *settings,
                cpu: placement.server_cpu,
                threads: placement.threads,
            })?),
        })
    }

    fn addr(&self) -> String {
        match self {
            Handle::Remote(a) => a.clone(),
            Handle::Child(p) => p.addr().to_string(),
            Handle::InProcess(s) => s.local_addr(),
        }
    }

    /// The server's child process.
    fn pid(&self) -> Option<u32> {
        match self {
            Handle::Child(p) => Some(p.id()),
            Handle::Remote(_) | Handle::InProcess(_) => None,
        }
    }

    fn location(&self) -> String {
        match self {
            Handle::Remote(_) => "remote".into(),
            Handle::Child(p) => format!("child process {}", p.id()),
            Handle::InProcess(_) => "in-process".into(),
        }
    }

    async fn stop(self) -> Result<Option<Counters>, BenchError> {
        match self {
            Handle::Remote(_) => Ok(None),
            Handle::Child(p) => p.stop(),
            Handle::InProcess(s) => {
                let counters = s.counters();
                s.stop().await;
                Ok(counters)
            }
        }
    }
}

/// How the servers of these groups run, for the environment record.
pub fn location_label(groups: &[Group]) -> String {
    let mut labels: Vec<&str> = groups
        .iter()
        .map(|g| match g.server {
            ServerSpec::Remote(_) => "remote",
            ServerSpec::Child(_) => "child process",
            ServerSpec::InProcess(_) => "in-process (same runtime)",
        })
        .collect();
    labels.dedup();
    labels.join(", ")
}

/// The scheme of an address: `tcp`, `mem`, `rdma`, ...
pub fn scheme(addr: &str) -> &str {
    addr.split_once("://").map_or("?", |(s, _)| s)
}

/// Measures one point against `addr` with the client of `system`; `server_pid`: the server's
/// child process, if it has one (its CPU time per call is measured too).
pub async fn measure_point(
    system: System,
    addr: &str,
    settings: &ProtoSettings,
    spec: &PointSpec,
    server_pid: Option<u32>,
) -> Result<Measured, BenchError> {
    match system {
        System::RpcCore => measure::<RpcTarget>(addr, settings, spec, server_pid).await,
        System::Tarpc => measure::<TarpcTarget>(addr, settings, spec, server_pid).await,
        System::RawTcp => measure::<RawTarget>(addr, settings, spec, server_pid).await,
        System::RawTransport => measure::<RawTransportTarget>(addr, settings, spec, server_pid).await,
    }
}

/// Runs every group, printing the table as points complete.
pub async fn execute(
    groups: &[Group],
    placement: &Placement,
    settings: &ProtoSettings,
) -> Result<Outcome, BenchError> {
    let total: usize = groups.iter().map(|g| g.points.len()).sum();
    let bar = super::progress(total as u64);
    let env = crate::env::Environment::capture(placement, settings, &location_label(groups));
    println!("{}", env.summary());
    let mut outcome = Outcome { points: Vec::new(), servers: Vec::new() };
    for group in groups {
        let handle = Handle::start(group.system, &group.server, placement, settings).await?;
        let addr = handle.addr();
        let transport = scheme(&addr).to_string();
        let location = handle.location();
        let mut client: Option<Counters> = None;
        let mut last_title = String::new();
        for spec in &group.points {
            bar.set_message(format!(
                "{} {} {} x{}",
                transport,
                spec.workload,
                spec.size,
                spec.concurrency.in_flight()
            ));
            let measured = measure_point(group.system, &addr, settings, spec, handle.pid()).await?;
            let point = Point::new(group.system, &transport, spec, &measured);
            if let Some(c) = &point.counters {
                client.get_or_insert_with(Counters::default).add(c);
            }
            let title = group_title(&point);
            bar.suspend(|| {
                if title != last_title {
                    println!("\n{title}\n{}", table_header());
                }
                println!("{}", table_row(&point));
            });
            last_title = title;
            outcome.points.push(point);
            bar.inc(1);
        }
        let server = handle.stop().await?;
        outcome.servers.push(ServerRun { system: group.system, transport, location, client, server });
    }
    bar.finish_and_clear();
    Ok(outcome)
}

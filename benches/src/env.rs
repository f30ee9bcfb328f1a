//! The environment recorded with every result, CPU pinning, and the tokio runtime.

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use serde::Serialize;

use crate::target::ProtoSettings;
use crate::BenchError;

/// The environment variable the rdma backend reads its busy-poll window from.
pub const BUSY_POLL_ENV: &str = "RPC_RDMA_BUSY_POLL_US";

/// Where and how a run happened (no host name).
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// `rpc-bench` version.
    pub harness: &'static str,
    /// `release` or `debug`.
    pub build: &'static str,
    /// Kernel release.
    pub kernel: String,
    /// CPU model (from /proc/cpuinfo).
    pub cpu_model: String,
    /// CPUs online (from /proc/cpuinfo; pinning does not change it).
    pub cpus: usize,
    /// The 1-minute load average when the run started: other work on the machine skews results.
    pub load_avg_1m: f64,
    /// CPU the client is pinned to.
    pub client_cpu: Option<usize>,
    /// CPU the server is pinned to.
    pub server_cpu: Option<usize>,
    /// `same vCPU`, `across vCPUs` or `unpinned`.
    pub placement: String,
    /// `child process`, `in-process (same runtime)` or `remote`.
    pub server_location: String,
    /// tokio worker threads per process (1 = current-thread runtime).
    pub threads: usize,
    /// The rdma busy-poll window in microseconds (`RPC_RDMA_BUSY_POLL_US`; 0 = none).
    pub busy_poll_us: u64,
    /// rpc-core protocol settings on both sides.
    pub proto: ProtoSettings,
    /// Unix time the run started.
    pub started_unix: u64,
}

/// How the processes of a run are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::Args, Serialize)]
pub struct Placement {
    /// Pin the client process (all its threads) to this CPU.
    #[arg(long)]
    pub client_cpu: Option<usize>,
    /// Pin the server process to this CPU (child-process servers only).
    #[arg(long)]
    pub server_cpu: Option<usize>,
    /// tokio worker threads in each process; 1 = current-thread runtime.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Busy-poll window for the rdma backend in microseconds (sets RPC_RDMA_BUSY_POLL_US for
    /// both processes; other transports ignore it).
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
}

impl Placement {
    /// Describes the pinning.
    pub fn describe(&self) -> String {
        match (self.client_cpu, self.server_cpu) {
            (Some(c), Some(s)) if c == s => format!("same vCPU ({c})"),
            (Some(c), Some(s)) => format!("across vCPUs (client {c}, server {s})"),
            (Some(c), None) => format!("client pinned to {c}, server unpinned"),
            (None, Some(s)) => format!("server pinned to {s}, client unpinned"),
            (None, None) => "unpinned".to_string(),
        }
    }
}

impl Environment {
    /// The environment of a run with this placement.
    pub fn capture(placement: &Placement, proto: &ProtoSettings, server_location: &str) -> Environment {
        Environment {
            harness: env!("CARGO_PKG_VERSION"),
            build: if cfg!(debug_assertions) { "debug" } else { "release" },
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu_model: cpu_model(),
            cpus: online_cpus(),
            load_avg_1m: load_avg(),
            client_cpu: placement.client_cpu,
            server_cpu: placement.server_cpu,
            placement: placement.describe(),
            server_location: server_location.to_string(),
            threads: placement.threads.max(1),
            busy_poll_us: busy_poll_us(),
            proto: *proto,
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// One line for the top of a table.
    pub fn summary(&self) -> String {
        format!(
            "# rpc-bench {} ({} build) | {} x {} | load {:.2} | {} | server: {} | {} | eager threshold {} B, recv depth {}, busy-poll {} us{}{}{}",
            self.harness,
            self.build,
            self.cpus,
            self.cpu_model,
            self.load_avg_1m,
            self.placement,
            self.server_location,
            if self.threads <= 1 { "current-thread runtime".to_string() } else { format!("{} tokio threads", self.threads) },
            self.proto.eager_threshold,
            self.proto.recv_depth,
            self.busy_poll_us,
            if self.proto.handlers_in_tasks { ", handlers in tasks" } else { "" },
            if self.proto.no_tcp_look { ", no tcp look" } else { "" },
            match self.proto.tcp_busy_poll_us {
                0 => String::new(),
                us => format!(", tcp busy-poll {us} us"),
            },
        )
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The first `model name` of /proc/cpuinfo.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|l| {
            l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}

/// CPUs listed in /proc/cpuinfo (else what this process may use).
pub fn online_cpus() -> usize {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    match info.lines().filter(|l| l.starts_with("processor")).count() {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// The 1-minute load average (0 if unknown).
pub fn load_avg() -> f64 {
    read_trimmed("/proc/loadavg").split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// The busy-poll window in effect.
pub fn busy_poll_us() -> u64 {
    std::env::var(BUSY_POLL_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Pins the calling thread, and so every thread it starts later, to `cpu`.
pub fn pin_to(cpu: usize) -> Result<(), BenchError> {
    if cpu >= online_cpus() {
        return Err(BenchError::Usage(format!("CPU {cpu} does not exist ({} online)", online_cpus())));
    }
    set_affinity(&[cpu])
}

/// Lets the calling thread (and the threads it starts later) run on every online CPU, undoing
/// the pinning a child process inherits from its parent.
pub fn unpin() -> Result<(), BenchError> {
    let all: Vec<usize> = (0..online_cpus()).collect();
    set_affinity(&all)
}

fn set_affinity(cpus: &[usize]) -> Result<(), BenchError> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu).map_err(|e| BenchError::Usage(format!("CPU {cpu}: {e}")))?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)
        .map_err(|e| BenchError::Usage(format!("setting the CPU affinity to {cpus:?}: {e}")))
}

/// The tokio runtime: current-thread for `threads <= 1`, else multi-thread.
///
/// First it starts one idle thread (parked for the life of the process), so that every system is
/// measured in a multi-threaded process, as a service always is. Once a process has a second
/// thread, glibc runs each system call that is a cancellation point (`epoll_wait`, `recvfrom`,
/// `sendto`) with two more atomic updates, about 11 ns on the machines of BENCHMARKS.md; rpc-core
/// starts a timer thread, which would charge that to it (and to whatever system ran after it in
/// the same process) and not to the others.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    static IDLE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    IDLE.get_or_init(|| {
        let idle = std::thread::Builder::new().name("rpc-bench-idle".into()).spawn(|| loop {
            std::thread::park();
        });
        if let Err(e) = idle {
            eprintln!("rpc-bench: could not start the idle thread ({e}): this process is single-threaded");
        }
    });
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_names_same_and_across() {
        let same = Placement { client_cpu: Some(0), server_cpu: Some(0), ..Placement::default() };
        assert!(same.describe().starts_with("same vCPU"));
        let across = Placement { client_cpu: Some(0), server_cpu: Some(1), ..Placement::default() };
        assert!(across.describe().starts_with("across vCPUs"));
        assert_eq!(Placement::default().describe(), "unpinned");
    }

    #[test]
    fn pinning_to_a_missing_cpu_is_an_error() {
        assert!(pin_to(1 << 20).is_err());
    }

    #[test]
    fn environment_has_no_host_name() {
        let e = Environment::capture(&Placement::default(), &ProtoSettings::default(), "child process");
        let json = serde_json::to_string(&e).unwrap();
        let host = read_trimmed("/proc/sys/kernel/hostname");
        assert!(host.is_empty() || !json.contains(&host), "{json}");
        assert!(e.cpus >= 1);
    }
}

//! The command line of `rpc-bench`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::env::Placement;
use crate::target::{ProtoSettings, System};
use crate::workload::Workload;

/// perftest-style RPC benchmarks over any transport address.
#[derive(Debug, Parser)]
#[command(name = "rpc-bench", version, about, long_about = None)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Serve the benchmark service (server mode) until interrupted.
    Server(ServerArgs),
    /// Run workloads: against a running server (--connect ADDR, client mode), or against a server
    /// this command starts (--listen ADDR, one-command mode; a child process unless --in-process;
    /// mem:// is always in-process).
    Run(RunArgs),
    /// The quick sweep over tcp and mem: table, JSON, CSV and plots.
    Sweep(SweepArgs),
    /// rpc-core vs tarpc vs a raw TCP ping-pong on the same workloads, with ratios.
    Compare(CompareArgs),
    /// Allocations and wake-ups (task polls) per small call, over mem and tcp in this process.
    /// Allocations are counted when rpc-bench is built with `--features count-allocs`.
    Counts(CountsArgs),
    /// A run of a few seconds over mem and tcp, every workload and path; fails on any error.
    Smoke(SmokeArgs),
    /// Check this machine for rdma://: devices, ports, GIDs, limits, memlock, rdma_cm; says what
    /// to fix. Exit status 0 when a device has a usable ACTIVE port and the rest is in order.
    Doctor(DoctorArgs),
}

/// `rpc-bench server`.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Address to bind: tcp://IP:PORT (port 0 picks one), rdma://IP:PORT, mem://name.
    #[arg(long, default_value = "tcp://127.0.0.1:7471")]
    pub listen: String,
    /// The system to serve (tarpc and raw-tcp need a tcp:// address).
    #[arg(long, value_enum, default_value = "rpc-core")]
    pub system: System,
    /// Pin the server process to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// tokio worker threads; 1 = current-thread runtime.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Busy-poll window for the rdma backend, in microseconds.
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    /// Stop when standard input closes and print the counters (used by one-command runs).
    #[arg(long, hide = true)]
    pub stdin_control: bool,
    /// Protocol settings.
    #[command(flatten)]
    pub proto: ProtoSettings,
}

/// The workload options of `rpc-bench run`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Workloads: echo (N out, N back), upload (N out, 8 B back), download (8 B out, N back).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "echo")]
    pub workload: Vec<Workload>,
    /// Sizes: a list (32,4K,1M) or a sweep LO:HI in powers of --step (8:64M).
    #[arg(long, default_value = "8:1M")]
    pub sizes: String,
    /// Factor between sizes of a sweep.
    #[arg(long, default_value_t = 4)]
    pub step: usize,
    /// Calls in flight per client task (a list makes a throughput-vs-outstanding series).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub outstanding: Vec<usize>,
    /// Client connections.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Client tasks per connection.
    #[arg(long, default_value_t = 1)]
    pub tasks: usize,
    /// Calls measured per point (fewer for large sizes, see --max-bytes).
    #[arg(long, default_value_t = 10_000)]
    pub iters: u64,
    /// Bytes moved per point at most: caps the calls of large sizes (min 20 calls).
    #[arg(long, default_value = "1G")]
    pub max_bytes: String,
    /// Seconds per point instead of a call count (warm-up: a fifth of it).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Warm-up calls per point (default: a tenth of the measured calls, at most 1000).
    #[arg(long)]
    pub warmup: Option<u64>,
}

/// Where results go.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Directory for JSON, CSV and PNG files.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// File name prefix (default: the subcommand's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Skip the PNG plots.
    #[arg(long)]
    pub no_plots: bool,
}

/// `rpc-bench run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The system to measure.
    #[arg(long, value_enum, default_value = "rpc-core")]
    pub system: System,
    /// Client mode: the address of a running `rpc-bench server`.
    #[arg(long, conflicts_with_all = ["listen", "in_process"])]
    pub connect: Option<String>,
    /// One-command mode: address(es) to start a server on; `tcp` and `mem` are shorthands for
    /// tcp://127.0.0.1:0 and a fresh mem:// name. Repeat for several transports. Default: tcp.
    #[arg(long)]
    pub listen: Vec<String>,
    /// Run the server in this process, on the client's runtime, instead of a child process.
    #[arg(long)]
    pub in_process: bool,
    /// Workload.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Placement.
    #[command(flatten)]
    pub placement: Placement,
    /// Protocol settings.
    #[command(flatten)]
    pub proto: ProtoSettings,
    /// Output.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `rpc-bench sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Transports to sweep (`tcp`, `mem`, or full addresses such as rdma://IP:PORT).
    #[arg(long, value_delimiter = ',', default_value = "tcp,mem")]
    pub transports: Vec<String>,
    /// Sizes up to 64 MiB in powers of 2 (default: 8 B to 4 MiB in powers of 4).
    #[arg(long)]
    pub full: bool,
    /// Seconds per point.
    #[arg(long, default_value_t = 0.3)]
    pub duration: f64,
    /// Placement.
    #[command(flatten)]
    pub placement: Placement,
    /// Protocol settings.
    #[command(flatten)]
    pub proto: ProtoSettings,
    /// Output.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `rpc-bench compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// CPU of the client process.
    #[arg(long, default_value_t = 0)]
    pub client_cpu: usize,
    /// CPU of the server processes (the default, the client's, is the reference setup).
    #[arg(long, default_value_t = 0)]
    pub server_cpu: usize,
    /// Do not pin either side.
    #[arg(long)]
    pub unpinned: bool,
    /// tokio worker threads in each process (the client and every server); 1 = current-thread
    /// runtime, the reference setup. More is what a service on `#[tokio::main]` runs.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Runs of every measurement; the table shows medians, and each ratio is the median of the
    /// runs' ratios (each run measures the systems seconds apart) with their range.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// Protocol settings of rpc-core.
    #[command(flatten)]
    pub proto: ProtoSettings,
    /// Output.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `rpc-bench counts`.
#[derive(Debug, clap::Args)]
pub struct CountsArgs {
    /// Transports: `mem`, `tcp` (tcp://127.0.0.1:0), or full addresses.
    #[arg(long, value_delimiter = ',', default_value = "mem,tcp")]
    pub transports: Vec<String>,
    /// Calls measured per transport.
    #[arg(long, default_value_t = 10_000)]
    pub calls: u64,
    /// Warm-up calls per transport, not measured.
    #[arg(long, default_value_t = 1_000)]
    pub warmup: u64,
    /// Echo payload size in bytes.
    #[arg(long, default_value_t = 32)]
    pub size: usize,
    /// Calls in flight in the pipelined rows (an echo per transport with this many calls kept
    /// in flight by as many tasks); 0 skips them.
    #[arg(long, default_value_t = 64)]
    pub outstanding: usize,
    /// Run the server's handlers in tasks of their own, as `ServerConfig`'s default does for
    /// methods not marked `#[rpc(inline)]` (the harness runs them in the connection's driver
    /// otherwise: see `--handlers-in-tasks` of `run`).
    #[arg(long)]
    pub handlers_in_tasks: bool,
}

/// `rpc-bench doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Check only this device (default: `RPC_RDMA_DEVICE` if set, else every device).
    #[arg(long)]
    pub device: Option<String>,
}

/// `rpc-bench smoke`.
#[derive(Debug, clap::Args)]
pub struct SmokeArgs {
    /// Output.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What a process does with its CPU affinity at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// Run on this CPU only.
    Pin(usize),
    /// Run on every CPU (a server child would otherwise inherit its parent's pinning).
    Unpin,
    /// Leave it as inherited.
    Inherit,
}

impl Cli {
    /// The affinity of this process, its tokio threads, and the busy-poll window.
    pub fn process_setup(&self) -> (Affinity, usize, Option<u64>) {
        let client = |cpu: Option<usize>| cpu.map_or(Affinity::Inherit, Affinity::Pin);
        match &self.cmd {
            Cmd::Server(a) => (a.cpu.map_or(Affinity::Unpin, Affinity::Pin), a.threads, a.busy_poll_us),
            Cmd::Run(a) => (client(a.placement.client_cpu), a.placement.threads, a.placement.busy_poll_us),
            Cmd::Sweep(a) => (client(a.placement.client_cpu), a.placement.threads, a.placement.busy_poll_us),
            Cmd::Compare(a) => (client((!a.unpinned).then_some(a.client_cpu)), a.threads, None),
            Cmd::Smoke(_) | Cmd::Doctor(_) | Cmd::Counts(_) => (Affinity::Inherit, 1, None),
        }
    }
}

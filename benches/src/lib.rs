//! The benchmark harness behind `rpc-bench`: perftest-style RPC latency and throughput
//! measurements over any transport address (`mem://`, `tcp://`, and `rdma://` / `shm://` when the
//! build has them), side by side with tarpc and a raw TCP ping-pong.
//!
//! * [`workload`]: what one call does (echo, upload, download) and size parsing.
//! * [`target`]: the systems under test behind one [`target::Target`] trait
//!   (rpc-core, tarpc, raw TCP), their servers in [`peers`].
//! * [`load`]: the closed-loop load generator (connections × tasks × outstanding calls) with
//!   HDR histograms.
//! * [`cpu`]: CPU time per call of the client's and the server's process.
//! * [`report`], [`plot`]: the table, JSON, CSV and PNG plots.
//! * [`env`](mod@env): the environment recorded with results, CPU pinning and the tokio runtime.
//! * [`server_proc`]: the server as a child process of the same binary.
//! * [`commands`]: the subcommands of `rpc-bench`.

pub mod cli;
pub mod commands;
pub mod counters;
pub mod cpu;
pub mod env;
mod error;
pub mod load;
pub mod peers;
pub mod plot;
pub mod report;
pub mod server_proc;
pub mod service;
pub mod target;
pub mod workload;

pub use error::BenchError;

//! `rpc-bench counts`: what one small call costs in allocations and wake-ups, so that a
//! regression shows as a number, not as noise in a latency percentile.
//!
//! Per transport and per call, in this process on a current-thread runtime: a server, a client,
//! warm-up calls, then `--calls` calls through the generated stub, one outstanding. The calls:
//! a 32 B echo (`Bytes` argument and result: decoded as slices of the received messages, which
//! are frozen into `Bytes` for them), and `increment` (a `u64` each way: nothing of a message is
//! kept). A last row per call measures the client alone: the server in a child process (tcp).
//! Then, per transport, the echo with `--outstanding` calls in flight (as many tasks, each
//! calling in a loop; they are spawned and parked before the count starts, so the harness adds
//! nothing per call): what batching under load costs or saves. Printed per call:
//!
//! * allocations and bytes allocated (the whole process: client and server, or the client alone
//!   in the last rows), counted by the global allocator of `rpc-bench` when it is built with
//!   `--features count-allocs`;
//! * polls of the calling future (a poll-counting wrapper around each call);
//! * polls of the client's and of the server's connection driver ([`rpc_core::ConnStats`]);
//! * handler tasks the server spawned;
//! * posts of SENDs to the transport by the client and by the server
//!   (`TransportCounters::send_posts`: write system calls on tcp, `ibv_post_send` calls on
//!   rdma): how many calls' messages leave together.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};

use bytes::Bytes;
use rpc_core::{Client, ClientConfig, ConnStats, Server};

use crate::cli::CountsArgs;
use crate::server_proc::{ServerCommand, ServerProcess};
use crate::service::{BenchClient, BenchImpl, BenchServer};
use crate::target::{ProtoSettings, System};
use crate::BenchError;

use super::plan::listen_address;

/// Allocations and bytes allocated by the process so far, when `rpc-bench` counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Allocated {
    allocations: u64,
    bytes: u64,
}

/// The process's allocation counts, or `None` when no counting allocator is installed (a build
/// without the `count-allocs` feature, or a binary other than `rpc-bench`).
#[cfg(feature = "count-allocs")]
fn allocated() -> Option<Allocated> {
    let read = || {
        let s = stats_alloc::INSTRUMENTED_SYSTEM.stats();
        // A reallocation is an allocation too (a buffer that grows).
        Allocated { allocations: (s.allocations + s.reallocations) as u64, bytes: s.bytes_allocated as u64 }
    };
    let before = read();
    drop(std::hint::black_box(vec![0u8; 64]));
    let after = read();
    (after != before).then_some(after)
}

#[cfg(not(feature = "count-allocs"))]
fn allocated() -> Option<Allocated> {
    None
}

/// Counts the polls of the future it wraps.
struct CountPolls<'a, F> {
    inner: Pin<&'a mut F>,
    polls: &'a mut u64,
}

impl<F: Future> Future for CountPolls<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        *this.polls += 1;
        this.inner.as_mut().poll(cx)
    }
}

/// The call a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKind {
    /// `echo` of `--size` bytes.
    Echo,
    /// `increment(u64) -> u64`: nothing in it is `Bytes`.
    Increment,
}

impl CallKind {
    fn label(self, size: usize) -> String {
        match self {
            CallKind::Echo => format!("echo {size} B"),
            CallKind::Increment => "increment (u64, no Bytes)".to_string(),
        }
    }
}

/// The figures of one transport and call, per call (`None`: not measured in that setup).
#[derive(Debug, Clone)]
struct Row {
    transport: String,
    call: String,
    allocations: Option<f64>,
    bytes: Option<f64>,
    caller_polls: f64,
    /// Passes over the connection run by the caller's task (a lone call drives its connection).
    caller_passes: f64,
    client_driver_polls: f64,
    server_driver_polls: Option<f64>,
    handlers_spawned: Option<f64>,
    /// Posts of SENDs to the transport (tcp: write system calls; rdma: `ibv_post_send` calls).
    client_send_posts: f64,
    server_send_posts: Option<f64>,
}

pub(super) async fn counts(args: CountsArgs) -> Result<(), BenchError> {
    if args.calls == 0 {
        return Err(BenchError::Usage("--calls must be at least 1".into()));
    }
    let mut rows = Vec::new();
    for kind in [CallKind::Echo, CallKind::Increment] {
        for transport in &args.transports {
            rows.push(measure(transport, kind, &args).await?);
        }
    }
    for kind in [CallKind::Echo, CallKind::Increment] {
        rows.push(measure_client_alone(kind, &args).await?);
    }
    if args.outstanding > 0 {
        for transport in &args.transports {
            rows.push(measure_pipelined(transport, &args).await?);
        }
    }
    print(&args, &rows);
    let (_server, _client, stub) = serve_and_connect("mem", args.handlers_in_tasks).await?;
    let (echo, increment) = future_sizes(&stub);
    println!();
    println!(
        "call futures (what a caller moves when it spawns a call or pushes it into a \
         FuturesUnordered): echo {echo} B, increment {increment} B"
    );
    Ok(())
}

/// The sizes of a generated stub's call futures (built, never polled).
fn future_sizes(stub: &BenchClient) -> (usize, usize) {
    let echo = stub.echo(Bytes::new());
    let increment = stub.increment(0);
    (std::mem::size_of_val(&echo), std::mem::size_of_val(&increment))
}

/// What the measured calls cost: the allocation counts before and after, the caller's polls.
struct Measured {
    alloc: Option<(Allocated, Allocated)>,
    caller_polls: u64,
}

async fn warm_up(stub: &BenchClient, kind: CallKind, args: &CountsArgs) -> Result<(), BenchError> {
    let data = Bytes::from(vec![0x5au8; args.size]);
    let mut ignored = 0;
    for i in 0..args.warmup {
        call(stub, kind, &data, i, &mut ignored).await?;
    }
    Ok(())
}

async fn measured_calls(
    stub: &BenchClient,
    kind: CallKind,
    args: &CountsArgs,
) -> Result<Measured, BenchError> {
    let data = Bytes::from(vec![0x5au8; args.size]);
    let mut caller_polls = 0;
    let alloc0 = allocated();
    for i in 0..args.calls {
        call(stub, kind, &data, i, &mut caller_polls).await?;
    }
    let alloc1 = allocated();
    Ok(Measured { alloc: alloc0.zip(alloc1), caller_polls })
}

/// A server on `transport` in this process and a client connected to it (and its stub).
async fn serve_and_connect(
    transport: &str,
    handlers_in_tasks: bool,
) -> Result<(Server, Client, BenchClient), BenchError> {
    let settings = ProtoSettings { handlers_in_tasks, ..ProtoSettings::default() };
    let listen = listen_address(transport);
    let server = Server::bind(&listen, settings.server_config(), BenchServer::new(BenchImpl::new()))
        .await
        .map_err(|e| BenchError::connect(&listen, e))?;
    let addr = server.local_addr().to_string();
    let client = Client::connect(&addr, ClientConfig::default().proto(settings.proto()))
        .await
        .map_err(|e| BenchError::connect(&addr, e))?;
    let stub = BenchClient::new(client.clone());
    Ok((server, client, stub))
}

async fn measure(transport: &str, kind: CallKind, args: &CountsArgs) -> Result<Row, BenchError> {
    let (server, client, stub) = serve_and_connect(transport, args.handlers_in_tasks).await?;
    warm_up(&stub, kind, args).await?;
    let (client0, server0) = snapshot(&client, &server).await?;
    let m = measured_calls(&stub, kind, args).await?;
    let (client1, server1) = snapshot(&client, &server).await?;
    drop(stub);
    drop(client);
    server.shutdown().await;

    let per_call = |d: u64| d as f64 / args.calls as f64;
    Ok(Row {
        transport: transport.to_string(),
        call: kind.label(args.size),
        allocations: m.alloc.map(|(a, b)| per_call(b.allocations - a.allocations)),
        bytes: m.alloc.map(|(a, b)| per_call(b.bytes - a.bytes)),
        caller_polls: per_call(m.caller_polls),
        caller_passes: per_call(client1.caller_passes - client0.caller_passes),
        client_driver_polls: per_call(client1.driver_polls - client0.driver_polls),
        server_driver_polls: Some(per_call(server1.driver_polls - server0.driver_polls)),
        handlers_spawned: Some(per_call(server1.handlers_spawned - server0.handlers_spawned)),
        client_send_posts: per_call(client1.transport.send_posts - client0.transport.send_posts),
        server_send_posts: Some(per_call(server1.transport.send_posts - server0.transport.send_posts)),
    })
}

/// The echo with `--outstanding` calls in flight: one task per call in flight, each making its
/// share of `--calls` calls in a loop. The tasks are spawned and wait at a gate before the counts
/// are read, and every payload is shared before then, so that what is counted is the calls'.
async fn measure_pipelined(transport: &str, args: &CountsArgs) -> Result<Row, BenchError> {
    let (server, client, stub) = serve_and_connect(transport, args.handlers_in_tasks).await?;
    let per_task = (args.calls / args.outstanding as u64).max(1);
    let data = Bytes::from(vec![0x5au8; args.size]);
    // Shared from now on: a clone allocates nothing.
    drop(data.clone());
    // Warm-up at the same load: the connection's queues and tables grow to it here.
    let warm = (args.warmup / args.outstanding as u64).max(1);
    let (_already_open, open) = tokio::sync::watch::channel(true);
    for task in echo_tasks(&stub, &data, args.outstanding, warm, &open) {
        task.await.map_err(|e| BenchError::Call(format!("call task died: {e}")))??;
    }
    let (gate, opened) = tokio::sync::watch::channel(false);
    let tasks = echo_tasks(&stub, &data, args.outstanding, per_task, &opened);
    drop(opened);
    let (client0, server0) = snapshot(&client, &server).await?;
    let alloc0 = allocated();
    gate.send_replace(true);
    let mut caller_polls = 0;
    for task in tasks {
        caller_polls += task.await.map_err(|e| BenchError::Call(format!("call task died: {e}")))??;
    }
    let alloc1 = allocated();
    let (client1, server1) = snapshot(&client, &server).await?;
    drop(stub);
    drop(client);
    server.shutdown().await;

    let calls = per_task * args.outstanding as u64;
    let per_call = |d: u64| d as f64 / calls as f64;
    let alloc = alloc0.zip(alloc1);
    Ok(Row {
        transport: format!("{transport}, {} in flight", args.outstanding),
        call: CallKind::Echo.label(args.size),
        allocations: alloc.map(|(a, b)| per_call(b.allocations - a.allocations)),
        bytes: alloc.map(|(a, b)| per_call(b.bytes - a.bytes)),
        caller_polls: per_call(caller_polls),
        caller_passes: per_call(client1.caller_passes - client0.caller_passes),
        client_driver_polls: per_call(client1.driver_polls - client0.driver_polls),
        server_driver_polls: Some(per_call(server1.driver_polls - server0.driver_polls)),
        handlers_spawned: Some(per_call(server1.handlers_spawned - server0.handlers_spawned)),
        client_send_posts: per_call(client1.transport.send_posts - client0.transport.send_posts),
        server_send_posts: Some(per_call(server1.transport.send_posts - server0.transport.send_posts)),
    })
}

/// `tasks` tasks, each making `calls` echo calls of `data` once `gate` is open; each returns
/// the polls of its calls.
fn echo_tasks(
    stub: &BenchClient,
    data: &Bytes,
    tasks: usize,
    calls: u64,
    gate: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<Result<u64, BenchError>>> {
    (0..tasks)
        .map(|_| {
            let (stub, data, mut gate) = (stub.clone(), data.clone(), gate.clone());
            tokio::spawn(async move {
                gate.wait_for(|open| *open).await.map_err(|_| BenchError::Call("gate dropped".into()))?;
                let mut polls = 0;
                for i in 0..calls {
                    call(&stub, CallKind::Echo, &data, i, &mut polls).await?;
                }
                Ok(polls)
            })
        })
        .collect()
}

/// The client alone in this process: the server runs in a child process (tcp), so that the
/// allocations counted are the client's.
async fn measure_client_alone(kind: CallKind, args: &CountsArgs) -> Result<Row, BenchError> {
    let settings = ProtoSettings::default();
    let server = ServerProcess::spawn(&ServerCommand {
        system: System::RpcCore,
        listen: "tcp://127.0.0.1:0".into(),
        settings,
        cpu: None,
        threads: 1,
    })?;
    let addr = server.addr().to_string();
    let client = Client::connect(&addr, ClientConfig::default().proto(settings.proto()))
        .await
        .map_err(|e| BenchError::connect(&addr, e))?;
    let stub = BenchClient::new(client.clone());
    warm_up(&stub, kind, args).await?;
    let client0 = quiet_stats(&client).await?;
    let m = measured_calls(&stub, kind, args).await?;
    let client1 = quiet_stats(&client).await?;
    drop(stub);
    drop(client);
    server.stop()?;

    let per_call = |d: u64| d as f64 / args.calls as f64;
    Ok(Row {
        transport: "tcp, server in a child process (client alone)".to_string(),
        call: kind.label(args.size),
        allocations: m.alloc.map(|(a, b)| per_call(b.allocations - a.allocations)),
        bytes: m.alloc.map(|(a, b)| per_call(b.bytes - a.bytes)),
        caller_polls: per_call(m.caller_polls),
        caller_passes: per_call(client1.caller_passes - client0.caller_passes),
        client_driver_polls: per_call(client1.driver_polls - client0.driver_polls),
        server_driver_polls: None,
        handlers_spawned: None,
        client_send_posts: per_call(client1.transport.send_posts - client0.transport.send_posts),
        server_send_posts: None,
    })
}

/// One call, its polls counted in `polls`; the answer must be the expected one.
async fn call(
    stub: &BenchClient,
    kind: CallKind,
    data: &Bytes,
    i: u64,
    polls: &mut u64,
) -> Result<(), BenchError> {
    match kind {
        CallKind::Echo => {
            let call = pin!(stub.echo(data.clone()));
            let got = CountPolls { inner: call, polls }.await.map_err(|e| BenchError::Call(e.to_string()))?;
            match got.len() == data.len() {
                true => Ok(()),
                false => Err(BenchError::Call(format!("echo of {} B returned {} B", data.len(), got.len()))),
            }
        }
        CallKind::Increment => {
            let call = pin!(stub.increment(i));
            let got = CountPolls { inner: call, polls }.await.map_err(|e| BenchError::Call(e.to_string()))?;
            match got == i.wrapping_add(1) {
                true => Ok(()),
                false => Err(BenchError::Call(format!("increment of {i} returned {got}"))),
            }
        }
    }
}

/// The client's counters once the connection is quiet.
async fn quiet_stats(client: &Client) -> Result<ConnStats, BenchError> {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    client.stats().await.map_err(|e| BenchError::Call(format!("client stats: {e}")))
}

/// Both sides' counters once the connection is quiet: the server publishes its counters when
/// its driver goes idle, so the tasks get a few turns first.
async fn snapshot(client: &Client, server: &Server) -> Result<(ConnStats, ConnStats), BenchError> {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    let c = client.stats().await.map_err(|e| BenchError::Call(format!("client stats: {e}")))?;
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    Ok((c, server.stats()))
}

fn print(args: &CountsArgs, rows: &[Row]) {
    println!(
        "{} calls after {} warm-up, one outstanding, client and server in this process (current-thread \
         runtime) unless said otherwise (\"N in flight\": N tasks calling at once, {} calls in all); the \
         server's handlers {}; per call:",
        args.calls,
        args.warmup,
        (args.calls / args.outstanding.max(1) as u64).max(1) * args.outstanding as u64,
        match args.handlers_in_tasks {
            true => "in tasks of their own (`--handlers-in-tasks`, as ServerConfig's default for unmarked methods)",
            false => "in the connection's driver (methods marked #[rpc(inline)], ServerConfig's default)",
        }
    );
    println!();
    println!(
        "| transport | call | allocations | bytes allocated | caller polls | caller passes | client driver polls | server driver polls | handler tasks | SEND posts (client / server) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let opt = |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {:.3} / {} |",
            r.transport,
            r.call,
            opt(r.allocations, 2),
            opt(r.bytes, 0),
            r.caller_polls,
            r.caller_passes,
            r.client_driver_polls,
            opt(r.server_driver_polls, 2),
            opt(r.handlers_spawned, 2),
            r.client_send_posts,
            opt(r.server_send_posts, 3),
        );
    }
    if rows.iter().any(|r| r.allocations.is_none()) {
        println!();
        println!("allocations: n/a (build rpc-bench with `--features count-allocs` to count them)");
    }
}

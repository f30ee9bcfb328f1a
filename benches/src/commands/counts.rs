//! `rpc-bench counts`: what one small call costs in allocations and wake-ups, so that a
//! regression shows as a number, not as noise in a latency percentile.
//!
//! Per transport, in this process on a current-thread runtime: a server, a client, warm-up
//! calls, then `--calls` 32 B echo calls through the generated stub, one outstanding. Printed per
//! call:
//!
//! * allocations and bytes allocated (the whole process: client and server), counted by the
//!   global allocator of `rpc-bench` when it is built with `--features count-allocs`;
//! * polls of the calling future (a poll-counting wrapper around each call);
//! * polls of the client's and of the server's connection driver ([`rpc_core::ConnStats`]);
//! * handler tasks the server spawned.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};

use bytes::Bytes;
use rpc_core::{Client, ClientConfig, ConnStats, Server};

use crate::cli::CountsArgs;
use crate::service::{BenchClient, BenchImpl, BenchServer};
use crate::target::ProtoSettings;
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

/// The figures of one transport, per call.
#[derive(Debug, Clone)]
struct Row {
    transport: String,
    allocations: Option<f64>,
    bytes: Option<f64>,
    caller_polls: f64,
    client_driver_polls: f64,
    server_driver_polls: f64,
    handlers_spawned: f64,
}

pub(super) async fn counts(args: CountsArgs) -> Result<(), BenchError> {
    if args.calls == 0 {
        return Err(BenchError::Usage("--calls must be at least 1".into()));
    }
    let mut rows = Vec::new();
    for transport in &args.transports {
        rows.push(measure(transport, &args).await?);
    }
    print(&args, &rows);
    Ok(())
}

async fn measure(transport: &str, args: &CountsArgs) -> Result<Row, BenchError> {
    let settings = ProtoSettings::default();
    let listen = listen_address(transport);
    let server = Server::bind(&listen, settings.server_config(), BenchServer::new(BenchImpl::new()))
        .await
        .map_err(|e| BenchError::connect(&listen, e))?;
    let addr = server.local_addr().to_string();
    let client = Client::connect(&addr, ClientConfig::default().proto(settings.proto()))
        .await
        .map_err(|e| BenchError::connect(&addr, e))?;
    let stub = BenchClient::new(client.clone());
    let data = Bytes::from(vec![0x5au8; args.size]);
    let mut ignored = 0;
    for _ in 0..args.warmup {
        echo(&stub, &data, &mut ignored).await?;
    }
    let (client0, server0) = snapshot(&client, &server).await?;
    let mut caller_polls = 0;
    let alloc0 = allocated();
    for _ in 0..args.calls {
        echo(&stub, &data, &mut caller_polls).await?;
    }
    let alloc1 = allocated();
    let (client1, server1) = snapshot(&client, &server).await?;
    drop(stub);
    drop(client);
    server.shutdown().await;

    let n = args.calls as f64;
    let per_call = |d: u64| d as f64 / n;
    let alloc = alloc0.zip(alloc1);
    Ok(Row {
        transport: transport.to_string(),
        allocations: alloc.map(|(a, b)| per_call(b.allocations - a.allocations)),
        bytes: alloc.map(|(a, b)| per_call(b.bytes - a.bytes)),
        caller_polls: per_call(caller_polls),
        client_driver_polls: per_call(client1.driver_polls - client0.driver_polls),
        server_driver_polls: per_call(server1.driver_polls - server0.driver_polls),
        handlers_spawned: per_call(server1.handlers_spawned - server0.handlers_spawned),
    })
}

/// One echo call, its polls counted in `polls`; the answer must be the same size.
async fn echo(stub: &BenchClient, data: &Bytes, polls: &mut u64) -> Result<(), BenchError> {
    let call = pin!(stub.echo(data.clone()));
    let got = CountPolls { inner: call, polls }.await.map_err(|e| BenchError::Call(e.to_string()))?;
    match got.len() == data.len() {
        true => Ok(()),
        false => Err(BenchError::Call(format!("echo of {} B returned {} B", data.len(), got.len()))),
    }
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
        "{} B echo, {} calls after {} warm-up, one outstanding, client and server in this process \
         (current-thread runtime); per call:",
        args.size, args.calls, args.warmup
    );
    println!();
    println!(
        "| transport | allocations | bytes allocated | caller polls | client driver polls | server driver polls | handler tasks |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let opt = |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    for r in rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.transport,
            opt(r.allocations, 2),
            opt(r.bytes, 0),
            r.caller_polls,
            r.client_driver_polls,
            r.server_driver_polls,
            r.handlers_spawned,
        );
    }
    if rows.iter().any(|r| r.allocations.is_none()) {
        println!();
        println!("allocations: n/a (build rpc-bench with `--features count-allocs` to count them)");
    }
}

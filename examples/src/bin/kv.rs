//! The key-value example: `kv server`, `kv client`, and `kv demo` (both, as two processes).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use examples::metrics::Summary;
use examples::{KvClient, KvServer, MemoryKv};
use rpc_core::{CallOptions, Client, ClientConfig, ConnStats, Server, ServerConfig};

#[derive(Parser)]
#[command(about = "Key-value service over rpc-core")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve until interrupted.
    Server {
        /// Address to bind: tcp://IP:PORT (port 0 picks one), rdma://IP:PORT.
        #[arg(long, default_value = "tcp://127.0.0.1:7000")]
        listen: String,
    },
    /// Run the demo workload against a server.
    Client {
        /// Server address.
        #[arg(long, default_value = "tcp://127.0.0.1:7000")]
        connect: String,
    },
    /// Start a server process and run the client workload against it.
    Demo {
        /// Address the demo server binds (port 0 picks a free one).
        #[arg(long, default_value = "tcp://127.0.0.1:0")]
        listen: String,
    },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // RUST_LOG=rpc_core=debug shows each call's span and its "call finished" event.
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    // rpc-core records per-method metrics through the `metrics` facade; this prints them. Replace
    // it with an exporter (e.g. metrics-exporter-prometheus) to scrape them instead.
    let metrics = Summary::install()?;
    let result = match Cli::parse().cmd {
        Cmd::Server { listen } => serve(&listen).await,
        Cmd::Client { connect } => workload(&connect).await,
        Cmd::Demo { listen } => demo(&listen).await,
    };
    println!("\nmetrics recorded by rpc-core in this process:\n{}", metrics.report());
    result
}

async fn serve(listen: &str) -> Result<(), Box<dyn std::error::Error>> {
    let server = Server::bind(listen, ServerConfig::default(), KvServer::new(MemoryKv::default())).await?;
    // The demo reads this line to learn the address.
    println!("listening on {}", server.local_addr());
    tokio::signal::ctrl_c().await?;
    server.shutdown().await;
    Ok(())
}

async fn demo(listen: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut child = ServerProcess::spawn(listen)?;
    let addr = child.address()?;
    println!("server process {} listening on {addr}", child.0.id());
    let result = workload(&addr).await;
    child.stop();
    result
}

/// The server as a child process; killed when dropped.
struct ServerProcess(Child);

impl ServerProcess {
    fn spawn(listen: &str) -> std::io::Result<ServerProcess> {
        let child = Command::new(std::env::current_exe()?)
            .args(["server", "--listen", listen])
            .stdout(Stdio::piped())
            .spawn()?;
        Ok(ServerProcess(child))
    }

    fn address(&mut self) -> Result<String, Box<dyn std::error::Error>> {
        let out = self.0.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        let addr =
            line.trim().strip_prefix("listening on ").ok_or_else(|| format!("unexpected: {line:?}"))?;
        Ok(addr.to_string())
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn workload(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(addr, ClientConfig::default()).await?;
    let kv = KvClient::new(client.clone()).with_options(CallOptions::new().deadline(Duration::from_secs(30)));
    println!("{:<34} {:>10} {:>10}  {:<24}", "call", "bytes", "time", "path (request/response)");
    let small = Bytes::from_static(b"hello, rdma");
    let big = Bytes::from(vec![0xabu8; 16 << 20]);
    timed(&client, "put(\"greeting\", 11 B)", small.len(), kv.put("greeting".into(), small.clone())).await?;
    let got = timed(&client, "get(\"greeting\")", small.len(), kv.get("greeting".into())).await?;
    assert_eq!(got.as_ref(), Some(&small), "small value round-trips");
    for i in 0..3 {
        timed(&client, &format!("put(\"k{i}\", 8 B)"), 8, kv.put(format!("k{i}"), Bytes::from(vec![i; 8])))
            .await?;
    }
    timed(&client, "put(\"blob\", 16 MiB)", big.len(), kv.put("blob".into(), big.clone())).await?;
    let got = timed(&client, "get(\"blob\")", big.len(), kv.get("blob".into())).await?;
    assert_eq!(got.as_ref(), Some(&big), "16 MiB value round-trips");
    let n = timed(&client, "len()", 0, kv.len()).await?;
    timed(&client, "delete(\"blob\")", 0, kv.delete("blob".into())).await?;
    let stats = client.stats().await?;
    println!(
        "{n} keys; {} eager and {} rendezvous requests; receives with no credit: {}; keys registered/revoked: {}/{}",
        stats.proto.eager_sent,
        stats.proto.rendezvous_sent,
        stats.transport.recv_unexpected,
        stats.transport.regions_registered,
        stats.transport.regions_revoked,
    );
    Ok(())
}

/// Runs one call, printing its time and the path each direction took (from the counters).
async fn timed<T>(
    client: &Client,
    what: &str,
    bytes: usize,
    call: impl std::future::Future<Output = Result<T, rpc_core::CallError>>,
) -> Result<T, Box<dyn std::error::Error>> {
    let before = client.stats().await?;
    let start = Instant::now();
    let out = call.await?;
    let elapsed = start.elapsed();
    let after = client.stats().await?;
    println!("{what:<34} {bytes:>10} {:>10}  {}", format!("{elapsed:.1?}"), paths(&before, &after));
    Ok(out)
}

fn paths(before: &ConnStats, after: &ConnStats) -> String {
    let request =
        if after.proto.rendezvous_sent > before.proto.rendezvous_sent { "rendezvous" } else { "eager" };
    let response = if after.proto.rendezvous_received > before.proto.rendezvous_received {
        "rendezvous"
    } else {
        "eager"
    };
    format!("{request}/{response}")
}

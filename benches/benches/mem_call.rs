//! One call over the `mem` transport through the whole runtime (client handle, both drivers, the
//! generated stub and handler), client and server on one current-thread runtime.

use std::sync::atomic::{AtomicUsize, Ordering};

use benches::service::{BenchClient, BenchImpl, BenchServer};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rpc_core::{Client, ClientConfig, Server, ServerConfig};

static NEXT: AtomicUsize = AtomicUsize::new(0);

async fn setup() -> (Server, BenchClient) {
    let name = format!("mem://criterion-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let server =
        Server::bind(&name, ServerConfig::default(), BenchServer::new(BenchImpl::new())).await.expect("bind");
    let client = Client::connect(&name, ClientConfig::default()).await.expect("connect");
    (server, BenchClient::new(client))
}

fn mem_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (_server, client) = rt.block_on(setup());
    let mut g = c.benchmark_group("mem_call");
    for size in [32usize, 4096, 64 << 10, 1 << 20] {
        let payload = Bytes::from(vec![3u8; size]);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("echo", size), &payload, |b, p| {
            b.to_async(&rt).iter(|| async { client.echo(p.clone()).await.expect("echo") })
        });
    }
    g.finish();
}

criterion_group!(benches, mem_call);
criterion_main!(benches);

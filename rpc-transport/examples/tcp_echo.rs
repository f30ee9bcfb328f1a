//! The transport alone, without the protocol and its codec: a rendezvous echo over tcp, with and
//! without push, on one current-thread runtime (like `rpc-bench run --in-process`).
//!
//! Each call: the client registers its payload and SENDs the descriptor; the server READs it,
//! registers what it read and SENDs that descriptor back; the client READs it; both revoke.
//! READ destinations are reused from call to call, as the protocol's buffer cache does.
//!
//! ```sh
//! cargo run --release -p rpc-transport --example tcp_echo -- 16777216 3
//! ```
//! (payload size in bytes, seconds per measurement; prints GB/s as `rpc-bench` counts them:
//! payload bytes times calls per second.)

use std::future::poll_fn;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rpc_transport::{Buf, Completion, ConnParams, Connection, RegionDesc, TcpSettings, TransportError};

fn encode(d: &RegionDesc) -> Bytes {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(&d.addr.to_le_bytes());
    out.extend_from_slice(&d.len.to_le_bytes());
    out.extend_from_slice(&d.rkey.to_le_bytes());
    Bytes::from(out)
}

fn decode(b: &[u8]) -> RegionDesc {
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    RegionDesc { addr: u64_at(0), len: u64_at(8), rkey: u32::from_le_bytes(b[16..20].try_into().expect("4")) }
}

/// The next receive or READ completion (SEND completions are skipped).
async fn next(conn: &mut dyn Connection) -> Result<Completion, TransportError> {
    loop {
        let mut out = Vec::new();
        poll_fn(|cx| conn.poll_completions(cx, &mut out, 1)).await?;
        match out.pop() {
            Some(Completion::Send { result, .. }) => result?,
            Some(c) => return Ok(c),
            None => {}
        }
    }
}

async fn recv_desc(conn: &mut dyn Connection) -> Result<RegionDesc, TransportError> {
    match next(conn).await? {
        Completion::Recv { buf } => {
            let desc = decode(buf.bytes());
            conn.post_recv(buf)?;
            Ok(desc)
        }
        other => panic!("expected a receive, got {other:?}"),
    }
}

async fn read(conn: &mut dyn Connection, remote: RegionDesc) -> Result<Buf, TransportError> {
    let dst = conn.pool().alloc(remote.len as usize)?;
    conn.post_read(1, remote, dst)?;
    match next(conn).await? {
        Completion::Read { result, .. } => Ok(result.expect("READ")),
        other => panic!("expected a READ, got {other:?}"),
    }
}

/// Calls per second of echo of `size` bytes for `secs`, with the given push window on both sides.
async fn measure(size: usize, secs: f64, push_window: u64) -> Result<f64, TransportError> {
    let params = ConnParams { tcp: TcpSettings::default().push_window(push_window), ..ConnParams::default() };
    let addr = "tcp://127.0.0.1:0".parse().expect("address");
    let mut listener = rpc_transport::listen(&addr, params.clone()).await?;
    let addr = listener.local_addr();
    let (client, server) = tokio::join!(rpc_transport::connect(&addr, params), listener.accept());
    let (mut client, mut server) = (client?, server?);
    let payload = Bytes::from(vec![0x5a; size]);
    let (start, mut calls) = (Instant::now(), 0u64);
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let request = client.register(payload.clone())?;
        client.post_send(1, encode(&request).into())?;
        let remote = recv_desc(&mut *server).await?;
        let got = read(&mut *server, remote).await?;
        let response = server.register(got.freeze())?;
        server.post_send(2, encode(&response).into())?;
        let remote = recv_desc(&mut *client).await?;
        let echoed = read(&mut *client, remote).await?;
        assert_eq!(echoed.len(), size);
        client.deregister(request)?;
        server.deregister(response)?;
        calls += 1;
    }
    Ok(calls as f64 / start.elapsed().as_secs_f64())
}

fn main() -> Result<(), TransportError> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16 << 20);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for (name, window) in [("no push", 0), ("push", 32 << 20), ("no push", 0), ("push", 32 << 20)] {
        let rate = rt.block_on(measure(size, secs, window))?;
        println!("{name:>8}: {size} B echo: {rate:8.1} calls/s, {:.3} GB/s", rate * size as f64 / 1e9);
    }
    Ok(())
}

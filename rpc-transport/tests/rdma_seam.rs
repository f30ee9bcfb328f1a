//! The seam's behaviour over real verbs (soft-RoCE `rxe0` or soft-iWARP `siw0`), the same cases as
//! `conformance.rs` runs on `mem` and `tcp`, adapted where verbs differ (documented per case).
//!
//! Every test here is `#[ignore]`: it needs an RDMA device and is run inside the project's VM:
//!
//! ```text
//! cargo test -p rpc-transport --features rdma --test rdma_seam --no-run   # on the host
//! RPC_RDMA_TEST_ADDR=10.0.2.15 RPC_RDMA_DEVICE=rxe0 \
//!     scripts/vm/run.sh -- target/debug/deps/rdma_seam-<hash> --ignored --test-threads 2
//! ```
//!
//! Run with `--ignored` but without `RPC_RDMA_TEST_ADDR`, each test fails (never passes without
//! having run).
#![cfg(feature = "rdma")]

mod common;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rpc_transport::rdma::{self, RdmaConfig};
use rpc_transport::{
    Address, Completion, ConnParams, Connection, KeyPolicy, ReadError, RecvBuffer, RegionDesc, SendBuf,
    TransportError,
};

/// Bound on every wait (user code runs ~17x slower in the TCG VM).
const WAIT: Duration = Duration::from_secs(60);

fn test_ip() -> IpAddr {
    let Ok(raw) = std::env::var("RPC_RDMA_TEST_ADDR") else {
        panic!(
            "RPC_RDMA_TEST_ADDR is not set: these tests need an RDMA device. Run them inside the VM \
             (scripts/vm/run.sh) with RPC_RDMA_TEST_ADDR=10.0.2.15 and RPC_RDMA_DEVICE=rxe0|siw0"
        )
    };
    raw.parse().unwrap_or_else(|e| panic!("RPC_RDMA_TEST_ADDR={raw:?}: {e}"))
}

/// A port no other test of this run uses.
fn next_addr() -> SocketAddr {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base: u16 = std::env::var("RPC_RDMA_TEST_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(17471);
    SocketAddr::new(test_ip(), base + NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Whether the device under test is iWARP (`RPC_RDMA_DEVICE=siw0`), where a few failure modes
/// look different (see the cases).
fn iwarp() -> bool {
    std::env::var("RPC_RDMA_DEVICE").is_ok_and(|d| d.starts_with("siw") || d.starts_with("iw"))
}

/// How a READ that the peer's NIC refuses (wrong or revoked key, out of bounds) completes:
/// `InvalidKey` on IB/RoCE (a remote access error completion); on iWARP the peer terminates the
/// connection and the initiator only sees the READ flushed.
fn refused(rkey: u32) -> Result<Vec<u8>, ReadError> {
    if iwarp() {
        Err(ReadError::Flushed)
    } else {
        Err(ReadError::InvalidKey(rkey))
    }
}

fn params(recv_depth: u32, recv_size: u32) -> ConnParams {
    ConnParams { recv_depth, recv_size, ..ConnParams::default() }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A connected (client, server) pair through the public `rdma://` addresses.
async fn pair(client: ConnParams, server: ConnParams) -> (Box<dyn Connection>, Box<dyn Connection>) {
    let addr = Address::Rdma(next_addr());
    let mut l = within("listen", rpc_transport::listen(&addr, server)).await.expect("listen");
    assert_eq!(l.local_addr(), addr);
    let (c, s) =
        within("connection setup", async { tokio::join!(rpc_transport::connect(&addr, client), l.accept()) })
            .await;
    let (c, s) = (c.expect("connect"), s.expect("accept"));
    assert_eq!((c.info().backend, s.info().backend), ("rdma", "rdma"));
    (c, s)
}

async fn next(conn: &mut dyn Connection) -> Result<Completion, TransportError> {
    let mut out = Vec::with_capacity(1);
    within("a completion", futures::future::poll_fn(|cx| conn.poll_completions(cx, &mut out, 1))).await?;
    assert_eq!(out.len(), 1, "poll_completions returned Ready(Ok) with nothing moved");
    Ok(out.pop().unwrap())
}

async fn recv(conn: &mut dyn Connection) -> Vec<u8> {
    match next(conn).await.expect("completion") {
        Completion::Recv { buf } => {
            let bytes = buf.bytes().to_vec();
            conn.post_recv(buf).expect("re-post receive");
            bytes
        }
        other => panic!("expected a receive, got {other:?}"),
    }
}

async fn send_done(conn: &mut dyn Connection) -> (u64, Result<(), TransportError>) {
    match next(conn).await.expect("completion") {
        Completion::Send { wr_id, result } => (wr_id, result),
        other => panic!("expected a send completion, got {other:?}"),
    }
}

async fn read_done(conn: &mut dyn Connection) -> (u64, Result<Vec<u8>, ReadError>) {
    match next(conn).await.expect("completion") {
        Completion::Read { wr_id, result } => (wr_id, result.map(|b| b.to_vec())),
        other => panic!("expected a READ completion, got {other:?}"),
    }
}

async fn send_ok(conn: &mut dyn Connection, wr_id: u64, msg: &[u8]) {
    conn.post_send(wr_id, Bytes::copy_from_slice(msg).into()).expect("post_send");
    let (id, result) = send_done(conn).await;
    assert_eq!(id, wr_id);
    result.expect("send completion");
}

async fn drain_to_error(conn: &mut dyn Connection) -> (Vec<Completion>, TransportError) {
    let mut seen = Vec::new();
    loop {
        match next(conn).await {
            Ok(c) => seen.push(c),
            Err(e) => return (seen, e),
        }
    }
}

/// After a verbs error completion the RC QP is in the error state: the connection fails, and
/// `poll_completions` reports `Disconnected` once everything is flushed. Checks that, and that
/// the peer sees the connection go too.
async fn expect_connection_failed(client: &mut dyn Connection, server: &mut dyn Connection) {
    let (seen, err) = drain_to_error(client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    assert!(seen.iter().all(|c| !matches!(c, Completion::Read { result: Ok(_), .. })), "{seen:?}");
    assert!(client.post_send(99, Bytes::new().into()).is_err(), "posting on a failed connection");
    server.close();
    let (_, err) = drain_to_error(server).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
}

macro_rules! rdma_tests {
    ($($case:ident),* $(,)?) => {
        $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "needs an RDMA device: run inside scripts/vm/run.sh with RPC_RDMA_TEST_ADDR"]
        async fn $case() {
            super::$case().await
        })*
    };
}

mod verbs {
    rdma_tests!(
        round_trip,
        headed_messages_arrive_whole,
        completions_in_order,
        zero_byte_message,
        large_messages_use_send_slabs,
        message_size_limit,
        connection_info,
        read_small_region,
        read_64_mib_region,
        many_reads_in_flight,
        more_reads_than_max_rd_atomic,
        read_with_wrong_key_fails_connection,
        read_out_of_bounds_fails_connection,
        read_after_deregister,
        read_destination_must_match,
        unexpected_message_fails_connection,
        peer_close_flushes_and_errors,
        local_close_flushes_and_errors,
        posted_buffer_too_small_fails_connection,
        connect_to_closed_port_is_refused,
        listen_on_any_address_and_port_zero,
        many_connections_one_listener,
        configuration_errors_are_typed,
        sends_larger_than_our_own_receive_size,
        silent_peer_does_not_block_the_listener,
        setups_in_progress_are_bounded,
        pool_memory_needs_no_registration,
        pool_keys_and_per_call_keys,
        small_sends_go_unsignaled,
        reads_across_page_boundaries,
        busy_poll_window_spins_then_sleeps,
        late_hello_is_nudged_harmlessly,
    );
}

async fn round_trip() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    send_ok(&mut *client, 1, b"ping").await;
    assert_eq!(recv(&mut *server).await, b"ping");
    send_ok(&mut *server, 2, b"pong").await;
    assert_eq!(recv(&mut *client).await, b"pong");
    let (c, s) = (client.counters(), server.counters());
    assert_eq!((c.sends, c.recvs, s.sends, s.recvs), (1, 1, 1, 1));
    assert_eq!(s.recvs_posted, 64 + 1, "initial receives plus the re-post");
    assert_eq!(c.recv_unexpected + s.recv_unexpected, 0);
}

/// A message given as a head and a body (`SendBuf::Headed`) arrives as one message: inline as
/// two SGEs when it fits the inline size (the head lies inside the `SendBuf`, named where it is
/// when posted), else copied into a send slab, or into a buffer registered for it alone.
async fn headed_messages_arrive_whole() {
    let (mut client, mut server) = pair(params(8, 64 << 10), params(8, 64 << 10)).await;
    let inline = client.info().copied_sends as usize;
    let sizes = [0, 1, inline.saturating_sub(40).max(1), inline + 1, 8000, (64 << 10) - 40];
    for (i, body_len) in sizes.into_iter().enumerate() {
        common::headed_message_arrives_whole(&mut *client, &mut *server, i as u8, body_len).await;
    }
    assert_eq!(client.counters().recv_unexpected + server.counters().recv_unexpected, 0);
}

async fn completions_in_order() {
    let (mut client, mut server) = pair(params(8, 64), params(200, 64)).await;
    for i in 0..150u64 {
        client.post_send(i, Bytes::from(i.to_le_bytes().to_vec()).into()).unwrap();
    }
    for i in 0..150u64 {
        let (id, result) = send_done(&mut *client).await;
        assert_eq!(id, i, "send completions in posting order");
        result.unwrap();
    }
    for i in 0..150u64 {
        assert_eq!(recv(&mut *server).await, i.to_le_bytes(), "messages in sending order");
    }
}

/// Small SENDs go unsignaled (their completions are reported at once, still in posting order);
/// far more of them than the send queue holds go through one at a time (a signaled one in
/// `signal_every` frees the queue), and after the peer closes the connection still ends in an
/// error: nothing waits for unsignaled requests no completion will report.
async fn small_sends_go_unsignaled() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    for i in 0..600u64 {
        send_ok(&mut *client, i, &i.to_le_bytes()).await;
        assert_eq!(recv(&mut *server).await, i.to_le_bytes());
    }
    let c = client.counters();
    assert_eq!(c.sends, 600);
    assert!(c.sends_unsignaled >= 500, "most small SENDs unsignaled: {c:?}");
    for i in 0..50u64 {
        client.post_send(1000 + i, Bytes::from(vec![i as u8; 16]).into()).unwrap();
    }
    for i in 0..50u64 {
        let (id, result) = send_done(&mut *client).await;
        assert_eq!(id, 1000 + i, "send completions in posting order");
        result.unwrap();
    }
    for i in 0..50u64 {
        assert_eq!(recv(&mut *server).await, vec![i as u8; 16]);
    }
    server.close();
    let (_, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
}

async fn zero_byte_message() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    send_ok(&mut *client, 7, b"").await;
    send_ok(&mut *client, 8, b"after").await;
    assert_eq!(recv(&mut *server).await, b"");
    assert_eq!(recv(&mut *server).await, b"after");
}

/// Messages too large to go inline are copied through registered send slabs; more of them than
/// there are slabs wait in the backlog, in order.
async fn large_messages_use_send_slabs() {
    let (mut client, mut server) = pair(params(8, 8192), params(300, 8192)).await;
    let n = 200u64; // more than the 64 send slabs
    for i in 0..n {
        let mut msg = pattern(8192);
        msg[..8].copy_from_slice(&i.to_le_bytes());
        client.post_send(i, Bytes::from(msg).into()).unwrap();
    }
    for i in 0..n {
        let (id, result) = send_done(&mut *client).await;
        assert_eq!(id, i);
        result.unwrap();
    }
    for i in 0..n {
        let got = recv(&mut *server).await;
        assert_eq!(got.len(), 8192);
        assert_eq!(got[..8], i.to_le_bytes());
        assert_eq!(got[8..], pattern(8192)[8..]);
    }
}

async fn message_size_limit() {
    let (mut client, mut server) = pair(params(4, 64), params(4, 100)).await;
    assert_eq!(client.info().peer_recv_size, 100);
    let exact = pattern(100);
    send_ok(&mut *client, 1, &exact).await;
    assert_eq!(recv(&mut *server).await, exact);
    match client.post_send(2, Bytes::from(pattern(101)).into()) {
        Err(TransportError::MessageTooLarge { len: 101, max: 100 }) => {}
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    send_ok(&mut *client, 3, b"still here").await;
    assert_eq!(recv(&mut *server).await, b"still here");
    // In a batch (posted as one chain).
    common::batch_stops_at_a_send_too_large(&mut *client, &mut *server, 100).await;
}

/// As on mem/tcp, except `max_reads_in_flight` (negotiated with the device) and `peer`.
async fn connection_info() {
    let client_params = ConnParams {
        recv_depth: 3,
        recv_size: 300,
        private_data: Bytes::from_static(b"from client"),
        ..ConnParams::default()
    };
    let server_params = ConnParams {
        recv_depth: 5,
        recv_size: 500,
        private_data: Bytes::from_static(b"from server"),
        ..ConnParams::default()
    };
    let (client, server) = pair(client_params, server_params).await;
    let (ci, si) = (client.info(), server.info());
    assert_eq!(&ci.peer_private_data[..], b"from server");
    assert_eq!(&si.peer_private_data[..], b"from client");
    assert_eq!((ci.peer_recv_depth, ci.peer_recv_size), (5, 500));
    assert_eq!((si.peer_recv_depth, si.peer_recv_size), (3, 300));
    assert_eq!(ci.max_read_size, 1 << 30);
    assert!(ci.max_reads_in_flight >= 1 && si.max_reads_in_flight >= 1);
    eprintln!(
        "negotiated READs in flight: client {}, server {}",
        ci.max_reads_in_flight, si.max_reads_in_flight
    );
    assert!(ci.peer.contains(&test_ip().to_string()), "{}", ci.peer);
    assert_eq!(client.counters().recvs_posted, 3);
    assert_eq!(server.counters().recvs_posted, 5);
}

/// As on mem/tcp, except `reads_served`: the NIC serves READs without telling software.
async fn read_small_region() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"hello, registered world")).unwrap();
    assert_eq!(region.len, 23);
    client.post_read(1, region, vec![0; 23].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (1, Ok(b"hello, registered world".to_vec())));
    let part = RegionDesc { addr: region.addr + 7, len: 10, rkey: region.rkey };
    client.post_read(2, part, vec![0; 10].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (2, Ok(b"registered".to_vec())));
    let empty = RegionDesc { addr: region.addr + 23, len: 0, rkey: region.rkey };
    client.post_read(3, empty, Vec::new().into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (3, Ok(Vec::new())));
    let c = client.counters();
    assert_eq!((c.reads_issued, c.bytes_read), (3, 33));
    assert_eq!(server.counters().regions_registered, 1);
}

async fn read_64_mib_region() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let data = pattern(64 << 20);
    let region = server.register(Bytes::from(data.clone())).unwrap();
    let started = std::time::Instant::now();
    client.post_read(9, region, vec![0; 64 << 20].into()).unwrap();
    let (id, result) = read_done(&mut *client).await;
    eprintln!("64 MiB READ took {:?}", started.elapsed());
    assert_eq!(id, 9);
    assert!(result.expect("64 MiB READ") == data, "64 MiB READ returned different bytes");
    assert_eq!(client.counters().bytes_read, 64 << 20);
}

async fn many_reads_in_flight() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let data = pattern(4096);
    let region = server.register(Bytes::from(data.clone())).unwrap();
    let max = client.info().max_reads_in_flight as u64;
    for i in 0..max {
        let part = RegionDesc { addr: region.addr + i * 16, len: 100, rkey: region.rkey };
        client.post_read(i, part, vec![0; 100].into()).unwrap();
    }
    let mut seen = vec![false; max as usize];
    for _ in 0..max {
        let (id, result) = read_done(&mut *client).await;
        let off = id as usize * 16;
        assert_eq!(result.unwrap(), &data[off..off + 100]);
        assert!(!std::mem::replace(&mut seen[id as usize], true), "READ {id} completed twice");
    }
}

/// Verbs-specific: READs beyond the negotiated `max_rd_atomic` wait in software and all complete.
async fn more_reads_than_max_rd_atomic() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let data = pattern(1 << 20);
    let region = server.register(Bytes::from(data.clone())).unwrap();
    let n = u64::from(client.info().max_reads_in_flight) * 4 + 3;
    for i in 0..n {
        let len = 4096 + i * 100;
        let part = RegionDesc { addr: region.addr + i * 1000, len, rkey: region.rkey };
        client.post_read(i, part, vec![0; len as usize].into()).unwrap();
    }
    let mut done = 0;
    while done < n {
        let (id, result) = read_done(&mut *client).await;
        let (off, len) = (id as usize * 1000, 4096 + id as usize * 100);
        assert_eq!(result.unwrap(), &data[off..off + len], "READ {id}");
        done += 1;
    }
    // The connection is still fine afterwards.
    send_ok(&mut *client, 1, b"after many reads").await;
    assert_eq!(recv(&mut *server).await, b"after many reads");
}

/// Differs from mem/tcp: on verbs a READ with a wrong key is a remote access error completion
/// after which the RC QP is in the error state. The READ completes with `InvalidKey` (`Flushed`
/// on iWARP, see `refused`), then the connection fails (everything else flushed,
/// `poll_completions` -> `Disconnected`) on both sides.
async fn read_with_wrong_key_fails_connection() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"private")).unwrap();
    let wrong = RegionDesc { rkey: region.rkey.wrapping_add(0x100), ..region };
    client.post_read(1, wrong, vec![0; 7].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (1, refused(wrong.rkey)));
    expect_connection_failed(&mut *client, &mut *server).await;
}

/// Differs from mem/tcp: verbs reports an out-of-bounds READ as the same remote access error as a
/// wrong key (`InvalidKey`), and the connection fails.
async fn read_out_of_bounds_fails_connection() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from(pattern(64))).unwrap();
    let past_end = RegionDesc { addr: region.addr + 1, len: 64, ..region };
    client.post_read(1, past_end, vec![0; 64].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (1, refused(region.rkey)));
    expect_connection_failed(&mut *client, &mut *server).await;
}

/// As on mem/tcp up to the revoked READ, which then fails the connection (see above).
async fn read_after_deregister() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"short-lived")).unwrap();
    client.post_read(1, region, vec![0; 11].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (1, Ok(b"short-lived".to_vec())));
    server.deregister(region).unwrap();
    assert_eq!(server.counters().regions_revoked, 1);
    assert!(matches!(server.deregister(region), Err(TransportError::UnknownKey(k)) if k == region.rkey));
    client.post_read(2, region, vec![0; 11].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (2, refused(region.rkey)));
    let s = server.counters();
    assert_eq!((s.regions_registered, s.regions_revoked), (1, 1));
    expect_connection_failed(&mut *client, &mut *server).await;
}

async fn read_destination_must_match() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"12345678")).unwrap();
    assert!(matches!(client.post_read(1, region, vec![0; 7].into()), Err(TransportError::InvalidRead(_))));
    let huge = RegionDesc { len: (1 << 30) + 1, ..region };
    assert!(matches!(client.post_read(2, huge, Vec::new().into()), Err(TransportError::InvalidRead(_))));
    assert_eq!(client.counters().reads_issued, 0);
}

/// Differs from mem/tcp: verbs has no overflow queue. A SEND that finds no receive posted is
/// retried (RNR, rxe) and then fails, counted in the sender's `recv_unexpected`; iWARP has no RNR
/// and the receiver terminates the connection. Either way the connection fails instead of
/// buffering, on both sides.
async fn unexpected_message_fails_connection() {
    let (mut client, mut server) = pair(params(4, 64), params(1, 64)).await;
    client.post_send(1, Bytes::from_static(b"one").into()).unwrap();
    client.post_send(2, Bytes::from_static(b"two").into()).unwrap();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    let results: Vec<_> = seen
        .iter()
        .filter_map(|c| match c {
            Completion::Send { wr_id, result } => Some((*wr_id, result.is_ok())),
            _ => None,
        })
        .collect();
    assert_eq!(results.first(), Some(&(1, true)), "{seen:?}");
    if iwarp() {
        // iWARP completes a SEND once it is on the wire; the receiver terminates the connection.
        assert!(results.iter().any(|&(id, _)| id == 2), "{seen:?}");
    } else {
        // The SEND met no posted receive (RNR retries exhausted). A small SEND goes unsignaled
        // and reported its completion when posted; either way its failure fails the connection.
        assert!(results.iter().any(|&(id, _)| id == 2), "{seen:?}");
        assert_eq!(client.counters().recv_unexpected, 1);
    }
    // The one posted receive got the first message.
    match next(&mut *server).await {
        Ok(Completion::Recv { buf }) => assert_eq!(buf.bytes(), b"one"),
        other => panic!("expected the first message, got {other:?}"),
    }
    let (_, err) = drain_to_error(&mut *server).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
}

async fn peer_close_flushes_and_errors() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from(pattern(1 << 20))).unwrap();
    for i in 0..8 {
        client.post_read(i, region, vec![0; 1 << 20].into()).unwrap();
        client.post_send(100 + i, Bytes::from_static(b"x").into()).unwrap();
    }
    server.close();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    let mut ids: Vec<u64> = seen
        .iter()
        .filter_map(|c| match c {
            Completion::Read { wr_id, result } => {
                assert!(matches!(result, Ok(v) if v.len() == 1 << 20) || result == &Err(ReadError::Flushed));
                Some(*wr_id)
            }
            Completion::Send { wr_id, result } => {
                assert!(matches!(result, Ok(()) | Err(TransportError::Disconnected(_))), "{result:?}");
                Some(*wr_id)
            }
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..8).chain(100..108).collect::<Vec<_>>());
    assert!(matches!(next(&mut *client).await, Err(TransportError::Disconnected(_))));
    assert!(client.post_send(1, Bytes::new().into()).is_err());
    assert!(client.post_read(1, region, vec![0; 1 << 20].into()).is_err());
    assert!(client.post_recv(RecvBuffer::new(8)).is_err());
    let (_, server_err) = drain_to_error(&mut *server).await;
    assert!(matches!(server_err, TransportError::Disconnected(_)));
}

async fn local_close_flushes_and_errors() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"abc")).unwrap();
    client.post_read(1, region, vec![0; 3].into()).unwrap();
    client.close();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    assert!(
        matches!(&seen[..], [Completion::Read { wr_id: 1, result }] if result.is_ok() || result == &Err(ReadError::Flushed)),
        "{seen:?}"
    );
    let (_, err) = drain_to_error(&mut *server).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    drop(client);
}

async fn posted_buffer_too_small_fails_connection() {
    let (mut client, mut server) = pair(params(4, 64), params(1, 64)).await;
    send_ok(&mut *client, 1, b"fits").await;
    match next(&mut *server).await.unwrap() {
        Completion::Recv { buf } => assert_eq!(buf.bytes(), b"fits"),
        other => panic!("expected a receive, got {other:?}"),
    }
    server.post_recv(RecvBuffer::new(4)).unwrap();
    client.post_send(2, Bytes::from_static(b"does not fit").into()).unwrap();
    let (_, err) = drain_to_error(&mut *server).await;
    assert!(matches!(err, TransportError::Malformed(_)), "{err:?}");
    let (_, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
}

/// Verbs-specific: nothing listens on the port -> a typed error, quickly, no hang.
async fn connect_to_closed_port_is_refused() {
    let addr = next_addr();
    let mut cfg = RdmaConfig::from_env();
    cfg.setup_timeout = Duration::from_secs(20);
    let err = within("connect to a closed port", rdma::connect_with(addr, ConnParams::default(), cfg))
        .await
        .expect_err("nothing listens there");
    let kind = rdma::RdmaError::find(&err);
    assert!(
        matches!(kind, Some(rdma::RdmaError::Rejected { .. } | rdma::RdmaError::Unreachable { .. })),
        "{err:?}"
    );
    assert!(matches!(err, TransportError::Connect { .. }), "{err:?}");
}

/// Verbs-specific: `0.0.0.0` listens on every RDMA device; port 0 picks a free port, which
/// `local_addr` reports.
async fn listen_on_any_address_and_port_zero() {
    let any = SocketAddr::new("0.0.0.0".parse().unwrap(), 0);
    let mut l = within("listen", rpc_transport::listen(&Address::Rdma(any), ConnParams::default()))
        .await
        .expect("listen on 0.0.0.0:0");
    let Address::Rdma(bound) = l.local_addr() else { panic!("not an rdma address") };
    assert_ne!(bound.port(), 0);
    let target = Address::Rdma(SocketAddr::new(test_ip(), bound.port()));
    let (c, s) = within("connection setup", async {
        tokio::join!(rpc_transport::connect(&target, ConnParams::default()), l.accept())
    })
    .await;
    let (mut client, mut server) = (c.expect("connect"), s.expect("accept"));
    send_ok(&mut *client, 1, b"via any").await;
    assert_eq!(recv(&mut *server).await, b"via any");
}

/// Several connections through one listener, used at the same time, then dropped in any order.
async fn many_connections_one_listener() {
    let addr = Address::Rdma(next_addr());
    let mut l = within("listen", rpc_transport::listen(&addr, params(4, 256))).await.expect("listen");
    let mut pairs = Vec::new();
    for _ in 0..4 {
        let (c, s) = within("connection setup", async {
            tokio::join!(rpc_transport::connect(&addr, params(4, 256)), l.accept())
        })
        .await;
        match (c, s) {
            (Ok(c), Ok(s)) => pairs.push((c, s)),
            (c, s) => panic!("connection {}: connect {c:?}, accept {s:?}", pairs.len()),
        }
    }
    for (i, (client, server)) in pairs.iter_mut().enumerate() {
        send_ok(&mut **client, i as u64, format!("conn {i}").as_bytes()).await;
        assert_eq!(recv(&mut **server).await, format!("conn {i}").as_bytes());
    }
    drop(l);
    let (mut c0, s0) = pairs.remove(0);
    drop(s0); // the peer of c0 goes away: c0 fails, the others are unaffected
    let (_, err) = drain_to_error(&mut *c0).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    for (i, (client, server)) in pairs.iter_mut().enumerate() {
        send_ok(&mut **server, i as u64, b"still up").await;
        assert_eq!(recv(&mut **client).await, b"still up");
    }
}

/// Verbs-specific: an unknown device or a missing GID index fail setup with typed errors.
async fn configuration_errors_are_typed() {
    let mut cfg = RdmaConfig::from_env();
    cfg.device = Some("no_such_dev0".into());
    let err = rdma::connect_with(next_addr(), ConnParams::default(), cfg).await.expect_err("unknown device");
    assert!(matches!(rdma::RdmaError::find(&err), Some(rdma::RdmaError::DeviceNotFound { .. })), "{err:?}");

    let mut cfg = RdmaConfig::from_env();
    cfg.gid_index = 999;
    cfg.setup_timeout = Duration::from_secs(20);
    let err =
        within("connect with GID index 999", rdma::connect_with(next_addr(), ConnParams::default(), cfg))
            .await
            .expect_err("bad GID index, or nothing listening");
    let found = rdma::RdmaError::find(&err);
    if iwarp() {
        // iWARP addresses by IP: the GID index does not apply, and the connect is refused.
        assert!(
            matches!(found, Some(rdma::RdmaError::Rejected { .. } | rdma::RdmaError::Unreachable { .. })),
            "{err:?}"
        );
    } else {
        assert!(matches!(found, Some(rdma::RdmaError::GidNotFound { index: 999, .. })), "{err:?}");
        assert!(err.to_string().contains("I/O") || matches!(err, TransportError::Io(_)), "{err:?}");
    }
}

/// Our send slabs are as large as our own receive size (300 here), not the peer's (64 KiB):
/// larger messages, up to the peer's receive size, go out from a buffer registered for each,
/// one at a time, in order with the others.
async fn sends_larger_than_our_own_receive_size() {
    let (mut client, mut server) = pair(params(8, 300), params(16, 64 << 10)).await;
    assert_eq!(client.info().peer_recv_size, 64 << 10);
    let sizes = [64 << 10, 299, 40_000, 300, 301, 64 << 10, 0, 5000];
    for (i, &len) in sizes.iter().enumerate() {
        let mut msg = pattern(len);
        if len >= 8 {
            msg[..8].copy_from_slice(&(i as u64).to_le_bytes());
        }
        client.post_send(i as u64, Bytes::from(msg).into()).unwrap();
    }
    for i in 0..sizes.len() as u64 {
        let (id, result) = send_done(&mut *client).await;
        assert_eq!(id, i, "send completions in posting order");
        result.unwrap();
    }
    for (i, &len) in sizes.iter().enumerate() {
        let got = recv(&mut *server).await;
        assert_eq!(got.len(), len, "message {i}");
        if len >= 8 {
            assert_eq!(got[..8], (i as u64).to_le_bytes(), "message {i} out of order");
            assert_eq!(got[8..], pattern(len)[8..], "message {i}");
        }
    }
    match client.post_send(99, Bytes::from(pattern((64 << 10) + 1)).into()) {
        Err(TransportError::MessageTooLarge { .. }) => {}
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
}

/// A peer that completes the rdma_cm exchange and never sends its hello.
fn silent_peer(addr: SocketAddr) -> tokio::task::JoinHandle<Result<rdma::RdmaConnection, TransportError>> {
    let mut cfg = RdmaConfig::from_env();
    cfg.silent_after_connect = true;
    cfg.setup_timeout = Duration::from_secs(50);
    tokio::spawn(rdma::connect_with(addr, ConnParams::default(), cfg))
}

/// Setup of accepted connections runs concurrently: a silent peer holds its own setup slot until
/// the handshake timeout, while other clients connect and are accepted meanwhile.
async fn silent_peer_does_not_block_the_listener() {
    let addr = next_addr();
    let timeout = Duration::from_secs(15);
    let server_params = ConnParams { handshake_timeout: timeout, ..ConnParams::default() };
    let mut l = rdma::listen_with(addr, server_params, RdmaConfig::from_env()).expect("listen");
    let silent = silent_peer(addr);
    tokio::time::sleep(Duration::from_millis(500)).await; // its request reaches the listener first
    for i in 0..2u64 {
        let (c, s) = within("a good client while the silent one waits", async {
            tokio::join!(rpc_transport::connect(&Address::Rdma(addr), ConnParams::default()), l.accept_rdma())
        })
        .await;
        let (mut client, mut server) = (c.expect("connect"), s.expect("accept"));
        send_ok(&mut *client, i, b"not blocked").await;
        assert_eq!(recv(&mut server).await, b"not blocked");
    }
    assert!(!silent.is_finished(), "the silent peer was dropped before its handshake timeout");
    // The listener gives up on it at the handshake timeout: its connect fails.
    let result = within("the silent peer to be dropped", silent).await.expect("task");
    assert!(result.is_err(), "a peer that never sent its hello was accepted");
}

/// With `max_pending_handshakes` = 1, a silent peer holds the only setup slot: the next client's
/// connect request waits until the silent one is dropped at the handshake timeout.
async fn setups_in_progress_are_bounded() {
    let addr = next_addr();
    let timeout = Duration::from_secs(8);
    let server_params =
        ConnParams { handshake_timeout: timeout, max_pending_handshakes: 1, ..ConnParams::default() };
    let mut l = rdma::listen_with(addr, server_params, RdmaConfig::from_env()).expect("listen");
    let start = std::time::Instant::now();
    let silent = silent_peer(addr);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (c, s) = within("the waiting client", async {
        tokio::join!(rpc_transport::connect(&Address::Rdma(addr), ConnParams::default()), l.accept_rdma())
    })
    .await;
    let (mut client, mut server) = (c.expect("connect"), s.expect("accept"));
    assert!(start.elapsed() >= timeout, "set up after {:?}: the bound was not applied", start.elapsed());
    send_ok(&mut *client, 1, b"waited").await;
    assert_eq!(recv(&mut server).await, b"waited");
    let result = within("the silent peer to be dropped", silent).await.expect("task");
    assert!(result.is_err(), "a peer that never sent its hello was accepted");
}

/// Pool memory is sent, advertised, READ into and received into without a registration (after
/// the pool's chunks exist), and what arrives is handed out where the NIC wrote it.
async fn pool_memory_needs_no_registration() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let payload = pattern(300 << 10);
    for round in 0..3u64 {
        let (c0, s0) = (client.counters(), server.counters());
        // A SEND larger than inline data, from the pool: as the buffer itself, and (round 0)
        // frozen into `Bytes`.
        let mut frame = client.pool().alloc(4000).unwrap();
        frame.copy_from_slice(&payload[..4000]);
        let msg: SendBuf = if round == 0 { frame.freeze().into() } else { frame.into() };
        client.post_send(round, msg).unwrap();
        let (_, sent) = send_done(&mut *client).await;
        sent.expect("send");
        match next(&mut *server).await.unwrap() {
            Completion::Recv { buf } => {
                assert_eq!(buf.bytes(), &payload[..4000]);
                assert!(server.pool().contains(buf.bytes()), "received in place");
                server.post_recv(buf).unwrap();
            }
            other => panic!("expected a receive, got {other:?}"),
        }
        // A region of pool memory, READ into pool memory.
        let mut region = server.pool().alloc(payload.len()).unwrap();
        region.copy_from_slice(&payload);
        let desc = server.register(region.freeze()).unwrap();
        let dst = client.pool().alloc(payload.len()).unwrap();
        client.post_read(7, desc, dst).unwrap();
        let done = match next(&mut *client).await.unwrap() {
            Completion::Read { wr_id: 7, result } => result.expect("READ"),
            other => panic!("expected the READ, got {other:?}"),
        };
        assert!(done == payload);
        assert!(client.pool().contains(&done), "READ in place");
        server.deregister(desc).unwrap();
        drop(done);
        let (c1, s1) = (client.counters(), server.counters());
        let regs = (c1.mr_registrations - c0.mr_registrations) + (s1.mr_registrations - s0.mr_registrations);
        println!("round {round}: {regs} registrations");
        assert_eq!(c1.bytes_outside_pool + s1.bytes_outside_pool, 0, "nothing from outside the pools");
        if round > 0 {
            assert_eq!(regs, 0, "round {round}: the pools' chunks are reused, nothing registered");
        }
    }
}

/// The key policy. `PoolKeys`: a pooled region is advertised with its chunk's key, which stays
/// valid for this peer after the region is revoked (the buffer is then reused only for this
/// connection's data). `PerCallKeys`: the region has a key of its own, and a READ after the
/// revoke is refused (and fails the connection, as any refused READ).
async fn pool_keys_and_per_call_keys() {
    for policy in [KeyPolicy::PoolKeys, KeyPolicy::PerCallKeys] {
        let p = ConnParams { key_policy: policy, ..ConnParams::default() };
        let (mut client, mut server) = pair(p.clone(), p).await;
        let mut region = server.pool().alloc(64 << 10).unwrap();
        region.fill(7);
        let regs0 = server.counters().mr_registrations;
        let desc = server.register(region.freeze()).unwrap();
        let regs = server.counters().mr_registrations - regs0;
        assert_eq!(regs, u64::from(policy == KeyPolicy::PerCallKeys), "{policy:?}: registrations");
        client.post_read(1, desc, vec![0; 64 << 10].into()).unwrap();
        assert_eq!(read_done(&mut *client).await, (1, Ok(vec![7; 64 << 10])));
        server.deregister(desc).unwrap();
        client.post_read(2, desc, vec![0; 64 << 10].into()).unwrap();
        match policy {
            KeyPolicy::PoolKeys => {
                // Still readable: same connection, same chunk (documented default).
                let (id, r) = read_done(&mut *client).await;
                assert_eq!(id, 2);
                assert!(r.is_ok(), "pool key after revoke: {r:?}");
            }
            KeyPolicy::PerCallKeys => {
                assert_eq!(read_done(&mut *client).await, (2, refused(desc.rkey)));
                expect_connection_failed(&mut *client, &mut *server).await;
            }
        }
    }
}

const PAGE: usize = 4096;

/// `len` bytes of a fresh buffer starting at `page_off` within a page, filled with a pattern.
fn bytes_at_page_offset(page_off: usize, len: usize) -> Bytes {
    let backing = Bytes::from(pattern(len + 2 * PAGE));
    let start = (PAGE - backing.as_ptr() as usize % PAGE) % PAGE + page_off;
    backing.slice(start..start + len)
}

/// A heap destination of `len` bytes whose address is `crossing` a page boundary or not. Heap
/// memory is placed by the allocator, so this tries fresh allocations (bounded) until one fits;
/// the misses are kept alive until then so that the allocator moves on.
fn heap_dest(len: usize, crossing: bool) -> (Vec<u8>, usize) {
    let mut misses = Vec::new();
    for _ in 0..20_000 {
        let v = vec![0u8; len];
        let off = v.as_ptr() as usize % PAGE;
        if (off + len > PAGE) == crossing && (len < PAGE || off != 0) {
            return (v, off);
        }
        misses.push(v);
    }
    panic!("no heap allocation of {len} bytes with crossing={crossing} in 20000 tries");
}

/// READs whose source region or destination straddles page boundaries at various offsets, from
/// heap and from pool memory, read back byte for byte. (siw once showed a region at page offset
/// 4092 read with a gap where the page boundary was.)
async fn reads_across_page_boundaries() {
    let (mut client, mut server) = pair(ConnParams::default(), ConnParams::default()).await;
    let mut failures = Vec::new();
    let mut wr = 0u64;
    for len in [1usize, 11, 100, 4097, 12_000] {
        // usize::MAX: a source from the server's pool, wherever it lands.
        for src_off in [0usize, 1, 2048, 4092, 4095, usize::MAX] {
            for dest in ["heap-within", "heap-crossing", "pool"] {
                let src = if src_off == usize::MAX {
                    let mut b = server.pool().alloc(len).unwrap();
                    b.copy_from_slice(&pattern(len));
                    b.freeze()
                } else {
                    bytes_at_page_offset(src_off, len)
                };
                let src_off = src.as_ptr() as usize % PAGE;
                let (dst, dst_off): (rpc_transport::Buf, usize) = match dest {
                    "pool" => {
                        let b = client.pool().alloc(len).unwrap();
                        let off = b.as_ptr() as usize % PAGE;
                        (b, off)
                    }
                    "heap-within" if len >= PAGE => continue,
                    // malloc aligns to 16 bytes: so small a block never straddles a page.
                    "heap-crossing" if len <= 16 => continue,
                    _ => {
                        let (v, off) = heap_dest(len, dest == "heap-crossing");
                        (v.into(), off)
                    }
                };
                let desc = server.register(src.clone()).unwrap();
                wr += 1;
                client.post_read(wr, desc, dst).unwrap();
                let (id, got) = read_done(&mut *client).await;
                assert_eq!(id, wr);
                let got = got.unwrap_or_else(|e| panic!("len {len} src_off {src_off} {dest}: {e:?}"));
                if got != src[..] {
                    let first_bad = got.iter().zip(src.iter()).position(|(a, b)| a != b).unwrap_or(0);
                    failures.push(format!(
                        "len {len} src page offset {src_off} dest {dest} (page offset {dst_off}): first wrong byte at {first_bad}"
                    ));
                }
                server.deregister(desc).unwrap();
            }
        }
    }
    assert!(failures.is_empty(), "{} of {wr} READs wrong:\n{}", failures.len(), failures.join("\n"));
}

/// Spins (empty polls) while the client waits `delay` for a message, with a busy-poll window of
/// `window`: a fresh pair, one round trip to open the window, then the delayed message.
async fn spins_waiting(window: Duration, delay: Duration) -> u64 {
    let mut p = ConnParams::default();
    p.rdma.busy_poll = window;
    let (mut client, mut server) = pair(p, ConnParams::default()).await;
    send_ok(&mut *client, 1, b"ping").await;
    assert_eq!(recv(&mut *server).await, b"ping");
    let before = client.counters().busy_poll_spins;
    let answer = async {
        tokio::time::sleep(delay).await;
        send_ok(&mut *server, 2, b"pong").await;
    };
    let (_, got) = tokio::join!(answer, recv(&mut *client));
    assert_eq!(got, b"pong");
    client.counters().busy_poll_spins - before
}

/// A busy-poll window spins (empty polls, counted) and then sleeps on the completion channel:
/// a message that comes after the window still arrives, and a 2 ms window spins far less while
/// waiting 300 ms than a window longer than the wait does. No window: no spin.
async fn busy_poll_window_spins_then_sleeps() {
    let delay = Duration::from_millis(300);
    let none = spins_waiting(Duration::ZERO, delay).await;
    let short = spins_waiting(Duration::from_millis(2), delay).await;
    let long = spins_waiting(Duration::from_secs(5), delay).await;
    assert_eq!(none, 0, "no window, no spin");
    assert!(short > 0, "a 2 ms window spins");
    assert!(
        long > 2 * short,
        "the 2 ms window closed: {short} spins, against {long} spinning the whole wait"
    );
}

/// A server slow to answer the hello: on iWARP the client nudges it (zero-length RDMA WRITEs,
/// the workaround for siw leaving a first message unread) exactly `HELLO_NUDGES` times, and the
/// connection is as if nothing happened: no receive taken, no credit lost, messages flow both
/// ways in order. On RoCE nothing is sent.
async fn late_hello_is_nudged_harmlessly() {
    let addr = next_addr();
    let mut server_cfg = RdmaConfig::from_env();
    server_cfg.hello_delay = Duration::from_millis(600);
    let mut l = rdma::listen_with(addr, params(4, 256), server_cfg).expect("listen");
    let mut client_cfg = RdmaConfig::from_env();
    client_cfg.hello_nudge_after = Duration::from_millis(20); // nudges at ~20, 60 and 140 ms
    let (c, s) = within("connection setup with a late hello", async {
        tokio::join!(rdma::connect_with(addr, params(4, 256), client_cfg), l.accept_rdma())
    })
    .await;
    let (mut client, mut server) = (c.expect("connect"), s.expect("accept"));
    let expected = if iwarp() { u64::from(rdma::HELLO_NUDGES) } else { 0 };
    assert_eq!(client.counters().hello_nudges, expected, "nudges sent");
    assert_eq!(client.info().peer_recv_depth, 4, "a nudge costs no credit");
    // Every one of the server's 4 receives is still there: 4 messages back to back, then 4 back.
    for i in 0..4u64 {
        send_ok(&mut client, i, format!("to server {i}").as_bytes()).await;
    }
    for i in 0..4u64 {
        assert_eq!(recv(&mut server).await, format!("to server {i}").as_bytes());
    }
    for i in 0..4u64 {
        send_ok(&mut server, i, format!("to client {i}").as_bytes()).await;
        assert_eq!(recv(&mut client).await, format!("to client {i}").as_bytes());
    }
    let sc = server.counters();
    assert_eq!((sc.recvs, sc.recv_unexpected), (4, 0), "the nudges reached no receive");
}

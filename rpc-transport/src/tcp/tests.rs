//! Setup of tcp connections seen from inside: what the listener allocates for a peer before and
//! after its hello, and the socket options every stream gets.
//!
//! Each test runs on a current-thread runtime, so the listener's tasks run on the test's thread
//! and the thread-local counters below see only this test's connections.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::soft::pools_allocated;
use crate::{Address, Listener, TcpSettings};

/// What `configure` left on one stream, read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SocketOptions {
    local: SocketAddr,
    nodelay: bool,
    keepalive: bool,
    /// (idle, interval, probes) when keepalive is on.
    probes: Option<(Duration, Duration, u32)>,
    user_timeout: Option<Duration>,
}

thread_local! {
    static CONFIGURED: RefCell<Vec<SocketOptions>> = const { RefCell::new(Vec::new()) };
}

/// Called by `configure` in tests: reads the options back from the socket itself.
pub(super) fn record_socket_options(stream: &TcpStream) {
    let sock = socket2::SockRef::from(stream);
    let keepalive = sock.keepalive().expect("SO_KEEPALIVE");
    let probes = keepalive.then(|| {
        (
            sock.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
            sock.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
            sock.tcp_keepalive_retries().expect("TCP_KEEPCNT"),
        )
    });
    let options = SocketOptions {
        local: stream.local_addr().expect("local_addr"),
        nodelay: stream.nodelay().expect("TCP_NODELAY"),
        keepalive,
        probes,
        user_timeout: sock.tcp_user_timeout().expect("TCP_USER_TIMEOUT"),
    };
    CONFIGURED.with(|c| c.borrow_mut().push(options));
}

fn configured() -> Vec<SocketOptions> {
    CONFIGURED.with(|c| c.borrow().clone())
}

async fn listener(params: ConnParams) -> (Box<dyn Listener>, SocketAddr) {
    let l = listen("127.0.0.1:0".parse().unwrap(), params).await.expect("listen");
    let Address::Tcp(addr) = l.local_addr() else { panic!("not a tcp address") };
    (l, addr)
}

/// A hello as the wire format documents it.
fn raw_hello(magic: &[u8; 4], recv_depth: u32, recv_size: u32, private_len: u16) -> Vec<u8> {
    let mut h = magic.to_vec();
    h.extend_from_slice(&wire::VERSION.to_le_bytes());
    h.extend_from_slice(&private_len.to_le_bytes());
    h.extend_from_slice(&recv_depth.to_le_bytes());
    h.extend_from_slice(&recv_size.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes()); // push window: none
    h.extend(std::iter::repeat_n(0u8, usize::from(private_len).min(crate::MAX_PRIVATE_DATA)));
    h
}

/// Waits (bounded) until the listener closes `raw`; returns what it sent before.
async fn until_closed(raw: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the listener did not close the connection");
    got
}

#[tokio::test]
async fn bad_hellos_are_refused_before_any_pool_is_allocated() {
    let (_l, addr) = listener(ConnParams::default()).await;
    let cases = [
        ("wrong magic", raw_hello(b"XRPC", 4, 1024, 0)),
        ("zero recv_depth", raw_hello(b"RRPC", 0, 1024, 0)),
        ("recv_depth over the limit", raw_hello(b"RRPC", crate::soft::MAX_RECV_DEPTH + 1, 1024, 0)),
        ("zero recv_size", raw_hello(b"RRPC", 4, 0, 0)),
        ("recv_size u32::MAX", raw_hello(b"RRPC", 4, u32::MAX, 0)),
        ("recv_depth and recv_size huge", raw_hello(b"RRPC", u32::MAX, u32::MAX, 0)),
        ("private data over 256 bytes", raw_hello(b"RRPC", 4, 1024, 300)),
    ];
    for (what, hello) in cases {
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(&hello).await.unwrap();
        let answer = until_closed(&mut raw).await;
        assert!(answer.is_empty(), "{what}: the listener answered a bad hello with {answer:?}");
        assert_eq!(pools_allocated::get(), 0, "{what}: a receive pool was allocated");
    }
    // A good hello: the listener allocates one pool, then answers with its hello.
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(&raw_hello(b"RRPC", 4, 1024, 0)).await.unwrap();
    let mut theirs = [0u8; wire::HELLO_FIXED];
    tokio::time::timeout(Duration::from_secs(10), raw.read_exact(&mut theirs)).await.unwrap().unwrap();
    assert_eq!(&theirs[..4], b"RRPC");
    assert_eq!(pools_allocated::get(), 1);
}

#[tokio::test]
async fn a_silent_client_costs_a_socket_only_and_is_dropped_after_the_timeout() {
    let params = ConnParams { handshake_timeout: Duration::from_millis(300), ..ConnParams::default() };
    let (_l, addr) = listener(params).await;
    let start = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&raw_hello(b"RRPC", 4, 1024, 0)[..10]).await.unwrap(); // never finished
    assert!(until_closed(&mut silent).await.is_empty());
    assert!(until_closed(&mut half).await.is_empty());
    assert!(start.elapsed() >= Duration::from_millis(300), "dropped after {:?}", start.elapsed());
    assert_eq!(pools_allocated::get(), 0);
}

#[tokio::test]
async fn the_connecting_side_posts_its_receives_before_its_hello_leaves() {
    let raw_server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = raw_server.local_addr().unwrap();
    let client = tokio::spawn(connect(addr, ConnParams::default()));
    let (mut s, _) = raw_server.accept().await.unwrap();
    let mut theirs = [0u8; wire::HELLO_FIXED];
    s.read_exact(&mut theirs).await.unwrap();
    // The client's hello is out: its pool exists already (the client task runs on this thread).
    assert_eq!(pools_allocated::get(), 1);
    s.write_all(&raw_hello(b"RRPC", 4, 1024, 0)).await.unwrap();
    let conn = client.await.unwrap().expect("connect");
    assert_eq!(conn.counters().recvs_posted, 64);
}

#[tokio::test]
async fn every_stream_gets_keepalive_on_both_sides() {
    let idle = Duration::from_secs(12);
    let params = ConnParams { tcp: TcpSettings::default().keepalive(Some(idle)), ..ConnParams::default() };
    let (mut l, addr) = listener(params.clone()).await;
    let (client, server) = tokio::join!(connect(addr, params), l.accept());
    let (_client, _server) = (client.expect("connect"), server.expect("accept"));
    let seen = configured();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let expected = Some((idle, Duration::from_secs(2), 3));
    let server_side = seen.iter().find(|o| o.local == addr).expect("the accepted stream");
    let client_side = seen.iter().find(|o| o.local != addr).expect("the connecting stream");
    for side in [server_side, client_side] {
        assert!(side.nodelay && side.keepalive, "{side:?}");
        assert_eq!(side.probes, expected, "{side:?}");
        assert_eq!(side.user_timeout, Some(Duration::from_secs(12 + 3 * 2)), "{side:?}");
    }
}

#[tokio::test]
async fn keepalive_can_be_turned_off() {
    let params = ConnParams { tcp: TcpSettings::default().keepalive(None), ..ConnParams::default() };
    let (mut l, addr) = listener(params.clone()).await;
    let (client, server) = tokio::join!(connect(addr, params), l.accept());
    let (_client, _server) = (client.expect("connect"), server.expect("accept"));
    let seen = configured();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter().all(|o| o.nodelay && !o.keepalive && o.probes.is_none() && o.user_timeout.is_none()),
        "{seen:?}"
    );
}

#[test]
fn keepalive_interval_is_a_fifth_of_idle_in_whole_seconds_and_at_least_one() {
    // The values `configure` passes; read back from real sockets in the tests above.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    for (idle, interval) in [(10, 2), (12, 2), (3, 1), (60, 12)] {
        sock.set_tcp_keepalive(&keepalive(Duration::from_secs(idle))).unwrap();
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(idle));
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), Duration::from_secs(interval));
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        assert_eq!(dead_after(Duration::from_secs(idle)), Duration::from_secs(idle + 3 * interval));
    }
}

//! The tcp backend against misbehaving peers, driven by raw sockets.

mod common;

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use rpc_transport::{
    tcp, Address, Completion, ConnParams, Connection, Listener, ReadError, TcpSettings, TransportError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The wire version these tests speak.
const VERSION: u16 = 2;
/// Bytes of a hello before the private data.
const HELLO_FIXED: usize = 24;

/// A hello as the wire format documents it: magic, version, private_len, recv_depth, recv_size,
/// push_window (0 here: the raw peer never takes pushes).
fn hello(version: u16, recv_depth: u32, recv_size: u32, private: &[u8]) -> Vec<u8> {
    let mut h = b"RRPC".to_vec();
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&(private.len() as u16).to_le_bytes());
    h.extend_from_slice(&recv_depth.to_le_bytes());
    h.extend_from_slice(&recv_size.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes());
    h.extend_from_slice(private);
    h
}

fn good_hello(private: &[u8]) -> Vec<u8> {
    hello(VERSION, 4, 1024, private)
}

async fn tcp_listener() -> (Box<dyn Listener>, SocketAddr) {
    tcp_listener_with(ConnParams::default()).await
}

async fn tcp_listener_with(params: ConnParams) -> (Box<dyn Listener>, SocketAddr) {
    let l = tcp::listen("127.0.0.1:0".parse().unwrap(), params).await.expect("listen");
    let Address::Tcp(addr) = l.local_addr() else { panic!("not a tcp address") };
    assert_ne!(addr.port(), 0);
    (l, addr)
}

/// Asserts the server closes `raw` (EOF or reset) within the test timeout.
async fn assert_closed_by_server(raw: &mut TcpStream) {
    let mut sink = Vec::new();
    let result = within("the server to close the raw connection", raw.read_to_end(&mut sink)).await;
    if let Err(e) = result {
        assert!(
            matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe),
            "unexpected error {e:?}"
        );
    }
}

/// A good client connects; the listener accepts it (and only it) and it works.
async fn assert_listener_serves_good_client(l: &mut Box<dyn Listener>, addr: SocketAddr) {
    let good = ConnParams { private_data: Bytes::from_static(b"good client"), ..ConnParams::default() };
    let (client, server) =
        within("good client", async { tokio::join!(tcp::connect(addr, good), l.accept()) }).await;
    let (mut client, mut server) = (client.expect("connect"), server.expect("accept"));
    assert_eq!(&server.info().peer_private_data[..], b"good client", "accept returned the wrong connection");
    send_ok(&mut *client, 1, b"hello").await;
    assert_eq!(recv(&mut *server).await, b"hello");
}

#[tokio::test]
async fn garbage_instead_of_hello_is_dropped() {
    let (mut l, addr) = tcp_listener().await;
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(&[0xFF; 64]).await.unwrap();
    assert_closed_by_server(&mut raw).await;
    assert_listener_serves_good_client(&mut l, addr).await;
}

#[tokio::test]
async fn bad_hellos_are_dropped() {
    let (mut l, addr) = tcp_listener().await;
    let mut too_much_private = hello(VERSION, 4, 1024, &[]);
    too_much_private[6..8].copy_from_slice(&300u16.to_le_bytes());
    let cases = [
        ("wrong magic", [b"XRPC".as_slice(), &good_hello(b"")[4..]].concat()),
        ("previous version", hello(VERSION - 1, 4, 1024, b"")),
        ("zero recv_depth", hello(VERSION, 0, 1024, b"")),
        ("zero recv_size", hello(VERSION, 4, 0, b"")),
        ("huge recv_size", hello(VERSION, 4, u32::MAX, b"")),
        ("private data over 256 bytes", too_much_private),
        ("truncated hello", good_hello(b"")[..10].to_vec()),
    ];
    for (what, bytes) in cases {
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(&bytes).await.unwrap();
        raw.shutdown().await.unwrap(); // makes the truncated case end now rather than at the timeout
        eprintln!("case: {what}");
        assert_closed_by_server(&mut raw).await;
    }
    assert_listener_serves_good_client(&mut l, addr).await;
}

#[tokio::test]
async fn silent_client_does_not_block_others_and_times_out() {
    let params = ConnParams { handshake_timeout: Duration::from_secs(2), ..ConnParams::default() };
    let mut l = tcp::listen("127.0.0.1:0".parse().unwrap(), params).await.expect("listen");
    let Address::Tcp(addr) = l.local_addr() else { panic!("not a tcp address") };
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    assert_listener_serves_good_client(&mut l, addr).await;
    assert!(start.elapsed() < Duration::from_secs(2), "the good client waited for the silent one");
    // The silent client is dropped once the handshake timeout passes.
    assert_closed_by_server(&mut silent).await;
    assert!(start.elapsed() >= Duration::from_millis(1500), "dropped after {:?}", start.elapsed());
}

/// With `max_pending_handshakes` silent clients in setup, a new client takes the slot of the
/// oldest silent one (which is dropped at once): silent sockets cannot keep honest clients out,
/// and no more than the bound (plus the one arriving) are ever accepted at once.
#[tokio::test]
async fn a_new_client_evicts_the_oldest_silent_handshake() {
    let timeout = Duration::from_secs(10);
    let params =
        ConnParams { handshake_timeout: timeout, max_pending_handshakes: 2, ..ConnParams::default() };
    let mut l = tcp::listen("127.0.0.1:0".parse().unwrap(), params).await.expect("listen");
    let Address::Tcp(addr) = l.local_addr() else { panic!("not a tcp address") };
    let start = Instant::now();
    let mut oldest = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut newer = TcpStream::connect(addr).await.unwrap();
    // Let the listener take both into setup before the good client arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_listener_serves_good_client(&mut l, addr).await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "served after {:?}: waited for a timeout",
        start.elapsed()
    );
    // The oldest silent client was dropped to make room; the newer one is still in setup.
    assert_closed_by_server(&mut oldest).await;
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_millis(200), newer.read(&mut byte)).await;
    assert!(read.is_err(), "the newer silent client is still waiting for its hello: {read:?}");
}

/// A raw client that completed the handshake, and the server end the listener accepted for it.
async fn raw_after_handshake(
    l: &mut Box<dyn Listener>,
    addr: SocketAddr,
) -> (TcpStream, Box<dyn Connection>) {
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(&good_hello(b"raw")).await.unwrap();
    let server = within("accept", l.accept()).await.expect("accept");
    assert_eq!(&server.info().peer_private_data[..], b"raw");
    // Consume the server's hello (default params: no private data).
    let mut their_hello = [0u8; HELLO_FIXED];
    raw.read_exact(&mut their_hello).await.unwrap();
    assert_eq!(&their_hello[..4], b"RRPC");
    (raw, server)
}

async fn assert_malformed_then_closed(mut raw: TcpStream, mut server: Box<dyn Connection>) {
    let (_, err) = drain_to_error(&mut *server).await;
    assert!(matches!(err, TransportError::Malformed(_)), "{err:?}");
    assert_closed_by_server(&mut raw).await;
}

#[tokio::test]
async fn unknown_frame_type_fails_the_connection() {
    let (mut l, addr) = tcp_listener().await;
    let (mut raw, server) = raw_after_handshake(&mut l, addr).await;
    raw.write_all(&[0x7F, 1, 2, 3, 4, 5, 6, 7, 8]).await.unwrap();
    assert_malformed_then_closed(raw, server).await;
    assert_listener_serves_good_client(&mut l, addr).await;
}

#[tokio::test]
async fn a_stream_that_ends_inside_a_frame_fails_the_connection_as_a_close() {
    let (mut l, addr) = tcp_listener().await;
    let (mut raw, mut server) = raw_after_handshake(&mut l, addr).await;
    let mut frame = vec![1u8];
    frame.extend_from_slice(&100u32.to_le_bytes());
    frame.extend_from_slice(&[0xAB; 10]); // 90 bytes short
    raw.write_all(&frame).await.unwrap();
    raw.shutdown().await.unwrap();
    // What a peer that closes in the middle of a write looks like: a disconnect.
    let (_, err) = drain_to_error(&mut *server).await;
    assert!(
        matches!(&err, TransportError::Disconnected(d) if d.to_string().contains("inside a frame")),
        "{err:?}"
    );
    assert_closed_by_server(&mut raw).await;
    assert_listener_serves_good_client(&mut l, addr).await;
}

#[tokio::test]
async fn oversized_send_fails_the_connection() {
    let (mut l, addr) = tcp_listener().await;
    let (mut raw, server) = raw_after_handshake(&mut l, addr).await;
    let mut frame = vec![1u8];
    frame.extend_from_slice(&u32::MAX.to_le_bytes()); // far above recv_size; must not be allocated
    raw.write_all(&frame).await.unwrap();
    assert_malformed_then_closed(raw, server).await;
}

#[tokio::test]
async fn unsolicited_read_response_fails_the_connection() {
    let (mut l, addr) = tcp_listener().await;
    let (mut raw, server) = raw_after_handshake(&mut l, addr).await;
    let mut frame = vec![3u8];
    frame.extend_from_slice(&12345u64.to_le_bytes());
    frame.push(0);
    frame.extend_from_slice(&4u64.to_le_bytes());
    frame.extend_from_slice(b"leak");
    raw.write_all(&frame).await.unwrap();
    assert_malformed_then_closed(raw, server).await;
}

/// A PUSH frame: rkey, addr, len, then `data` (which may be shorter than `len` for a test that
/// the receiver refuses the header before reading any payload).
fn push_frame(rkey: u32, addr: u64, len: u64, data: &[u8]) -> Vec<u8> {
    let mut f = vec![4u8];
    f.extend_from_slice(&rkey.to_le_bytes());
    f.extend_from_slice(&addr.to_le_bytes());
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(data);
    f
}

/// A peer that pushes more than the window the server granted breaks the protocol: the server's
/// end fails `Malformed` before it allocates the payload, and closes the socket.
#[tokio::test]
async fn push_beyond_the_granted_window_fails_the_connection() {
    let params = ConnParams { tcp: TcpSettings::default().push_window(64), ..ConnParams::default() };
    let cases: [(&str, Vec<u8>); 3] = [
        ("one push over the window", push_frame(1, 0x1000, 65, &[7; 65])),
        ("a huge push", push_frame(1, 0x1000, u64::MAX, &[])),
        ("two pushes over the window together", {
            let mut f = push_frame(1, 0x1000, 40, &[7; 40]);
            f.extend(push_frame(2, 0x2000, 25, &[8; 25]));
            f
        }),
    ];
    for (what, frames) in cases {
        eprintln!("case: {what}");
        let (mut l, addr) = tcp_listener_with(params.clone()).await;
        let (mut raw, server) = raw_after_handshake(&mut l, addr).await;
        raw.write_all(&frames).await.unwrap();
        assert_malformed_then_closed(raw, server).await;
    }
}

/// A push within the window is fine, a second push of the same key while the first is held is
/// not, and neither is handing back a region the server never pushed.
#[tokio::test]
async fn pushing_a_held_key_twice_or_handing_back_unused_window_fails_the_connection() {
    let params = ConnParams { tcp: TcpSettings::default().push_window(64), ..ConnParams::default() };
    let mut window_back = vec![6u8];
    window_back.extend_from_slice(&7u32.to_le_bytes());
    window_back.extend_from_slice(&1u64.to_le_bytes());
    let mut twice = push_frame(9, 0x1000, 8, &[1; 8]);
    twice.extend(push_frame(9, 0x1000, 8, &[1; 8]));
    for (what, frames) in [("same key twice", twice), ("window nobody used", window_back)] {
        eprintln!("case: {what}");
        let (mut l, addr) = tcp_listener_with(params.clone()).await;
        let (mut raw, server) = raw_after_handshake(&mut l, addr).await;
        raw.write_all(&frames).await.unwrap();
        assert_malformed_then_closed(raw, server).await;
    }
}

/// A raw peer's READ with a wrong key: the refusal (status, no data) is the last frame the
/// server sends; it then closes the connection, delivers nothing the peer sent after the bad
/// READ, and its own end fails with `Disconnected`.
#[tokio::test]
async fn refused_read_closes_the_connection() {
    let (mut l, addr) = tcp_listener().await;
    let (mut raw, mut server) = raw_after_handshake(&mut l, addr).await;
    let region = server.register(Bytes::from_static(b"guarded")).unwrap();
    let mut frames = vec![2u8];
    frames.extend_from_slice(&77u64.to_le_bytes());
    frames.extend_from_slice(&region.addr.to_le_bytes());
    frames.extend_from_slice(&region.len.to_le_bytes());
    frames.extend_from_slice(&(region.rkey ^ 0x5a).to_le_bytes());
    frames.push(1);
    frames.extend_from_slice(&5u32.to_le_bytes());
    frames.extend_from_slice(b"after");
    raw.write_all(&frames).await.unwrap();

    let mut answer = Vec::new();
    within("the server to close", raw.read_to_end(&mut answer)).await.expect("EOF, not a reset");
    let mut expected = vec![3u8];
    expected.extend_from_slice(&77u64.to_le_bytes());
    expected.push(1); // invalid key
    expected.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(answer, expected, "exactly one refusal, no data");

    let (seen, err) = drain_to_error(&mut *server).await;
    assert!(
        matches!(err, TransportError::Disconnected(ref why) if why.message().contains("refused")),
        "{err:?}"
    );
    assert!(seen.is_empty(), "the SEND after the bad READ was delivered: {seen:?}");
    assert_eq!((server.counters().reads_refused, server.counters().recvs), (1, 0));
    assert_listener_serves_good_client(&mut l, addr).await;
}

#[tokio::test]
async fn connect_to_closed_port_is_refused() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    match tcp::connect(addr, ConnParams::default()).await {
        Err(TransportError::Connect { source, .. }) => {
            assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused)
        }
        other => panic!("expected ConnectionRefused, got {other:?}"),
    }
}

#[tokio::test]
async fn connect_to_server_with_bad_hello_fails_handshake() {
    let raw_server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = raw_server.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = raw_server.accept().await.unwrap();
        s.write_all(&hello(9, 4, 1024, b"")).await.unwrap();
        let mut sink = [0u8; 64];
        let _ = s.read(&mut sink).await;
    });
    let result = within("connect", tcp::connect(addr, ConnParams::default())).await;
    assert!(matches!(result, Err(TransportError::Handshake(ref m)) if m.contains("version")), "{result:?}");
    server.await.unwrap();
}

/// Our client against a raw server that takes READ requests and never answers them.
#[tokio::test]
async fn unanswered_reads_are_flushed_when_the_peer_goes_away() {
    let raw_server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = raw_server.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = raw_server.accept().await.unwrap();
        s.write_all(&good_hello(b"")).await.unwrap();
        let mut their_hello = [0u8; HELLO_FIXED];
        s.read_exact(&mut their_hello).await.unwrap();
        let mut requests = [0u8; 2 * 29];
        s.read_exact(&mut requests).await.unwrap();
        assert_eq!((requests[0], requests[29]), (2, 2), "two READ_REQ frames");
        // Drop the socket without answering.
    });
    let mut client = within("connect", tcp::connect(addr, ConnParams::default())).await.unwrap();
    let remote = rpc_transport::RegionDesc { addr: 0x1000, len: 8, rkey: 0x42 };
    client.post_read(1, remote, vec![0; 8].into()).unwrap();
    client.post_read(2, remote, vec![0; 8].into()).unwrap();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    let flushed: Vec<_> = seen
        .iter()
        .map(|c| match c {
            Completion::Read { wr_id, result } => {
                (*wr_id, result.as_ref().map(|b| b.to_vec()).map_err(Clone::clone))
            }
            other => panic!("unexpected completion {other:?}"),
        })
        .collect();
    assert_eq!(flushed, [(1, Err(ReadError::Flushed)), (2, Err(ReadError::Flushed))]);
    server.await.unwrap();
}

#[tokio::test]
async fn dropped_listener_frees_the_port_but_keeps_connections() {
    let (mut l, addr) = tcp_listener().await;
    let (client, server) = tokio::join!(tcp::connect(addr, ConnParams::default()), l.accept());
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    drop(l);
    send_ok(&mut *client, 1, b"still connected").await;
    assert_eq!(recv(&mut *server).await, b"still connected");
    let _rebound = within("rebind", async {
        loop {
            match tcp::listen(addr, ConnParams::default()).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await;
}

/// SENDs written by the caller at once (the writer idle) and by the writer (after a partial
/// direct write into a full socket buffer, and the rest of the burst) reach the peer whole and in
/// posting order, and complete in posting order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_and_queued_sends_keep_their_order_through_partial_writes() {
    const N: u64 = 120;
    const SIZE: usize = 60_000;
    let payload = |i: u64| -> Vec<u8> { (0..SIZE).map(|j| (i as usize * 31 + j) as u8).collect() };
    let raw_server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = raw_server.local_addr().unwrap();
    let (start_reading, reading) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut s, _) = raw_server.accept().await.unwrap();
        s.write_all(&hello(VERSION, 4, 65536, b"")).await.unwrap();
        let mut their_hello = [0u8; HELLO_FIXED];
        s.read_exact(&mut their_hello).await.unwrap();
        // Let the socket buffers fill before reading anything.
        reading.await.unwrap();
        for i in 0..N {
            let mut header = [0u8; 5];
            s.read_exact(&mut header).await.unwrap();
            assert_eq!(header[0], 1, "a SEND frame");
            assert_eq!(u32::from_le_bytes(header[1..].try_into().unwrap()) as usize, SIZE);
            let mut body = vec![0u8; SIZE];
            s.read_exact(&mut body).await.unwrap();
            assert!(body == payload(i), "message {i} intact and in order");
        }
    });
    let mut client = within("connect", tcp::connect(addr, ConnParams::default())).await.unwrap();
    let mut completed = Vec::new();
    for i in 0..N {
        client.post_send(i, Bytes::from(payload(i)).into()).unwrap();
        // Taking the completions that are ready lets the next SEND go directly if it can.
        let mut out = Vec::new();
        let _ = futures::FutureExt::now_or_never(futures::future::poll_fn(|cx| {
            client.poll_completions(cx, &mut out, 64)
        }));
        completed.extend(out);
    }
    start_reading.send(()).unwrap();
    while completed.len() < N as usize {
        completed.push(within("a send completion", next(&mut *client)).await.unwrap());
    }
    let ids: Vec<u64> = completed
        .iter()
        .map(|c| match c {
            Completion::Send { wr_id, result: Ok(()) } => *wr_id,
            other => panic!("expected a successful send, got {other:?}"),
        })
        .collect();
    assert_eq!(ids, (0..N).collect::<Vec<_>>(), "send completions in posting order");
    within("the raw server", server).await.unwrap();
    let c = client.counters();
    assert_eq!(c.sends, N);
    assert!(c.sends_direct > 0, "the first SENDs went directly: {c:?}");
    assert!(c.sends_direct < N, "once the socket buffer filled, the writer took over: {c:?}");
}

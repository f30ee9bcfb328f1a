//! Helpers shared by the integration tests: build a connected pair on either backend, wait for
//! completions with a timeout.
#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rpc_transport::mem::MemFabric;
use rpc_transport::{
    Address, Completion, ConnParams, Connection, Listener, ReadError, SendBuf, TransportError,
};

/// Bound on every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Mem,
    Tcp,
}

/// A name no other test uses (tests of one binary run in parallel on the global fabric).
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn params(recv_depth: u32, recv_size: u32) -> ConnParams {
    ConnParams { recv_depth, recv_size, ..ConnParams::default() }
}

/// Awaits `fut`, failing the test if it takes longer than [`WAIT`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A listener on `backend` (mem: the global fabric under a fresh name; tcp: 127.0.0.1:0).
pub async fn listener(backend: Backend, server: ConnParams) -> Box<dyn Listener> {
    let addr: Address = match backend {
        Backend::Mem => format!("mem://{}", unique_name("conformance")).parse().unwrap(),
        Backend::Tcp => "tcp://127.0.0.1:0".parse().unwrap(),
    };
    rpc_transport::listen(&addr, server).await.expect("listen")
}

/// A connected (client, server) pair.
pub async fn pair(
    backend: Backend,
    client: ConnParams,
    server: ConnParams,
) -> (Box<dyn Connection>, Box<dyn Connection>) {
    let mut l = listener(backend, server).await;
    let addr = l.local_addr();
    let (c, s) =
        within("connection setup", async { tokio::join!(rpc_transport::connect(&addr, client), l.accept()) })
            .await;
    (c.expect("connect"), s.expect("accept"))
}

/// A pair on a private mem fabric, with the fabric (for its fault plan) and the listener name.
pub async fn mem_pair(
    client: ConnParams,
    server: ConnParams,
) -> (Box<dyn Connection>, Box<dyn Connection>, MemFabric, String) {
    let fabric = MemFabric::new();
    let name = unique_name("faults");
    let mut l = fabric.listen(&name, server).expect("listen");
    let c = fabric.connect(&name, client).await.expect("connect");
    let s = within("accept", l.accept()).await.expect("accept");
    (c, s, fabric, name)
}

/// The next completion, or the error `poll_completions` returned.
pub async fn next(conn: &mut dyn Connection) -> Result<Completion, TransportError> {
    let mut out = Vec::with_capacity(1);
    within("a completion", futures::future::poll_fn(|cx| conn.poll_completions(cx, &mut out, 1))).await?;
    assert_eq!(out.len(), 1, "poll_completions returned Ready(Ok) with nothing moved");
    Ok(out.pop().unwrap())
}

/// Waits for a receive, returns its bytes and re-posts the buffer.
pub async fn recv(conn: &mut dyn Connection) -> Vec<u8> {
    match next(conn).await.expect("completion") {
        Completion::Recv { buf } => {
            let bytes = buf.bytes().to_vec();
            conn.post_recv(buf).expect("re-post receive");
            bytes
        }
        other => panic!("expected a receive, got {other:?}"),
    }
}

/// Waits for a send completion; returns its id and result.
pub async fn send_done(conn: &mut dyn Connection) -> (u64, Result<(), TransportError>) {
    match next(conn).await.expect("completion") {
        Completion::Send { wr_id, result } => (wr_id, result),
        other => panic!("expected a send completion, got {other:?}"),
    }
}

/// Waits for a READ completion; returns its id and result.
pub async fn read_done(conn: &mut dyn Connection) -> (u64, Result<Vec<u8>, ReadError>) {
    match next(conn).await.expect("completion") {
        Completion::Read { wr_id, result } => (wr_id, result.map(|b| b.to_vec())),
        other => panic!("expected a READ completion, got {other:?}"),
    }
}

/// Sends `msg` and checks that it completes successfully.
pub async fn send_ok(conn: &mut dyn Connection, wr_id: u64, msg: &[u8]) {
    conn.post_send(wr_id, Bytes::copy_from_slice(msg).into()).expect("post_send");
    let (id, result) = send_done(conn).await;
    assert_eq!(id, wr_id);
    result.expect("send completion");
}

/// Sends a message as a head of 40 bytes and a body of `body_len` (`SendBuf::Headed`, a gather
/// list), then one in one piece, and checks that both arrive whole and in order (`tag` marks the
/// round).
pub async fn headed_message_arrives_whole(
    client: &mut dyn Connection,
    server: &mut dyn Connection,
    tag: u8,
    body_len: usize,
) {
    let head = [tag; 40];
    let body = Bytes::from((0..body_len).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let whole = [&head[..], &body[..]].concat();
    let ids = [2 * u64::from(tag), 2 * u64::from(tag) + 1];
    client.post_send(ids[0], SendBuf::headed(&head, body)).expect("post_send");
    client.post_send(ids[1], Bytes::from_static(b"between").into()).expect("post_send");
    for id in ids {
        let (done, result) = send_done(client).await;
        assert_eq!(done, id, "send completions in posting order");
        result.expect("send completion");
    }
    assert_eq!(recv(server).await, whole, "message of {} + {body_len} bytes", head.len());
    assert_eq!(recv(server).await, b"between");
}

/// A SEND larger than the peer's receives (`max` bytes) in the middle of a batch, through
/// `post_send_batch_reporting` and then `post_send_batch`: the SEND before it goes, the error
/// comes back, the batch is drained, and the SEND after it is never sent. Uses `wr_id`s from 100.
pub async fn batch_stops_at_a_send_too_large(
    client: &mut dyn Connection,
    server: &mut dyn Connection,
    max: usize,
) {
    let too_large = || Bytes::from(vec![7u8; max + 1]).into();
    let expect_too_large = |result: Result<(), TransportError>| match result {
        Err(TransportError::MessageTooLarge { len, max: m }) if len == max + 1 && m == max => {}
        other => panic!("expected MessageTooLarge, got {other:?}"),
    };
    let mut batch = vec![
        (100, Bytes::from_static(b"before").into()),
        (101, too_large()),
        (102, Bytes::from_static(b"after").into()),
    ];
    let mut done = Vec::new();
    expect_too_large(client.post_send_batch_reporting(&mut batch, &mut done));
    assert!(batch.is_empty(), "the batch is drained");
    assert!(done.iter().all(|(id, r)| *id == 100 && r.is_ok()), "only the first was sent: {done:?}");
    if done.is_empty() {
        let (id, result) = send_done(client).await;
        assert_eq!(id, 100);
        result.expect("send");
    }
    assert_eq!(recv(server).await, b"before");
    send_ok(client, 103, b"still here").await;
    assert_eq!(recv(server).await, b"still here", "the SEND after the refused one never left");
    // `post_send_batch` reports every completion through `poll_completions`.
    let mut batch = vec![
        (104, Bytes::from_static(b"first").into()),
        (105, too_large()),
        (106, Bytes::from_static(b"never").into()),
    ];
    expect_too_large(client.post_send_batch(&mut batch));
    assert!(batch.is_empty(), "the batch is drained");
    let (id, result) = send_done(client).await;
    assert_eq!(id, 104);
    result.expect("send");
    assert_eq!(recv(server).await, b"first");
    send_ok(client, 107, b"and after").await;
    assert_eq!(recv(server).await, b"and after", "the SEND after the refused one never left");
}

/// Polls until `cond` holds on the connection's counters (they change asynchronously on tcp).
pub async fn wait_counters(
    conn: &dyn Connection,
    what: &str,
    cond: impl Fn(&rpc_transport::TransportCounters) -> bool,
) {
    within(what, async {
        while !cond(&conn.counters()) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Drains completions until `poll_completions` reports the connection's error; returns the
/// completions seen on the way and that error.
pub async fn drain_to_error(conn: &mut dyn Connection) -> (Vec<Completion>, TransportError) {
    let mut seen = Vec::new();
    loop {
        match next(conn).await {
            Ok(c) => seen.push(c),
            Err(e) => return (seen, e),
        }
    }
}

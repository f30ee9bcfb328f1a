//! Pushed regions over real loopback connections: what is pushed, what a READ of it costs, and
//! that keys, bounds and the window hold as without push.

use std::future::poll_fn;
use std::time::Duration;

use super::*;
use crate::{ReadError, TcpSettings};

/// A connected pair: (reader side, owner side), each with its own parameters.
async fn pair(reader: ConnParams, owner: ConnParams) -> (TcpConnection, TcpConnection) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local_addr");
    let accept = async {
        let (stream, peer) = listener.accept().await.expect("accept");
        accept_stream(stream, &owner, peer, PushPool::new(owner.tcp.push_listener_total))
            .await
            .expect("server setup")
    };
    let (reader, owner) = tokio::join!(connect_stream(addr, reader), accept);
    (reader.expect("connect"), owner)
}

fn window(bytes: u64) -> ConnParams {
    ConnParams { tcp: TcpSettings::default().push_window(bytes), ..ConnParams::default() }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>())
}

/// Waits (at most 10 s) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The next completion, or the connection's error.
async fn next(conn: &mut TcpConnection) -> Result<Completion, TransportError> {
    let mut out = Vec::new();
    let polled = poll_fn(|cx| conn.poll_completions(cx, &mut out, 1));
    tokio::time::timeout(Duration::from_secs(10), polled).await.expect("a completion within 10 s")?;
    Ok(out.pop().expect("one completion"))
}

async fn read(conn: &mut TcpConnection, wr_id: WrId, remote: RegionDesc) -> Result<Vec<u8>, ReadError> {
    conn.post_read(wr_id, remote, vec![0; remote.len as usize].into()).expect("post_read");
    match next(conn).await.expect("alive") {
        Completion::Read { wr_id: id, result } if id == wr_id => result.map(|b| b.to_vec()),
        other => panic!("expected READ {wr_id}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_pushed_region_is_read_without_a_request_and_the_window_comes_back() {
    let (mut reader, mut owner) = pair(window(1 << 20), ConnParams::default()).await;
    let data = pattern(100_000, 1);
    let desc = owner.register(data.clone()).unwrap();
    until("the push to arrive", || reader.push.held() == desc.len).await;
    assert_eq!(owner.push.window_left(), (1 << 20) - desc.len);

    assert_eq!(read(&mut reader, 7, desc).await.expect("READ"), data);
    let (r, o) = (reader.counters(), owner.counters());
    assert_eq!((r.reads_issued, r.reads_served_from_push, r.bytes_read), (1, 1, desc.len));
    assert_eq!((o.regions_pushed, o.bytes_pushed, o.reads_served), (1, desc.len, 0));
    assert_eq!(reader.push.held(), 0);
    until("the window to come back", || owner.push.window_left() == 1 << 20).await;
    assert!(!owner.push.revoke_pushed(desc.rkey), "handed back: revoking it needs no REVOKE");

    // A second READ of the same key goes to the owner, which checks it as always.
    assert_eq!(read(&mut reader, 8, desc).await.expect("READ"), data);
    assert_eq!(owner.counters().reads_served, 1);
}

#[tokio::test]
async fn without_a_window_or_beyond_it_every_read_goes_to_the_owner() {
    // The reader announces no window: nothing is pushed to it.
    let (mut reader, mut owner) = pair(window(0), ConnParams::default()).await;
    let data = pattern(5000, 2);
    let desc = owner.register(data.clone()).unwrap();
    assert_eq!(read(&mut reader, 1, desc).await.expect("READ"), data);
    assert_eq!((owner.counters().regions_pushed, owner.counters().reads_served), (0, 1));

    // Regions of more than the window are never pushed either.
    let (mut reader, mut owner) = pair(window(4096), ConnParams::default()).await;
    let desc = owner.register(data.clone()).unwrap();
    assert_eq!(read(&mut reader, 1, desc).await.expect("READ"), data);
    assert_eq!((owner.counters().regions_pushed, owner.counters().reads_served), (0, 1));
    assert_eq!(reader.counters().reads_served_from_push, 0);
}

#[tokio::test]
async fn an_exhausted_window_falls_back_to_read_until_it_is_handed_back() {
    let (mut reader, mut owner) = pair(window(100), ConnParams::default()).await;
    let (a, b, c) = (pattern(60, 3), pattern(60, 4), pattern(40, 5));
    let da = owner.register(a.clone()).unwrap();
    let db = owner.register(b.clone()).unwrap(); // 40 left: not pushed
    let dc = owner.register(c.clone()).unwrap(); // fits exactly
    assert_eq!((owner.counters().regions_pushed, owner.push.window_left()), (2, 0));
    until("both pushes to arrive", || reader.push.held() == 100).await;
    assert_eq!(read(&mut reader, 1, da).await.expect("READ a"), a);
    assert_eq!(read(&mut reader, 2, db).await.expect("READ b"), b);
    assert_eq!(read(&mut reader, 3, dc).await.expect("READ c"), c);
    assert_eq!((reader.counters().reads_served_from_push, owner.counters().reads_served), (2, 1));
    until("the window to come back", || owner.push.window_left() == 100).await;
    // With the window back, the next region is pushed again.
    owner.register(pattern(100, 6)).unwrap();
    assert_eq!(owner.counters().regions_pushed, 3);
}

#[tokio::test]
async fn a_read_racing_its_push_is_served_either_way_and_the_window_comes_back() {
    let (mut reader, mut owner) = pair(window(1 << 20), ConnParams::default()).await;
    for i in 0..20u8 {
        let data = pattern(10_000 + usize::from(i), i);
        // No wait: the READ may be posted before or after the push arrives.
        let desc = owner.register(data.clone()).unwrap();
        assert_eq!(read(&mut reader, u64::from(i), desc).await.expect("READ"), data);
    }
    let (r, o) = (reader.counters(), owner.counters());
    assert_eq!(o.regions_pushed, 20);
    assert_eq!(r.reads_served_from_push + o.reads_served, 20, "{r:?} {o:?}");
    // Pushes that lost the race were dropped on arrival: nothing is held, the window is whole.
    until("every push consumed or dropped", || reader.push.held() == 0).await;
    until("the window to come back", || owner.push.window_left() == 1 << 20).await;
}

#[tokio::test]
async fn revoking_a_pushed_region_drops_its_bytes_and_a_later_read_is_refused() {
    let (mut reader, mut owner) = pair(window(1 << 20), ConnParams::default()).await;
    let desc = owner.register(pattern(4096, 9)).unwrap();
    until("the push to arrive", || reader.push.held() == 4096).await;
    owner.deregister(desc).unwrap();
    until("the pushed bytes dropped", || reader.push.held() == 0 && reader.push.regions_held() == 0).await;
    until("the window to come back", || owner.push.window_left() == 1 << 20).await;

    // Exactly as without push: the owner refuses, the READ fails, both ends close.
    reader.post_read(1, desc, vec![0; 4096].into()).unwrap();
    match next(&mut reader).await {
        Ok(Completion::Read { wr_id: 1, result: Err(ReadError::InvalidKey(k)) }) => assert_eq!(k, desc.rkey),
        other => panic!("expected the refused READ, got {other:?}"),
    }
    assert!(matches!(next(&mut reader).await, Err(TransportError::Disconnected(_))));
    assert!(matches!(next(&mut owner).await, Err(TransportError::Disconnected(_))));
    assert_eq!(owner.counters().reads_refused, 1);
}

#[tokio::test]
async fn pushes_never_read_nor_revoked_are_bounded_by_the_window_and_die_with_the_connection() {
    let (mut reader, mut owner) = pair(window(1000), ConnParams::default()).await;
    for i in 0..10 {
        owner.register(pattern(300, i)).unwrap();
    }
    let o = owner.counters();
    assert_eq!((o.regions_registered, o.regions_pushed, o.bytes_pushed), (10, 3, 900));
    until("the pushes to arrive", || reader.push.held() == 900).await;
    assert_eq!(reader.push.regions_held(), 3);
    owner.close();
    assert!(matches!(next(&mut reader).await, Err(TransportError::Disconnected(_))));
    assert_eq!((reader.push.held(), reader.push.regions_held()), (0, 0), "dropped with the connection");
}

#[tokio::test]
async fn pushed_bytes_land_in_the_pool_and_are_handed_over_as_the_destination() {
    let (mut reader, mut owner) = pair(window(1 << 20), ConnParams::default()).await;
    let first = owner.register(pattern(200_000, 1)).unwrap();
    until("the push to arrive", || reader.push.held() == first.len).await;
    let dst = reader.pool().alloc(200_000).unwrap();
    let ours = dst.as_ptr();
    reader.post_read(1, first, dst).unwrap();
    let Ok(Completion::Read { result: Ok(got), .. }) = next(&mut reader).await else { panic!("READ failed") };
    assert_ne!(got.as_ptr(), ours, "the pushed buffer itself came back, not a copy into ours");
    assert!(reader.pool().contains(&got), "pushed bytes were read into the connection's pool");
    drop(got);

    let data = pattern(190_000, 2);
    let second = owner.register(data.clone()).unwrap();
    until("the second push to arrive", || reader.push.held() == second.len).await;
    let misses = reader.pool().counters().misses;
    let got = read(&mut reader, 2, second).await.expect("READ");
    assert_eq!(got, data);
    assert_eq!(reader.pool().counters().misses, misses, "the pool's buffers were reused");
}

/// Waits for the next completion of a boxed connection, which must be a receive.
async fn recv_boxed(conn: &mut dyn Connection) -> Vec<u8> {
    let mut out = Vec::new();
    let polled = poll_fn(|cx| conn.poll_completions(cx, &mut out, 1));
    tokio::time::timeout(Duration::from_secs(10), polled).await.expect("timely").expect("alive");
    match out.pop() {
        Some(Completion::Recv { buf }) => buf.bytes().to_vec(),
        other => panic!("expected a receive, got {other:?}"),
    }
}

async fn read_boxed(conn: &mut dyn Connection, remote: RegionDesc) -> Vec<u8> {
    conn.post_read(1, remote, vec![0; remote.len as usize].into()).expect("post_read");
    let mut out = Vec::new();
    let polled = poll_fn(|cx| conn.poll_completions(cx, &mut out, 1));
    tokio::time::timeout(Duration::from_secs(10), polled).await.expect("timely").expect("alive");
    match out.pop() {
        Some(Completion::Read { result: Ok(data), .. }) => data.to_vec(),
        other => panic!("expected a READ, got {other:?}"),
    }
}

#[tokio::test]
async fn a_listeners_connections_share_one_push_pool() {
    let params = ConnParams { tcp: TcpSettings::default().push_listener_total(100), ..ConnParams::default() };
    let mut l = listen("127.0.0.1:0".parse().unwrap(), params).await.expect("listen");
    let crate::Address::Tcp(addr) = l.local_addr() else { panic!("not tcp") };
    let mut a = connect(addr, ConnParams::default()).await.expect("connect a");
    let mut sa = l.accept().await.expect("accept a");
    let mut b = connect(addr, ConnParams::default()).await.expect("connect b");
    let mut sb = l.accept().await.expect("accept b");

    // Each client pushes 80 bytes, then a SEND: once the server has the SEND, it has the push.
    let da = a.register(pattern(80, 1)).unwrap();
    a.post_send(1, Bytes::from_static(b"a").into()).unwrap();
    assert_eq!(recv_boxed(&mut *sa).await, b"a");
    let db = b.register(pattern(80, 2)).unwrap();
    b.post_send(1, Bytes::from_static(b"b").into()).unwrap();
    assert_eq!(recv_boxed(&mut *sb).await, b"b");
    assert_eq!((a.counters().regions_pushed, b.counters().regions_pushed), (1, 1));

    // a's push is kept (80 of 100); b's did not fit what was left and was discarded.
    assert_eq!(read_boxed(&mut *sa, da).await, pattern(80, 1));
    assert_eq!(read_boxed(&mut *sb, db).await, pattern(80, 2));
    assert_eq!((sa.counters().reads_served_from_push, a.counters().reads_served), (1, 0));
    assert_eq!((sb.counters().reads_served_from_push, b.counters().reads_served), (0, 1));
}

#[tokio::test]
async fn a_read_served_from_push_completes_after_the_reads_posted_before_it() {
    let (mut reader, mut owner) = pair(window(100), ConnParams::default()).await;
    let (a, b) = (pattern(200, 1), pattern(50, 2));
    let da = owner.register(a.clone()).unwrap(); // beyond the window: READ from the owner
    let db = owner.register(b.clone()).unwrap(); // pushed
    until("the push to arrive", || reader.push.held() == 50).await;
    reader.post_read(1, da, vec![0; 200].into()).unwrap();
    reader.post_read(2, db, vec![0; 50].into()).unwrap();
    for (wr_id, data) in [(1, a), (2, b)] {
        match next(&mut reader).await.expect("alive") {
            Completion::Read { wr_id: id, result: Ok(got) } => {
                assert_eq!((id, got.to_vec()), (wr_id, data.to_vec()))
            }
            other => panic!("expected READ {wr_id}, got {other:?}"),
        }
    }
    assert_eq!((reader.counters().reads_served_from_push, owner.counters().reads_served), (1, 1));
}

//! Behaviour every backend must have, run against `mem` and `tcp`.

mod common;

use bytes::Bytes;
use common::*;
use rpc_transport::{Completion, ConnParams, ReadError, RecvBuffer, RegionDesc, TransportError};

/// Runs each listed scenario as a test on both backends.
macro_rules! on_every_backend {
    ($($scenario:ident),* $(,)?) => {
        mod mem {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() { super::$scenario(super::Backend::Mem).await })*
        }
        mod tcp {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() { super::$scenario(super::Backend::Tcp).await })*
        }
    };
}

on_every_backend!(
    round_trip,
    headed_messages_arrive_whole,
    completions_in_order,
    sends_reported_at_posting_complete_once_in_order,
    zero_byte_message,
    message_size_limit,
    connection_info,
    read_small_region,
    read_64_mib_region,
    many_reads_in_flight,
    read_with_wrong_key,
    read_out_of_bounds,
    read_after_deregister,
    read_destination_must_match,
    unexpected_message_is_counted_and_delivered_later,
    peer_close_flushes_and_errors,
    local_close_flushes_and_errors,
    posted_buffer_too_small_fails_connection,
);

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

async fn round_trip(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    send_ok(&mut *client, 1, b"ping").await;
    assert_eq!(recv(&mut *server).await, b"ping");
    send_ok(&mut *server, 2, b"pong").await;
    assert_eq!(recv(&mut *client).await, b"pong");
    let (c, s) = (client.counters(), server.counters());
    assert_eq!((c.sends, c.recvs, s.sends, s.recvs), (1, 1, 1, 1));
    assert_eq!(s.recvs_posted, 64 + 1, "initial receives plus the re-post");
    assert_eq!(c.recv_unexpected + s.recv_unexpected, 0);
}

/// A message given as a head and a body (`SendBuf::Headed`, a gather list) arrives as one
/// message, whatever the body's size (copied with the head, or written from where it lies).
async fn headed_messages_arrive_whole(b: Backend) {
    let (mut client, mut server) = pair(b, params(8, 64 << 10), params(8, 64 << 10)).await;
    for (i, body_len) in [0usize, 1, 100, 20 << 10, (64 << 10) - 40].into_iter().enumerate() {
        headed_message_arrives_whole(&mut *client, &mut *server, i as u8, body_len).await;
    }
}

async fn completions_in_order(b: Backend) {
    let (mut client, mut server) = pair(b, params(8, 64), params(200, 64)).await;
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

/// `post_send_batch_reporting`: a SEND completes once, either in `done` (as it is posted) or
/// from `poll_completions`, and all of them in posting order.
async fn sends_reported_at_posting_complete_once_in_order(b: Backend) {
    let (mut client, mut server) = pair(b, params(8, 64), params(200, 64)).await;
    let mut seen: Vec<u64> = Vec::new();
    let (mut sends, mut done, mut polled) = (Vec::new(), Vec::new(), Vec::new());
    let noop = futures::task::noop_waker();
    let mut early = 0;
    for batch in 0..15u64 {
        // What completed since the last batch, without waiting: it came before this batch.
        while let std::task::Poll::Ready(r) =
            client.poll_completions(&mut std::task::Context::from_waker(&noop), &mut polled, 64)
        {
            r.expect("poll");
        }
        for c in polled.drain(..) {
            let Completion::Send { wr_id, result } = c else { panic!("only SENDs were posted: {c:?}") };
            result.expect("send");
            seen.push(wr_id);
        }
        for i in batch * 10..batch * 10 + 10 {
            sends.push((i, Bytes::from(i.to_le_bytes().to_vec()).into()));
        }
        client.post_send_batch_reporting(&mut sends, &mut done).expect("post");
        assert!(sends.is_empty(), "the batch is drained");
        for (wr_id, result) in done.drain(..) {
            result.expect("send reported at posting");
            seen.push(wr_id);
            early += 1;
        }
    }
    while seen.len() < 150 {
        let (id, result) = send_done(&mut *client).await;
        result.expect("send");
        seen.push(id);
    }
    assert_eq!(seen, (0..150).collect::<Vec<u64>>(), "each SEND completes once, in posting order");
    for i in 0..150u64 {
        assert_eq!(recv(&mut *server).await, i.to_le_bytes(), "messages in sending order");
    }
    assert_eq!(client.counters().sends, 150);
    // mem delivers at once; tcp writes at least the first SEND itself (its writer idle).
    assert!(early > 0, "some SENDs were reported as they were posted");
}

async fn zero_byte_message(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    send_ok(&mut *client, 7, b"").await;
    send_ok(&mut *client, 8, b"after").await;
    assert_eq!(recv(&mut *server).await, b"");
    assert_eq!(recv(&mut *server).await, b"after");
}

async fn message_size_limit(b: Backend) {
    let (mut client, mut server) = pair(b, params(4, 64), params(4, 100)).await;
    assert_eq!(client.info().peer_recv_size, 100);
    let exact = pattern(100);
    send_ok(&mut *client, 1, &exact).await;
    assert_eq!(recv(&mut *server).await, exact);
    match client.post_send(2, Bytes::from(pattern(101)).into()) {
        Err(TransportError::MessageTooLarge { len: 101, max: 100 }) => {}
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    // The connection is still fine.
    send_ok(&mut *client, 3, b"still here").await;
    assert_eq!(recv(&mut *server).await, b"still here");
    // In a batch (tcp writes a batch in one system call).
    batch_stops_at_a_send_too_large(&mut *client, &mut *server, 100).await;
}

async fn connection_info(b: Backend) {
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
    let (client, server) = pair(b, client_params, server_params).await;
    let (ci, si) = (client.info(), server.info());
    assert_eq!(&ci.peer_private_data[..], b"from server");
    assert_eq!(&si.peer_private_data[..], b"from client");
    assert_eq!((ci.peer_recv_depth, ci.peer_recv_size), (5, 500));
    assert_eq!((si.peer_recv_depth, si.peer_recv_size), (3, 300));
    assert_eq!(ci.max_read_size, 1 << 30);
    let (backend, reads) = match b {
        Backend::Mem => ("mem", 16),
        Backend::Tcp => ("tcp", 64),
    };
    assert_eq!((ci.backend, ci.max_reads_in_flight), (backend, reads));
    assert_eq!((si.backend, si.max_reads_in_flight), (backend, reads));
    if let Backend::Tcp = b {
        assert!(ci.peer.starts_with("127.0.0.1:"), "{}", ci.peer);
    }
    assert_eq!(client.counters().recvs_posted, 3);
    assert_eq!(server.counters().recvs_posted, 5);
}

async fn read_small_region(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
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
    // tcp may have pushed the region at registration: its first whole READ is then served from
    // the pushed bytes; the partial ones always go to the owner.
    assert!(c.reads_served_from_push <= 1, "{c:?}");
    assert_eq!(server.counters().reads_served + c.reads_served_from_push, 3);
}

async fn read_64_mib_region(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    let data = pattern(64 << 20);
    let region = server.register(Bytes::from(data.clone())).unwrap();
    client.post_read(9, region, vec![0; 64 << 20].into()).unwrap();
    let (id, result) = read_done(&mut *client).await;
    assert_eq!(id, 9);
    assert!(result.expect("64 MiB READ") == data, "64 MiB READ returned different bytes");
    assert_eq!(client.counters().bytes_read, 64 << 20);
}

async fn many_reads_in_flight(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
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

/// A refused READ (as on verbs): the READ completes with `expected`, then both ends fail with
/// `Disconnected`; any other operation in flight is flushed, and the server sent nothing more.
async fn assert_refused_then_closed(
    client: &mut dyn rpc_transport::Connection,
    server: &mut dyn rpc_transport::Connection,
    wr_id: u64,
    expected: ReadError,
) {
    let (seen, err) = drain_to_error(client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    match &seen[..] {
        [Completion::Read { wr_id: id, result: Err(e) }, rest @ ..] => {
            assert_eq!((*id, e), (wr_id, &expected));
            for c in rest {
                assert!(
                    matches!(
                        c,
                        Completion::Read { result: Err(ReadError::Flushed), .. }
                            | Completion::Send { result: Err(TransportError::Disconnected(_)), .. }
                    ),
                    "after the refusal only flushes: {c:?}"
                );
            }
        }
        other => panic!("expected the refused READ first, got {other:?}"),
    }
    let (_, server_err) = drain_to_error(server).await;
    assert!(matches!(server_err, TransportError::Disconnected(_)), "{server_err:?}");
    assert!(client.post_read(wr_id + 1, RegionDesc { addr: 0, len: 0, rkey: 1 }, Vec::new().into()).is_err());
}

async fn read_with_wrong_key(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"private")).unwrap();
    let wrong = RegionDesc { rkey: region.rkey.wrapping_add(1), ..region };
    client.post_read(1, wrong, vec![0; 7].into()).unwrap();
    // Posted behind the bad READ (if the connection is not closed already): flushed, never served.
    let _ = client.post_read(2, region, vec![0; 7].into());
    assert_refused_then_closed(&mut *client, &mut *server, 1, ReadError::InvalidKey(wrong.rkey)).await;
    assert_eq!(server.counters().reads_refused, 1);
    assert_eq!(server.counters().reads_served, 0);
}

async fn read_out_of_bounds(b: Backend) {
    type Bad = fn(RegionDesc) -> RegionDesc;
    let cases: [(&str, Bad); 3] = [
        ("below", |r: RegionDesc| RegionDesc { addr: r.addr - 1, len: 4, ..r }),
        ("past the end", |r: RegionDesc| RegionDesc { addr: r.addr + 1, len: 64, ..r }),
        ("addr + len overflows", |r: RegionDesc| RegionDesc { addr: u64::MAX - 2, len: 8, ..r }),
    ];
    for (what, bad) in cases {
        eprintln!("case: {what}");
        let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
        let region = server.register(Bytes::from(pattern(64))).unwrap();
        let desc = bad(region);
        client.post_read(7, desc, vec![0; desc.len as usize].into()).unwrap();
        let expected = ReadError::OutOfBounds { addr: desc.addr, len: desc.len };
        assert_refused_then_closed(&mut *client, &mut *server, 7, expected).await;
        assert_eq!(server.counters().reads_refused, 1, "{what}");
    }
}

async fn read_after_deregister(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"short-lived")).unwrap();
    client.post_read(1, region, vec![0; 11].into()).unwrap();
    assert!(read_done(&mut *client).await.1.is_ok());
    server.deregister(region).unwrap();
    assert_eq!(server.counters().regions_revoked, 1);
    assert!(matches!(server.deregister(region), Err(TransportError::UnknownKey(k)) if k == region.rkey));
    client.post_read(2, region, vec![0; 11].into()).unwrap();
    assert_refused_then_closed(&mut *client, &mut *server, 2, ReadError::InvalidKey(region.rkey)).await;
    let s = server.counters();
    let served = s.reads_served + client.counters().reads_served_from_push;
    assert_eq!((s.regions_registered, s.regions_revoked, served, s.reads_refused), (1, 1, 1, 1));
}

async fn read_destination_must_match(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"12345678")).unwrap();
    assert!(matches!(client.post_read(1, region, vec![0; 7].into()), Err(TransportError::InvalidRead(_))));
    let huge = RegionDesc { len: (1 << 30) + 1, ..region };
    assert!(matches!(client.post_read(2, huge, Vec::new().into()), Err(TransportError::InvalidRead(_))));
    assert_eq!(client.counters().reads_issued, 0);
}

async fn unexpected_message_is_counted_and_delivered_later(b: Backend) {
    let (mut client, mut server) = pair(b, params(4, 64), params(1, 64)).await;
    for (i, msg) in [&b"one"[..], b"two", b"three"].iter().enumerate() {
        send_ok(&mut *client, i as u64, msg).await;
    }
    wait_counters(&*server, "two unexpected messages", |c| c.recv_unexpected == 2).await;
    // The one posted receive got the first message; the others wait for receives.
    let first = match next(&mut *server).await.unwrap() {
        Completion::Recv { buf } => buf,
        other => panic!("expected a receive, got {other:?}"),
    };
    assert_eq!(first.bytes(), b"one");
    server.post_recv(first).unwrap();
    server.post_recv(RecvBuffer::new(64)).unwrap();
    assert_eq!(recv(&mut *server).await, b"two");
    assert_eq!(recv(&mut *server).await, b"three");
    let s = server.counters();
    assert_eq!((s.recvs, s.recv_unexpected), (3, 2));
}

async fn peer_close_flushes_and_errors(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from(pattern(1 << 20))).unwrap();
    for i in 0..8 {
        client.post_read(i, region, vec![0; 1 << 20].into()).unwrap();
        client.post_send(100 + i, Bytes::from_static(b"x").into()).unwrap();
    }
    server.close();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    // Every operation completes exactly once, with its data or a flush error.
    let mut ids: Vec<u64> = seen
        .iter()
        .filter_map(|c| match c {
            Completion::Read { wr_id, result } => {
                assert!(
                    matches!(result, Ok(v) if v.len() == 1 << 20) || result == &Err(ReadError::Flushed),
                    "{result:?}"
                );
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
    // The error is sticky, and nothing more can be posted.
    assert!(matches!(next(&mut *client).await, Err(TransportError::Disconnected(_))));
    assert!(client.post_send(1, Bytes::new().into()).is_err());
    assert!(client.post_read(1, region, vec![0; 1 << 20].into()).is_err());
    assert!(client.post_recv(RecvBuffer::new(8)).is_err());
    let (_, server_err) = drain_to_error(&mut *server).await;
    assert!(matches!(server_err, TransportError::Disconnected(_)));
}

async fn local_close_flushes_and_errors(b: Backend) {
    let (mut client, mut server) = pair(b, ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"abc")).unwrap();
    client.post_read(1, region, vec![0; 3].into()).unwrap();
    client.close();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    assert!(
        matches!(&seen[..], [Completion::Read { wr_id: 1, result }] if result.is_ok() || result == &Err(ReadError::Flushed)),
        "{seen:?}"
    );
    // The peer sees the disconnect.
    let (_, err) = drain_to_error(&mut *server).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    drop(client); // closing twice (drop after close) is harmless
}

async fn posted_buffer_too_small_fails_connection(b: Backend) {
    let (mut client, mut server) = pair(b, params(4, 64), params(1, 64)).await;
    send_ok(&mut *client, 1, b"fits").await;
    match next(&mut *server).await.unwrap() {
        Completion::Recv { buf } => assert_eq!(buf.bytes(), b"fits"),
        other => panic!("expected a receive, got {other:?}"),
    }
    server.post_recv(RecvBuffer::new(4)).unwrap(); // smaller than the advertised recv_size
    client.post_send(2, Bytes::from_static(b"does not fit").into()).unwrap();
    let (_, err) = drain_to_error(&mut *server).await;
    assert!(matches!(err, TransportError::Malformed(_)), "{err:?}");
    let (_, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
}

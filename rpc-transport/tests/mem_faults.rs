//! The `mem` fabric: naming, and every fault-injection knob.

mod common;

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use futures::FutureExt;
use rpc_transport::mem::{self, MemFabric};
use rpc_transport::{Address, Completion, ConnParams, Connection, ReadError, TransportError};

#[tokio::test]
async fn names_are_exclusive_and_freed_on_drop() {
    let fabric = MemFabric::new();
    let l = fabric.listen("svc", ConnParams::default()).unwrap();
    assert_eq!(l.local_addr(), Address::Mem("svc".into()));
    match fabric.listen("svc", ConnParams::default()) {
        Err(TransportError::Listen { source, .. }) => assert_eq!(source.kind(), io::ErrorKind::AddrInUse),
        other => panic!("expected the name to be taken, got {other:?}"),
    }
    drop(l);
    let _again = fabric.listen("svc", ConnParams::default()).expect("name free after drop");
    // Fabrics are independent.
    let _other = MemFabric::new().listen("svc", ConnParams::default()).expect("another fabric");
}

#[tokio::test]
async fn connect_without_listener_is_refused() {
    let fabric = MemFabric::new();
    match fabric.connect("nobody", ConnParams::default()).await {
        Err(TransportError::Connect { source, .. }) => {
            assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused)
        }
        other => panic!("expected ConnectionRefused, got {other:?}"),
    }
    let addr: Address = format!("mem://{}", unique_name("nobody")).parse().unwrap();
    assert!(matches!(
        rpc_transport::connect(&addr, ConnParams::default()).await,
        Err(TransportError::Connect { .. })
    ));
}

#[tokio::test]
async fn bad_params_are_rejected() {
    let fabric = MemFabric::new();
    let _l = fabric.listen("p", ConnParams::default()).unwrap();
    let big = ConnParams { private_data: Bytes::from(vec![0; 257]), ..ConnParams::default() };
    assert!(matches!(fabric.connect("p", big).await, Err(TransportError::Handshake(_))));
    assert!(matches!(fabric.listen("q", params(0, 10)), Err(TransportError::Handshake(_))));
}

#[tokio::test]
async fn unaccepted_connection_dies_with_its_listener() {
    let fabric = MemFabric::new();
    let l = fabric.listen("gone", ConnParams::default()).unwrap();
    let mut client = fabric.connect("gone", ConnParams::default()).await.unwrap();
    drop(l);
    let (_, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
}

#[tokio::test]
async fn fault_plan_is_shared_by_name_and_global() {
    let name = unique_name("shared");
    let a = mem::faults(&name);
    let b = MemFabric::global().faults(&name);
    assert!(Arc::ptr_eq(&a, &b));
    assert!(!Arc::ptr_eq(&a, &MemFabric::new().faults(&name)), "each fabric has its own plans");
}

#[tokio::test]
async fn kill_takes_down_every_connection_of_the_name() {
    let fabric = MemFabric::new();
    let mut l = fabric.listen("victim", ConnParams::default()).unwrap();
    let mut conns = Vec::new();
    for _ in 0..2 {
        let c = fabric.connect("victim", ConnParams::default()).await.unwrap();
        let s = l.accept().await.unwrap();
        conns.push(c);
        conns.push(s);
    }
    let mut bystander_l = fabric.listen("bystander", ConnParams::default()).unwrap();
    let mut bystander = fabric.connect("bystander", ConnParams::default()).await.unwrap();
    let mut bystander_peer = bystander_l.accept().await.unwrap();

    // A READ pending (delayed) when the kill lands is flushed.
    let region = conns[1].register(Bytes::from_static(b"data")).unwrap();
    fabric.faults("victim").set_completion_delay(Duration::from_secs(3600));
    conns[0].post_read(5, region, vec![0; 4].into()).unwrap();
    fabric.faults("victim").kill();

    let (seen, err) = drain_to_error(&mut *conns[0]).await;
    assert!(
        matches!(&seen[..], [Completion::Read { wr_id: 5, result: Err(ReadError::Flushed) }]),
        "{seen:?}"
    );
    assert!(matches!(err, TransportError::Disconnected(_)));
    for conn in &mut conns[1..] {
        let (_, err) = drain_to_error(&mut **conn).await;
        assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    }
    // Other names are untouched, and the name itself can be used again.
    send_ok(&mut *bystander, 1, b"fine").await;
    assert_eq!(recv(&mut *bystander_peer).await, b"fine");
    fabric.faults("victim").clear();
    let mut c = fabric.connect("victim", ConnParams::default()).await.unwrap();
    let mut s = l.accept().await.unwrap();
    send_ok(&mut *c, 2, b"after the kill").await;
    assert_eq!(recv(&mut *s).await, b"after the kill");
}

#[tokio::test]
async fn completion_delay_holds_completions_back_in_order() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    let delay = Duration::from_millis(150);
    fabric.faults(&name).set_completion_delay(delay);
    let region = server.register(Bytes::from_static(b"delayed")).unwrap();
    let start = Instant::now();
    client.post_send(1, Bytes::from_static(b"a").into()).unwrap();
    client.post_read(2, region, vec![0; 7].into()).unwrap();
    fabric.faults(&name).set_completion_delay(Duration::ZERO);
    client.post_send(3, Bytes::from_static(b"b").into()).unwrap(); // not delayed, but must not overtake

    let mut out = Vec::new();
    let polled = futures::future::poll_fn(|cx| client.poll_completions(cx, &mut out, 8)).now_or_never();
    assert!(polled.is_none(), "nothing completes before the delay");

    assert_eq!(send_done(&mut *client).await.0, 1);
    assert!(start.elapsed() >= delay, "completed after {:?}", start.elapsed());
    assert_eq!(read_done(&mut *client).await, (2, Ok(b"delayed".to_vec())));
    assert_eq!(send_done(&mut *client).await.0, 3);
    assert_eq!(recv(&mut *server).await, b"a");
    assert_eq!(recv(&mut *server).await, b"b");
}

#[tokio::test]
async fn delayed_operations_are_flushed_by_close() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"never read")).unwrap();
    fabric.faults(&name).set_completion_delay(Duration::from_secs(3600));
    client.post_read(1, region, vec![0; 10].into()).unwrap();
    client.post_send(2, Bytes::from_static(b"never sent").into()).unwrap();
    server.close();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)));
    assert!(
        matches!(
            &seen[..],
            [
                Completion::Read { wr_id: 1, result: Err(ReadError::Flushed) },
                Completion::Send { wr_id: 2, result: Err(TransportError::Disconnected(_)) }
            ]
        ),
        "{seen:?}"
    );
}

#[tokio::test]
async fn fail_next_completions_fails_sends_without_delivering() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    fabric.faults(&name).fail_next_completions(2);
    for i in 0..3u64 {
        client.post_send(i, Bytes::from(vec![i as u8; 4]).into()).unwrap();
    }
    for i in 0..2 {
        let (id, result) = send_done(&mut *client).await;
        assert_eq!(id, i);
        assert!(matches!(result, Err(TransportError::Injected(_))), "{result:?}");
    }
    let (id, result) = send_done(&mut *client).await;
    assert_eq!(id, 2);
    result.expect("the third send is not failed");
    assert_eq!(recv(&mut *server).await, vec![2; 4], "only the third message arrived");
    assert_eq!(server.counters().recvs, 1);
}

#[tokio::test]
async fn fail_reads_refuses_reads_until_turned_off() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    let region = server.register(Bytes::from_static(b"guarded")).unwrap();
    fabric.faults(&name).fail_reads(true);
    client.post_read(1, region, vec![0; 7].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (1, Err(ReadError::Failed("injected".into()))));
    assert_eq!(server.counters().reads_served, 0, "the peer's memory was not read");
    fabric.faults(&name).fail_reads(false);
    client.post_read(2, region, vec![0; 7].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (2, Ok(b"guarded".to_vec())));
}

#[tokio::test]
async fn corrupt_next_frames_flips_bytes_of_delivered_messages() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    fabric.faults(&name).corrupt_next_frames(1);
    let msg = b"0123456789";
    send_ok(&mut *client, 1, msg).await;
    send_ok(&mut *client, 2, msg).await;
    let corrupted = recv(&mut *server).await;
    let expected: Vec<u8> = msg.iter().enumerate().map(|(i, b)| if i < 8 { b ^ 0xA5 } else { *b }).collect();
    assert_eq!(corrupted, expected);
    assert_eq!(recv(&mut *server).await, msg, "only the next 1 message is corrupted");
}

#[tokio::test]
async fn clear_turns_every_knob_off() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    let plan = fabric.faults(&name);
    plan.set_completion_delay(Duration::from_secs(3600));
    plan.fail_next_completions(5);
    plan.fail_reads(true);
    plan.corrupt_next_frames(5);
    plan.set_send_stall(Duration::from_secs(3600));
    plan.clear();
    let region = server.register(Bytes::from_static(b"ok")).unwrap();
    send_ok(&mut *client, 1, b"clean").await;
    assert_eq!(recv(&mut *server).await, b"clean");
    client.post_read(2, region, vec![0; 2].into()).unwrap();
    assert_eq!(read_done(&mut *client).await, (2, Ok(b"ok".to_vec())));
}

#[tokio::test]
async fn a_send_stall_blocks_the_posting_thread_inside_the_post_then_delivers() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    let plan = fabric.faults(&name);
    plan.set_send_stall(Duration::from_millis(50));
    let posted = Instant::now();
    client.post_send(1, Bytes::from_static(b"slow").into()).unwrap();
    let held = posted.elapsed();
    assert!(held >= Duration::from_millis(50), "the post itself took {held:?}");
    let (id, result) = send_done(&mut *client).await;
    assert_eq!(id, 1);
    result.expect("send completion");
    assert_eq!(recv(&mut *server).await, b"slow", "delivered intact after the stall");
    plan.set_send_stall(Duration::ZERO);
    send_ok(&mut *client, 2, b"quick").await;
    assert_eq!(recv(&mut *server).await, b"quick");
}

#[tokio::test]
async fn plan_set_before_listening_applies_to_later_connections() {
    let name = unique_name("early");
    mem::faults(&name).fail_next_completions(1);
    let mut l = MemFabric::global().listen(&name, ConnParams::default()).unwrap();
    let addr: Address = format!("mem://{name}").parse().unwrap();
    let mut client = rpc_transport::connect(&addr, ConnParams::default()).await.unwrap();
    let _server = l.accept().await.unwrap();
    client.post_send(1, Bytes::from_static(b"x").into()).unwrap();
    assert!(matches!(send_done(&mut *client).await, (1, Err(TransportError::Injected(_)))));
}

/// Polls `conn` for `window`; `true` if no completion (and no error) showed up meanwhile.
async fn stays_silent(conn: &mut dyn Connection, window: Duration) -> bool {
    let mut out = Vec::new();
    let polled =
        tokio::time::timeout(window, futures::future::poll_fn(|cx| conn.poll_completions(cx, &mut out, 8)));
    polled.await.is_err() && out.is_empty()
}

#[tokio::test]
async fn black_hole_swallows_sends_and_reads_both_ways_without_death() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    let server_region = server.register(Bytes::from_static(b"server bytes")).unwrap();
    let client_region = client.register(Bytes::from_static(b"client bytes")).unwrap();
    fabric.faults(&name).black_hole();
    client.post_send(1, Bytes::from_static(b"to server").into()).unwrap();
    client.post_read(2, server_region, vec![0; 12].into()).unwrap();
    server.post_send(3, Bytes::from_static(b"to client").into()).unwrap();
    server.post_read(4, client_region, vec![0; 12].into()).unwrap();

    assert!(stays_silent(&mut *client, Duration::from_millis(200)).await, "the client saw a completion");
    assert!(stays_silent(&mut *server, Duration::from_millis(50)).await, "the server saw a completion");
    for c in [client.counters(), server.counters()] {
        assert_eq!(
            (c.recvs, c.recv_unexpected, c.reads_served, c.reads_refused, c.bytes_read),
            (0, 0, 0, 0, 0)
        );
    }

    // Nothing died: the swallowed operations are flushed only when the connection is closed.
    client.close();
    let (seen, err) = drain_to_error(&mut *client).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    assert!(
        matches!(
            &seen[..],
            [
                Completion::Send { wr_id: 1, result: Err(TransportError::Disconnected(_)) },
                Completion::Read { wr_id: 2, result: Err(ReadError::Flushed) },
            ]
        ),
        "{seen:?}"
    );
    let (seen, err) = drain_to_error(&mut *server).await;
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    assert_eq!(seen.len(), 2, "the server's SEND and READ are flushed: {seen:?}");
}

#[tokio::test]
async fn black_hole_can_be_turned_off_for_later_operations() {
    let (mut client, mut server, fabric, name) = mem_pair(ConnParams::default(), ConnParams::default()).await;
    let plan = fabric.faults(&name);
    plan.black_hole();
    client.post_send(1, Bytes::from_static(b"lost").into()).unwrap();
    plan.set_black_hole(false);
    send_ok(&mut *client, 2, b"delivered").await;
    assert_eq!(recv(&mut *server).await, b"delivered", "the swallowed message never arrives");
    assert!(stays_silent(&mut *server, Duration::from_millis(50)).await);
    plan.black_hole();
    plan.clear();
    send_ok(&mut *client, 3, b"clear turns it off").await;
    assert_eq!(recv(&mut *server).await, b"clear turns it off");
}

#[tokio::test]
async fn accept_queue_is_bounded_by_max_pending_handshakes() {
    let fabric = MemFabric::new();
    let name = unique_name("pending");
    let server_params = ConnParams { max_pending_handshakes: 1, ..ConnParams::default() };
    let mut l = fabric.listen(&name, server_params).unwrap();
    let impatient = ConnParams { handshake_timeout: Duration::from_millis(100), ..ConnParams::default() };
    let _first = fabric.connect(&name, impatient.clone()).await.expect("room for one");
    match fabric.connect(&name, impatient.clone()).await {
        Err(TransportError::Handshake(why)) => assert!(why.contains("accepted nothing"), "{why}"),
        other => panic!("expected a handshake timeout, got {other:?}"),
    }
    // A connect that waits gets in as soon as the listener accepts.
    let patient = fabric.connect(&name, ConnParams::default());
    let (second, accepted) = within("accept", async { tokio::join!(patient, l.accept()) }).await;
    let (mut second, _first_server) = (second.expect("connect after an accept"), accepted.expect("accept"));
    let mut second_server = within("accept", l.accept()).await.expect("second connection accepted");
    send_ok(&mut *second, 1, b"queued").await;
    assert_eq!(recv(&mut *second_server).await, b"queued");
}

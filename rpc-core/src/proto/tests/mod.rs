//! Deterministic tests of the protocol core: no sockets, no tokio, a virtual clock.

mod batched;
mod credits;
mod fuzz_regressions;
mod harness;
mod limits;
mod malformed;
mod quiet_poll;
mod revocation;

use std::time::Duration;

use bytes::Bytes;
use harness::{payload, Pair};

use super::*;

pub(crate) const T: usize = 1024; // eager threshold used by most tests

/// One call of `req` bytes answered with `resp` bytes; returns the paths taken.
fn round_trip(pair: &mut Pair, call_id: u64, req: usize, resp: usize) -> CallInfo {
    let request = payload(req, 1);
    pair.call(call_id, request.clone());
    pair.pump();
    let reqs = pair.take_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].1, request, "server got the request intact");
    let response = payload(resp, 2);
    assert!(pair.server.respond(call_id, Ok(response.clone())));
    pair.pump();
    let done = pair.take_completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1.as_ref().expect("call ok"), &response, "client got the response intact");
    done[0].2
}

pub(crate) fn assert_clean(pair: &Pair) {
    assert!(pair.c.regions.is_empty(), "client regions left registered: {:?}", pair.c.regions.keys());
    assert!(pair.s.regions.is_empty(), "server regions left registered: {:?}", pair.s.regions.keys());
    assert_eq!(pair.c.unexpected + pair.s.unexpected, 0, "a SEND met an empty receive queue");
    assert_eq!(pair.client.calls_in_flight(), 0);
    assert_eq!(pair.server.calls_in_flight(), 0);
}

#[test]
fn eager_both_ways() {
    let mut p = Pair::with(T, 16);
    let info = round_trip(&mut p, 1, 10, 20);
    assert_eq!(info, CallInfo { request: Path::Eager, response: Path::Eager });
    assert_clean(&p);
    assert_eq!(p.client.stats().eager_sent, 1);
    assert_eq!(p.server.stats().eager_sent, 1);
}

#[test]
fn sizes_at_the_threshold_boundary_both_directions() {
    let mut p = Pair::with(T, 16);
    let cases = [(0, Path::Eager), (T, Path::Eager), (T + 1, Path::Rendezvous), (1 << 20, Path::Rendezvous)];
    let mut id = 0;
    for (size, path) in cases {
        id += 1;
        let info = round_trip(&mut p, id, size, 0);
        assert_eq!(info.request, path, "request of {size} bytes");
        id += 1;
        let info = round_trip(&mut p, id, 0, size);
        assert_eq!(info.response, path, "response of {size} bytes");
    }
    assert_clean(&p);
}

#[test]
fn rendezvous_request_key_revoked_only_after_the_server_read_it() {
    let mut p = Pair::with(T, 16);
    p.hold_reads = true;
    p.call(1, payload(5000, 3));
    p.pump();
    assert_eq!(p.c.regions.len(), 1, "request region advertised");
    assert_eq!(p.s.reads.len(), 1, "server issued a READ");
    assert!(p.c.revoked.is_empty(), "not revoked before the READ is done");
    p.serve_reads();
    p.pump();
    assert!(p.c.regions.is_empty(), "revoked after the server reported the READ done");
    assert_eq!(p.take_requests()[0].2, Path::Rendezvous);
}

#[test]
fn rendezvous_response_key_revoked_after_the_client_read_it() {
    let mut p = Pair::with(T, 16);
    p.call(1, payload(1, 0));
    p.pump();
    p.take_requests();
    p.hold_reads = true;
    p.server.respond(1, Ok(payload(70_000, 4)));
    p.pump();
    assert_eq!(p.s.regions.len(), 1);
    assert!(p.take_completions().is_empty(), "not complete before the READ");
    p.hold_reads = false;
    p.pump();
    let done = p.take_completions();
    assert_eq!(done[0].1.as_ref().unwrap(), &payload(70_000, 4));
    assert_eq!(done[0].2.response, Path::Rendezvous);
    assert_clean(&p);
    assert_eq!(p.server.stats().keys_revoked, 1);
}

#[test]
fn many_calls_with_few_credits_never_overrun_receives() {
    let mut p = Pair::with(T, 4);
    for id in 1..=1000 {
        let size = if id % 10 == 0 { 3000 } else { 16 };
        p.call(id, payload(size, id as u8));
    }
    p.pump();
    let reqs = p.take_requests();
    assert_eq!(reqs.len(), 1000, "every request arrived despite 4 credits");
    // Answer in reverse order: responses are matched by call id, not by order.
    for (id, body, _) in reqs.into_iter().rev() {
        let resp = if id % 7 == 0 { payload(2000, id as u8) } else { body };
        p.server.respond(id, Ok(resp));
        p.pump();
    }
    let done = p.take_completions();
    assert_eq!(done.len(), 1000);
    for (id, result, _) in done {
        let size = if id % 7 == 0 {
            2000
        } else if id % 10 == 0 {
            3000
        } else {
            16
        };
        let seed = id as u8;
        assert_eq!(result.unwrap(), payload(size, seed), "call {id} got its own response");
    }
    assert_clean(&p);
    assert!(p.client.stats().credit_stalls > 0, "the test did exercise credit stalls");
}

#[test]
fn responses_out_of_order() {
    let mut p = Pair::with(T, 16);
    for id in 1..=3 {
        p.call(id, payload(8, id as u8));
    }
    p.pump();
    p.take_requests();
    for id in [3, 1, 2] {
        p.server.respond(id, Ok(Bytes::from(vec![id as u8])));
    }
    p.pump();
    let order: Vec<u64> = p.take_completions().iter().map(|c| c.0).collect();
    assert_eq!(order, vec![3, 1, 2]);
}

#[test]
fn cancel_aborts_the_handler_and_drops_the_late_response() {
    let mut p = Pair::with(T, 16);
    p.call(1, payload(8, 0));
    p.pump();
    p.take_requests();
    assert!(p.client.cancel(1));
    p.pump();
    let cancels: Vec<_> = p.server_events.drain(..).collect();
    assert_eq!(cancels, vec![ServerEvent::Cancel { call_id: 1, reason: CancelReason::Cancelled }]);
    assert!(!p.server.respond(1, Ok(payload(8, 0))), "a late answer is dropped");
    p.pump();
    assert!(p.take_completions().is_empty(), "no event after a cancel");
    assert_clean(&p);
}

#[test]
fn deadline_expires_at_the_client_and_cancels_the_server_handler() {
    let mut p = Pair::with(T, 16);
    p.client.start_call(1, 7, payload(8, 0), Some(Duration::from_millis(50)), p.now).unwrap();
    p.pump();
    assert_eq!(p.take_requests().len(), 1);
    assert_eq!(p.client.poll_timeout(), Some(p.now + Duration::from_millis(50)));
    p.advance(Duration::from_millis(49));
    assert!(p.take_completions().is_empty());
    p.advance(Duration::from_millis(1));
    let done = p.take_completions();
    assert_eq!(done[0].1, Err(CallFailure::DeadlineExceeded));
    assert!(p.server_events.iter().any(|e| matches!(e, ServerEvent::Cancel { call_id: 1, .. })));
    assert_clean(&p);
}

#[test]
fn deadline_travels_as_a_relative_duration_and_expires_at_the_server_too() {
    let mut p = Pair::with(T, 16);
    p.client.start_call(1, 7, payload(8, 0), Some(Duration::from_millis(30)), p.now).unwrap();
    p.pump();
    p.server_events.retain(
        |e| !matches!(e, ServerEvent::Request { timeout: Some(t), .. } if *t == Duration::from_millis(30)),
    );
    assert!(p.server_events.is_empty(), "server saw the 30 ms timeout");
    // Only the server's clock moves: it cancels the handler on its own.
    p.server.handle_timeout(p.now + Duration::from_millis(30)).unwrap();
    p.pump();
    assert_eq!(
        p.server_events,
        vec![ServerEvent::Cancel { call_id: 1, reason: CancelReason::DeadlineExceeded }]
    );
}

#[test]
fn response_over_the_client_limit_is_refused_by_the_server() {
    let client_cfg = harness::config(T, 16).max_message_size(10_000);
    let mut p = Pair::new(client_cfg, harness::config(T, 16));
    p.call(1, payload(8, 0));
    p.pump();
    p.take_requests();
    p.server.respond(1, Ok(payload(9_000, 0)));
    p.pump();
    assert!(p.take_completions()[0].1.is_ok(), "within the limit");
    p.call(2, payload(8, 0));
    p.pump();
    p.take_requests();
    p.server.respond(2, Ok(payload(20_000, 0)));
    p.pump();
    let done = p.take_completions();
    assert!(matches!(&done[0].1, Err(CallFailure::Remote(w)) if w.code == WireErrorCode::PayloadTooLarge));
    assert_clean(&p);
}

#[test]
fn request_larger_than_the_server_accepts_is_refused_before_sending() {
    let server_cfg = harness::config(T, 16).max_message_size(4096);
    let mut p = Pair::new(harness::config(T, 16), server_cfg);
    let err = p.client.start_call(1, 7, payload(5000, 0), None, p.now).unwrap_err();
    assert_eq!(err, StartError::TooLarge { len: 5000, max: 4096 });
}

#[test]
fn remote_errors_arrive_typed() {
    let mut p = Pair::with(T, 16);
    p.call(1, payload(8, 0));
    p.pump();
    p.take_requests();
    p.server.respond(1, Err(WireError::new(WireErrorCode::UnknownMethod, "no such method")));
    p.pump();
    let done = p.take_completions();
    assert_eq!(
        done[0].1,
        Err(CallFailure::Remote(WireError::new(WireErrorCode::UnknownMethod, "no such method")))
    );
}

#[test]
fn shutting_down_server_refuses_new_calls_and_finishes_old_ones() {
    let mut p = Pair::with(T, 16);
    p.call(1, payload(8, 0));
    p.pump();
    p.take_requests();
    p.server.begin_shutdown();
    assert!(!p.server.is_idle());
    p.call(2, payload(5000, 0)); // rendezvous: the refusal must also release the client's region
    p.pump();
    let done = p.take_completions();
    assert!(matches!(&done[0].1, Err(CallFailure::Remote(w)) if w.code == WireErrorCode::ShuttingDown));
    p.server.respond(1, Ok(payload(4, 0)));
    let sent: Vec<Op> = std::iter::from_fn(|| p.server.poll_op()).collect();
    assert!(!p.server.is_idle(), "not idle while the response's SEND has not completed");
    for op in sent {
        if let Op::Send { wr_id, frame } = op {
            p.client.handle_recv(&frame.into_bytes(), p.now).unwrap();
            p.server.handle_send_complete(wr_id, Ok(())).unwrap();
        }
    }
    assert!(p.take_completions()[0].1.is_ok());
    assert!(p.server.is_idle());
    assert_clean(&p);
}

#[test]
fn connection_failure_fails_every_pending_call() {
    let mut p = Pair::with(T, 16);
    for id in 1..=5 {
        p.call(id, payload(8, 0));
    }
    p.pump();
    p.client.fail_all("peer died");
    let done = p.take_completions();
    assert_eq!(done.len(), 5);
    assert!(done.iter().all(|d| d.1 == Err(CallFailure::Disconnected("peer died".into()))));
}

#[test]
fn start_call_checks_ids_and_the_in_flight_bound() {
    let cfg = harness::config(T, 16).max_in_flight(2);
    let mut p = Pair::new(cfg.clone(), cfg);
    assert_eq!(p.client.start_call(0, 1, Bytes::new(), None, p.now), Err(StartError::ZeroId));
    p.call(1, Bytes::new());
    assert_eq!(p.client.start_call(1, 1, Bytes::new(), None, p.now), Err(StartError::DuplicateId(1)));
    p.call(2, Bytes::new());
    assert_eq!(p.client.start_call(3, 1, Bytes::new(), None, p.now), Err(StartError::TooManyInFlight(2)));
}

#[test]
fn a_frame_the_transport_copies_goes_as_header_and_body_side_by_side() {
    use rpc_transport::{MemPool, PoolLimits, SendBuf};
    let cfg = harness::config(T, 16);
    let now = std::time::Instant::now();
    let body = payload(600, 3);
    let sent_as = |copied: u32| {
        let mut client = ClientProto::new(&cfg, &harness::limits(&cfg), now)
            .with_pool(MemPool::heap(PoolLimits::default()))
            .with_copied_sends(copied);
        client.start_call(1, 7, body.clone(), None, now).unwrap();
        match client.poll_op() {
            Some(Op::Send { frame, .. }) => frame,
            other => panic!("expected the request's SEND, got {other:?}"),
        }
    };
    // Copied by the transport as it is posted (tcp, mem; inline on verbs): the header, then the
    // body where it lies; nothing assembled.
    let frame = sent_as(u32::MAX);
    let SendBuf::Headed { head, body: sent } = &frame else { panic!("not headed: {frame:?}") };
    assert_eq!(head.as_slice().len(), HEADER_LEN);
    assert_eq!(sent.as_ptr(), body.as_ptr(), "the body itself, not a copy");
    let header = Header::decode(&frame.into_bytes()).unwrap();
    assert_eq!((header.kind, header.body_len as usize), (Kind::Request, body.len()));
    // Sent from memory the NIC reads (verbs, larger than the inline size): assembled once in a
    // buffer of the pool.
    let frame = sent_as(64);
    assert!(matches!(frame, SendBuf::Owned(_)), "{frame:?}");
    assert_eq!(frame.len(), HEADER_LEN + body.len());
    assert_eq!(frame.parts()[0][HEADER_LEN..], body[..]);
}

//! What a peer can make one connection hold is bounded: credits enforced, frames waiting for
//! credits capped by backpressure, rendezvous bytes held to a budget, and silence detected.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::harness::{config, limits, payload, Pair};
use super::{assert_clean, T};
use crate::proto::*;

fn frame(mut h: Header, body: &[u8]) -> Vec<u8> {
    h.body_len = body.len() as u32;
    let mut out = [0u8; HEADER_LEN];
    h.encode(&mut out);
    let mut v = out.to_vec();
    v.extend_from_slice(body);
    v
}

fn request(call_id: u64) -> Vec<u8> {
    let mut h = Header::new(Kind::Request);
    h.call_id = call_id;
    frame(h, b"x")
}

#[test]
fn a_frame_beyond_the_credits_granted_closes_the_connection() {
    let cfg = config(T, 4);
    let now = Instant::now();
    let mut server = ServerProto::new(&cfg, &limits(&cfg), now);
    for id in 1..=4 {
        server.handle_recv(&request(id), now).expect("within the 4 credits granted");
    }
    // The server has not sent anything, so it granted nothing more.
    assert_eq!(server.handle_recv(&request(5), now), Err(ProtoError::CreditViolation));
    assert_eq!(server.stats().credit_violations, 1);
}

#[test]
fn a_client_that_returns_no_credits_is_held_to_a_bounded_number_of_requests() {
    // The server grants 8 receives, may queue 4 frames before it withholds credits, and the
    // client posted only 4 receives (so the server can send it 3 data frames).
    let server_cfg = config(T, 8).max_queued_frames(4);
    let client_cfg = config(T, 4);
    let now = Instant::now();
    let mut server = ServerProto::new(&server_cfg, &limits(&client_cfg), now);
    let mut client_credits: u32 = 8;
    let mut next_id = 1;
    let mut queued_responses = 0;
    // The hostile client: sends requests while it has credits, never returns any.
    for _round in 0..100 {
        if client_credits == 0 {
            break;
        }
        client_credits -= 1;
        server.handle_recv(&request(next_id), now).expect("within credits");
        next_id += 1;
        while let Some(ServerEvent::Request { call_id, .. }) = server.poll_event() {
            assert!(server.respond(call_id, Ok(Bytes::from_static(b"value"))));
            queued_responses += 1;
        }
        while let Some(op) = server.poll_op() {
            if let Op::Send { frame, .. } = op {
                client_credits += u32::from(Header::decode(&frame.into_bytes()).unwrap().credits);
            }
        }
    }
    // Bound: the 8 receives granted, plus what the few frames the server could send before its
    // queue reached 4 returned. Without backpressure the client could go on for ever.
    let sent = next_id - 1;
    assert!(
        sent <= 8 + 4 + 4,
        "the client sent {sent} requests: the server returned credits while backlogged"
    );
    assert_eq!(client_credits, 0, "the client ran out of credits");
    let stats = server.stats();
    assert!(
        stats.queued_frames_peak <= 4 + 8,
        "frames waiting for credits: {} (responses {queued_responses})",
        stats.queued_frames_peak
    );
    assert_eq!(server.handle_recv(&request(next_id), now), Err(ProtoError::CreditViolation));
}

#[test]
fn idle_connections_ping_and_a_silent_peer_is_declared_dead() {
    let cfg = config(T, 16).keepalive_interval(Duration::from_secs(2)).idle_timeout(Duration::from_secs(10));
    let mut p = Pair::new(cfg.clone(), cfg);
    for _ in 0..10 {
        p.advance(Duration::from_secs(2)); // both sides ping, both answer: nobody is silent
    }
    assert!(p.client.stats().pings_sent >= 5, "pings: {}", p.client.stats().pings_sent);
    assert!(p.server.stats().pings_sent >= 5);
    assert_eq!(p.c.unexpected + p.s.unexpected, 0);
    // Now the client hears nothing for 10 s: its pings vanish, it keeps running on time.
    let start = p.now;
    for s in [2, 4, 6, 8] {
        let at = start + Duration::from_secs(s);
        assert!(p.client.poll_timeout().is_some_and(|t| t <= at), "the driver is woken by then");
        p.client.handle_timeout(at).expect("not yet");
        while p.client.poll_op().is_some() {}
    }
    let silent = start + Duration::from_secs(10);
    assert!(p.client.poll_timeout().is_some_and(|t| t <= silent));
    assert!(matches!(p.client.handle_timeout(silent), Err(ProtoError::PeerSilent { .. })));
}

#[test]
fn reads_wait_for_the_rendezvous_budget_and_one_large_payload_proceeds_alone() {
    let server_cfg = config(T, 16).max_rendezvous_bytes(25_000);
    let mut p = Pair::new(config(T, 16), server_cfg);
    p.hold_reads = true;
    for id in 1..=3 {
        p.call(id, payload(10_000, id as u8));
    }
    p.pump();
    assert_eq!(p.s.reads.len(), 2, "two 10 kB READs fit 25 kB; the third waits");
    assert_eq!(p.server.stats().rendezvous_bytes_held, 20_000);
    p.serve_reads();
    p.pump();
    assert_eq!(p.s.reads.len(), 1, "the third READ went once budget was released");
    p.hold_reads = false;
    p.pump();
    assert_eq!(p.take_requests().len(), 3);
    // 100 kB, four times the budget: nothing else is held, so it proceeds.
    p.call(4, payload(100_000, 4));
    p.pump();
    assert_eq!(p.take_requests().len(), 1);
    assert_eq!(p.server.stats().rendezvous_bytes_peak, 100_000);
    for id in 1..=4 {
        p.server.respond(id, Ok(payload(4, 0)));
    }
    p.pump();
    assert_eq!(p.take_completions().len(), 4);
    assert_clean(&p);
}

#[test]
fn reads_in_flight_never_exceed_the_connection_read_depth() {
    let mut p = Pair::with(T, 64);
    p.hold_reads = true;
    for id in 1..=40 {
        p.call(id, payload(2000, id as u8));
    }
    p.pump();
    assert_eq!(p.s.reads.len(), 16, "the harness's connections allow 16 READs at once");
    p.hold_reads = false;
    p.pump();
    assert_eq!(p.take_requests().len(), 40);
}

#[test]
fn handlers_wait_while_responses_awaiting_done_fill_the_budget() {
    let server_cfg = config(T, 16).max_rendezvous_bytes(50_000);
    let mut p = Pair::new(config(T, 16), server_cfg);
    for id in 1..=4 {
        p.call(id, payload(8, 0));
    }
    p.pump();
    p.take_requests();
    p.hold_reads = true;
    // An unknown response size takes the whole budget: among the large ones, that handler runs
    // alone. A small one goes on: the unknown response does not exist yet.
    assert!(p.server.try_start_handler(1, u64::MAX));
    assert!(!p.server.try_start_handler(3, 50_000), "no other large one while the unknown one runs");
    assert!(p.server.try_start_handler(2, 10), "an eager-sized response needs only room");
    p.server.respond(1, Ok(payload(50_000, 1)));
    p.pump();
    assert_eq!(p.server.stats().rendezvous_bytes_held, 50_000, "the reservation became the response's size");
    p.server.respond(2, Ok(payload(8, 2)));
    // The first response, not READ yet, fills the budget: now small ones wait too.
    assert!(!p.server.try_start_handler(4, 8), "a response the client leaves unread stops small calls");
    assert!(!p.server.try_start_handler(3, 50_000), "50 kB + 50 kB does not fit 50 kB");
    p.hold_reads = false;
    p.pump();
    assert!(p.server.try_start_handler(3, 50_000), "the client READ the first response");
    p.server.respond(3, Ok(payload(50_000, 3)));
    assert!(
        !p.server.try_start_handler(4, 50_000),
        "reserved from respond(), before the registration is posted"
    );
    p.pump();
    assert!(p.server.try_start_handler(4, 50_000));
    p.server.respond(4, Ok(payload(8, 4)));
    p.pump();
    assert_eq!(p.take_completions().len(), 4);
    assert_eq!(p.server.stats().rendezvous_bytes_held, 0);
    assert_clean(&p);
}

#[test]
fn the_server_wide_budget_is_shared_by_connections() {
    let shared = SharedBudget::new(15_000);
    let mk = |shared: &std::sync::Arc<SharedBudget>| {
        let mut p = Pair::with(T, 16);
        let cfg = config(T, 16);
        p.server = ServerProto::new(&cfg, &limits(&cfg), p.now).with_shared_budget(shared.clone());
        p.hold_reads = true;
        p
    };
    let (mut a, mut b) = (mk(&shared), mk(&shared));
    a.call(1, payload(10_000, 1));
    a.pump();
    b.call(1, payload(10_000, 2));
    b.pump();
    assert_eq!(a.s.reads.len(), 1);
    assert!(b.s.reads.is_empty(), "connection B waits: the server's budget is spent");
    assert!(b.server.blocked_on_shared_budget().is_some());
    assert_eq!(shared.held(), 10_000);
    a.hold_reads = false;
    a.pump();
    assert_eq!(shared.held(), 0);
    b.pump(); // the driver polls again once woken
    assert_eq!(b.s.reads.len(), 1, "B's READ went once A released");
    drop(b);
    assert_eq!(shared.held(), 0, "a connection that goes away gives back what it held");
}

#[test]
fn a_backlogged_server_still_lets_a_well_behaved_client_return_credits() {
    // Responses pile up faster than the client's 4 receives take them, far beyond the queue
    // limit: the server withholds credits, yet must never leave the client unable to return
    // its own (that would deadlock both ends until keepalive declared them dead).
    for depth in [4, 5, 8] {
        for limit in [1, 2, 3] {
            let server_cfg = config(T, depth).max_queued_frames(limit);
            let mut p = Pair::new(config(T, depth), server_cfg);
            for id in 1..=200 {
                p.call(id, payload(16, id as u8));
            }
            for _round in 0..10_000 {
                p.pump();
                let reqs = p.take_requests();
                if reqs.is_empty() {
                    break;
                }
                for (id, body, _) in reqs {
                    p.server.respond(id, Ok(body));
                }
            }
            let done = p.take_completions();
            assert_eq!(done.len(), 200, "depth {depth}, queue limit {limit}: every call completes");
            assert!(done.iter().all(|d| d.1.is_ok()));
            assert_clean(&p);
        }
    }
}

#[test]
fn the_servers_calls_table_holds_at_most_max_in_flight_calls() {
    // A client that allows more calls at once than the server: the server's table of calls in
    // progress (keyed by the client's ids) stops at its own bound; the rest are refused.
    let mut p = Pair::new(config(T, 16).max_in_flight(8), config(T, 16).max_in_flight(2));
    for id in 1..=5u64 {
        p.call(id, payload(16, id as u8));
    }
    p.pump();
    let taken: Vec<u64> = p.take_requests().iter().map(|r| r.0).collect();
    assert_eq!(taken, vec![1, 2]);
    assert_eq!(p.server.calls_in_flight(), 2);
    let mut refused = p.take_completions();
    refused.sort_by_key(|c| c.0);
    assert_eq!(refused.iter().map(|c| c.0).collect::<Vec<_>>(), vec![3, 4, 5]);
    for (id, result, _) in &refused {
        match result {
            Err(CallFailure::Remote(e)) => assert_eq!(e.code, WireErrorCode::Overloaded, "call {id}"),
            other => panic!("call {id}: {other:?}"),
        }
    }
    // An answered call frees its place: the next request is taken again, and no more.
    assert!(p.server.respond(1, Ok(Bytes::from_static(b"one"))));
    p.pump();
    p.call(6, payload(16, 6));
    p.call(7, payload(16, 7));
    p.pump();
    assert_eq!(p.take_requests().iter().map(|r| r.0).collect::<Vec<_>>(), vec![6]);
    assert_eq!(p.server.calls_in_flight(), 2);
}

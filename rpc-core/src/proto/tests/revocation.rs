//! A cancel or a deadline never revokes a region the peer may be READing: on verbs that READ
//! would fail and take the whole connection down. The region goes with the peer's done report,
//! which comes once a READ in flight completes, at once if none was started.

use std::time::Duration;

use super::harness::{payload, Pair};
use super::{assert_clean, T};
use crate::proto::*;

/// Client call 1 with a rendezvous request; the server's READ of it is issued and held.
fn request_being_read(p: &mut Pair) -> rpc_transport::RegionDesc {
    p.hold_reads = true;
    p.call(1, payload(10_000, 9));
    p.pump();
    let (_, remote) = *p.s.reads.front().expect("server READ in flight");
    remote
}

#[test]
fn cancel_while_the_server_reads_the_request_keeps_the_region_until_the_read_is_done() {
    let mut p = Pair::with(T, 16);
    let remote = request_being_read(&mut p);
    assert!(p.client.cancel(1));
    p.pump();
    assert_eq!(p.c.regions.len(), 1, "not revoked while the server may be READing it");
    assert!(p.c.revoked.is_empty());
    assert_eq!(p.client.regions_advertised(), 1);
    // The READ in flight completes with the right key, then the server reports done.
    assert_eq!(p.c.serve_read(&remote).map(|b| b.len()), Ok(10_000));
    p.hold_reads = false;
    p.pump();
    assert_eq!(p.c.revoked, vec![remote.rkey], "revoked after the server's done report");
    assert!(p.take_requests().is_empty(), "the cancelled request never reached a handler");
    assert!(p.take_completions().is_empty(), "no event after a cancel");
    assert_clean(&p);
}

#[test]
fn cancel_before_the_server_issued_its_read_is_reported_done_at_once() {
    // The server's budget admits one 10 kB READ at a time: call 2's READ waits.
    let server_cfg = super::harness::config(T, 16).max_rendezvous_bytes(12_000);
    let mut p = Pair::new(super::harness::config(T, 16), server_cfg);
    p.hold_reads = true;
    p.call(1, payload(10_000, 1));
    p.call(2, payload(10_000, 2));
    p.pump();
    assert_eq!(p.s.reads.len(), 1, "the second READ waits for the budget");
    assert!(p.server.stats().budget_waits > 0);
    assert!(p.client.cancel(2));
    p.pump();
    assert_eq!(p.c.regions.len(), 1, "call 2's region revoked at once: its READ was never issued");
    p.hold_reads = false;
    p.pump();
    let reqs = p.take_requests();
    assert_eq!(reqs.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1]);
    p.server.respond(1, Ok(payload(8, 0)));
    p.pump();
    assert_eq!(p.take_completions().len(), 1);
    assert_clean(&p);
}

/// Call 1 answered with a rendezvous response that the client is READing (held).
fn response_being_read(p: &mut Pair) -> rpc_transport::RegionDesc {
    p.call(1, payload(8, 0));
    p.pump();
    p.take_requests();
    p.hold_reads = true;
    p.server.respond(1, Ok(payload(50_000, 1)));
    p.pump();
    let (_, remote) = *p.c.reads.front().expect("client READ in flight");
    remote
}

#[test]
fn cancel_while_the_client_reads_the_response_keeps_the_server_region_until_done() {
    let mut p = Pair::with(T, 16);
    let remote = response_being_read(&mut p);
    p.client.cancel(1);
    p.pump();
    assert_eq!(p.s.regions.len(), 1, "the server does not revoke what the client may be READing");
    assert_eq!(p.s.serve_read(&remote).map(|b| b.len()), Ok(50_000));
    p.hold_reads = false;
    p.pump();
    assert_eq!(p.s.revoked, vec![remote.rkey]);
    assert!(p.take_completions().is_empty(), "the data of a cancelled call is dropped");
    assert_eq!(p.client.stats().rendezvous_bytes_held, 0);
    assert_eq!(p.server.stats().rendezvous_bytes_held, 0);
    assert_clean(&p);
}

#[test]
fn a_response_advertised_after_the_cancel_is_reported_done_without_a_read() {
    let mut p = Pair::with(T, 16);
    p.call(1, payload(8, 0));
    p.pump();
    p.take_requests();
    p.client.cancel(1);
    // The server answers before it sees the cancel: the descriptor crosses the cancel.
    p.server.respond(1, Ok(payload(50_000, 1)));
    p.pump();
    assert!(p.c.reads.is_empty() && p.s.reads.is_empty(), "nobody READ anything");
    assert_eq!(p.s.revoked.len(), 1, "the client reported done for a response it will not READ");
    assert_clean(&p);
}

#[test]
fn deadlines_firing_on_both_sides_mid_response_revoke_nothing_under_a_read() {
    let mut p = Pair::with(T, 16);
    p.client.start_call(1, 7, payload(8, 0), Some(Duration::from_millis(10)), p.now).unwrap();
    p.pump();
    p.take_requests();
    p.hold_reads = true;
    p.server.respond(1, Ok(payload(50_000, 1)));
    p.pump();
    let (_, remote) = *p.c.reads.front().expect("client READ in flight");
    p.advance(Duration::from_millis(10)); // both clocks: both deadlines pass
    assert_eq!(p.take_completions()[0].1, Err(CallFailure::DeadlineExceeded));
    assert_eq!(p.s.regions.len(), 1, "still registered: the client's READ is in flight");
    assert_eq!(p.s.serve_read(&remote).map(|b| b.len()), Ok(50_000), "the READ succeeds");
    p.hold_reads = false;
    p.pump();
    assert_eq!(p.s.revoked, vec![remote.rkey]);
    assert_clean(&p);
}

#[test]
fn server_deadline_while_reading_the_request_waits_for_the_read() {
    let mut p = Pair::with(T, 16);
    p.hold_reads = true;
    p.client.start_call(1, 7, payload(10_000, 3), Some(Duration::from_millis(10)), p.now).unwrap();
    p.pump();
    let (_, remote) = *p.s.reads.front().expect("server READ in flight");
    p.server.handle_timeout(p.now + Duration::from_millis(10)).unwrap();
    p.pump();
    assert!(p.server_events.iter().any(|e| matches!(e, ServerEvent::Cancel { call_id: 1, .. })));
    assert_eq!(p.c.regions.len(), 1);
    assert!(p.c.serve_read(&remote).is_ok());
    p.hold_reads = false;
    p.pump();
    assert_eq!(p.c.revoked, vec![remote.rkey], "revoked after the READ the server had in flight");
    assert!(p.take_requests().is_empty());
}

#[test]
fn a_region_never_reported_done_closes_the_connection_after_the_done_timeout() {
    let cfg = super::harness::config(T, 16).done_timeout(Duration::from_secs(5));
    let mut p = Pair::new(cfg.clone(), cfg);
    p.call(1, payload(8, 0));
    p.pump();
    p.take_requests();
    p.hold_reads = true;
    p.server.respond(1, Ok(payload(50_000, 1)));
    p.pump();
    let at = p.server.poll_timeout().expect("a done deadline is armed");
    assert!(at <= p.now + Duration::from_secs(5));
    assert_eq!(
        p.server.handle_timeout(p.now + Duration::from_secs(5)),
        Err(ProtoError::DoneTimeout { call_id: 1, timeout: Duration::from_secs(5) })
    );
    assert_eq!(p.server.stats().done_timeouts, 1);
}

#[test]
fn a_read_that_never_completes_closes_the_connection_after_the_read_timeout() {
    let cfg = super::harness::config(T, 16).read_timeout(Duration::from_secs(3));
    let mut p = Pair::new(cfg.clone(), cfg);
    let _ = request_being_read(&mut p);
    assert_eq!(
        p.server.handle_timeout(p.now + Duration::from_secs(3)),
        Err(ProtoError::ReadTimeout { call_id: 1, timeout: Duration::from_secs(3) })
    );
}

//! Inputs the fuzz targets in `fuzz/` found to break the protocol core, replayed as plain tests.
//! Each test names the target and what the input did.

use std::time::Duration;

use super::harness::{payload, Pair};
use crate::proto::*;

/// `client_proto`: a call started with `Duration::MAX` ("no deadline, really") panicked with
/// "overflow when adding duration to instant". A timeout too far away to be a point in time is
/// no deadline at all: the call proceeds and completes normally.
#[test]
fn a_timeout_beyond_the_clock_is_no_deadline() {
    let mut p = Pair::with(1024, 16);
    p.client.start_call(1, 7, payload(10, 1), Some(Duration::MAX), p.now).expect("start_call");
    p.pump();
    let keepalive = ProtoConfig::default().keepalive_interval;
    let next = p.client.poll_timeout().expect("keepalive is armed");
    assert!(next <= p.now + keepalive, "only keepalive is armed, no timer for an unreachable deadline");
    let requests = p.take_requests();
    assert_eq!(requests.len(), 1);
    assert!(p.server.respond(1, Ok(payload(5, 2))));
    for _ in 0..1800 {
        p.advance(keepalive); // an hour, with the keepalive exchanges an idle hour has
    }
    let done = p.take_completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1.as_ref().expect("answered"), &payload(5, 2));
}

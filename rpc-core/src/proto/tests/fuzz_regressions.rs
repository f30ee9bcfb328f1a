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

fn frame(kind: Kind, call_id: u64, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(kind);
    h.call_id = call_id;
    h.flags = flags;
    h.body_len = body.len() as u32;
    let mut out = [0u8; HEADER_LEN];
    h.encode(&mut out);
    let mut v = out.to_vec();
    v.extend_from_slice(body);
    v
}

/// `server_proto`: a client advertises a request (call 5), abandons it while the server READs it
/// (a cancel, or its deadline passes), and advertises another request under the same id. The
/// server issued a second READ with wr_id 5 while the first was in flight: the first READ's
/// completion was then taken for the second request (its handler ran on the wrong payload, and
/// the second region was reported done before the server had READ it), and each
/// abandon/re-request cycle left one more READ destination allocated. Whatever the server does
/// with the second request (refuse it, or wait for the first READ), it must never have two READs
/// of one call id in flight, nor hand a handler bytes that were not its request's.
fn reused_call_id(abandon: impl FnOnce(&mut Pair)) {
    fn take_reads(server: &mut ServerProto, reads: &mut Vec<(u64, u32)>) {
        while let Some(op) = server.poll_op() {
            if let Op::Read { wr_id, remote } = op {
                assert!(reads.is_empty(), "a second READ for call 5 while the first is in flight");
                reads.push((wr_id, remote.rkey));
            }
        }
    }
    let request = |rkey, deadline_us| {
        let mut f = frame(
            Kind::Request,
            5,
            FLAG_RENDEZVOUS,
            &encode_desc(&rpc_transport::RegionDesc { addr: 0x1000, len: 5000, rkey }),
        );
        f[32..40].copy_from_slice(&u64::to_le_bytes(deadline_us));
        f
    };
    let mut p = Pair::with(1024, 16);
    let mut reads = Vec::new();
    p.server.handle_recv(&request(1, 1000), p.now).expect("first request");
    take_reads(&mut p.server, &mut reads);
    assert_eq!(reads.iter().map(|r| r.1).collect::<Vec<_>>(), [1]);
    let first_read = reads[0].0;
    abandon(&mut p);
    // Refusing the reused id (an error answer, or closing the connection) is acceptable too.
    if p.server.handle_recv(&request(2, 0), p.now).is_err() {
        return;
    }
    take_reads(&mut p.server, &mut reads);
    // The first READ completes with the first request's bytes.
    reads.clear();
    p.server.handle_read_complete(first_read, Ok(payload(5000, 1)));
    take_reads(&mut p.server, &mut reads);
    while let Some(event) = p.server.poll_event() {
        if let ServerEvent::Request { payload: got, .. } = event {
            assert_ne!(got, payload(5000, 1), "the abandoned request's bytes were handed to the new call");
        }
    }
}

#[test]
fn a_call_id_reused_after_a_cancel_never_has_two_reads_in_flight() {
    reused_call_id(|p| p.server.handle_recv(&frame(Kind::Cancel, 5, 0, b""), p.now).expect("cancel"));
}

#[test]
fn a_call_id_reused_after_its_deadline_never_has_two_reads_in_flight() {
    reused_call_id(|p| {
        p.now += Duration::from_millis(2);
        p.server.handle_timeout(p.now).expect("not fatal");
    });
}

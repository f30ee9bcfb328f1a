//! Frames a peer might send that break the protocol: each is a typed error, never a panic.

use bytes::Bytes;
use proptest::prelude::*;

use super::harness::{config, payload, Pair};
use crate::proto::*;

fn frame(h: Header, body: &[u8]) -> Vec<u8> {
    let mut h = h;
    h.body_len = body.len() as u32;
    let mut out = [0u8; HEADER_LEN];
    h.encode(&mut out);
    let mut v = out.to_vec();
    v.extend_from_slice(body);
    v
}

fn request(call_id: u64) -> Header {
    let mut h = Header::new(Kind::Request);
    h.call_id = call_id;
    h
}

#[test]
fn header_round_trips() {
    let mut h = request(42);
    h.flags = FLAG_RENDEZVOUS;
    h.credits = 3;
    h.method_id = 0xdead_beef;
    h.done = 41;
    h.arg = 1_000_000;
    let f = frame(h, &[0u8; DESC_LEN]);
    let mut expect = h;
    expect.body_len = DESC_LEN as u32;
    assert_eq!(Header::decode(&f), Ok(expect));
}

#[test]
fn each_malformation_has_its_own_error() {
    let good = frame(request(1), b"abc");
    assert_eq!(Header::decode(&good[..10]), Err(ProtoError::Truncated { len: 10 }));
    let mut bad = good.clone();
    bad[0] ^= 0xff;
    assert!(matches!(Header::decode(&bad), Err(ProtoError::BadMagic(_))));
    let mut bad = good.clone();
    bad[2] = 9;
    assert_eq!(Header::decode(&bad), Err(ProtoError::UnsupportedVersion(9)));
    let mut bad = good.clone();
    bad[3] = 77;
    assert_eq!(Header::decode(&bad), Err(ProtoError::UnknownKind(77)));
    assert_eq!(
        Header::decode(&good[..good.len() - 1]),
        Err(ProtoError::LengthMismatch { declared: 3, actual: 2 })
    );
    let mut h = request(1);
    h.flags = 0x80;
    assert_eq!(Header::decode(&frame(h, b"")), Err(ProtoError::UnknownFlags(0x80)));
    assert_eq!(Header::decode(&frame(request(0), b"")), Err(ProtoError::ZeroCallId));
    let mut c = Header::new(Kind::Cancel);
    c.call_id = 1;
    assert_eq!(Header::decode(&frame(c, b"x")), Err(ProtoError::UnexpectedBody(Kind::Cancel)));
}

/// A call id whose response region is still advertised (the client may be READing it) is not
/// free: a request under it is a duplicate, as long as the region is held, and not after.
#[test]
fn a_call_id_whose_response_region_is_still_advertised_is_a_duplicate() {
    let mut p = Pair::with(1024, 16);
    p.call(5, payload(8, 1));
    p.pump();
    assert_eq!(p.take_requests().len(), 1);
    // A response over the eager limit: registered, then advertised; the client's READ is held.
    p.hold_reads = true;
    assert!(p.server.respond(5, Ok(payload(5000, 2))));
    p.pump();
    assert_eq!(p.server.regions_advertised(), 1);
    assert_eq!(p.server.calls_in_flight(), 0, "the call left the table when its answer was queued");
    let now = p.now;
    assert_eq!(p.server.handle_recv(&frame(request(5), b""), now), Err(ProtoError::DuplicateCall(5)));

    // Once the client reports its READ done, the id is free again.
    let mut q = Pair::with(1024, 16);
    q.call(5, payload(8, 1));
    q.pump();
    q.take_requests();
    assert!(q.server.respond(5, Ok(payload(5000, 2))));
    q.pump();
    assert_eq!(q.take_completions().len(), 1);
    assert_eq!(q.server.regions_advertised(), 0, "the done report released the region");
    q.call(5, payload(8, 3));
    q.pump();
    assert_eq!(q.take_requests().iter().map(|r| r.0).collect::<Vec<_>>(), [5]);
}

#[test]
fn role_violations_are_errors() {
    let mut p = Pair::with(1024, 16);
    let now = p.now;
    // A request sent to a client, a response sent to a server.
    assert_eq!(
        p.client.handle_recv(&frame(request(1), b""), p.now),
        Err(ProtoError::UnexpectedKind(Kind::Request))
    );
    let mut r = Header::new(Kind::Response);
    r.call_id = 1;
    assert_eq!(p.server.handle_recv(&frame(r, b""), now), Err(ProtoError::UnexpectedKind(Kind::Response)));
    // Duplicate call id while the first is in progress.
    p.server.handle_recv(&frame(request(5), b""), now).unwrap();
    assert_eq!(p.server.handle_recv(&frame(request(5), b""), now), Err(ProtoError::DuplicateCall(5)));
    // A rendezvous request whose body is not a descriptor.
    let mut h = request(6);
    h.flags = FLAG_RENDEZVOUS;
    assert_eq!(p.server.handle_recv(&frame(h, b"short"), now), Err(ProtoError::BadDescriptor));
    // More credits than were ever granted.
    let mut c = Header::new(Kind::Credit);
    c.credits = 1000;
    assert_eq!(p.client.handle_recv(&frame(c, b""), p.now), Err(ProtoError::CreditOverflow));
}

#[test]
fn advertised_response_over_the_limit_fails_the_call_and_reports_done() {
    let mut p = Pair::new(config(1024, 16).max_message_size(4096), config(1024, 16));
    p.call(1, payload(4, 0));
    p.pump();
    // A misbehaving server advertises more than the client accepts.
    let mut r = Header::new(Kind::Response);
    r.call_id = 1;
    r.flags = FLAG_RENDEZVOUS;
    let desc = rpc_transport::RegionDesc { addr: 0x1000, len: 1 << 40, rkey: 9 };
    p.client.handle_recv(&frame(r, &encode_desc(&desc)), p.now).unwrap();
    let done = p.take_completions();
    assert_eq!(done[0].1, Err(CallFailure::TooLarge { len: 1 << 40, max: 4096 }));
    // The client tells the server it is done with that region (a credit frame with `done`).
    let sent: Vec<Op> = std::iter::from_fn(|| p.client.poll_op()).collect();
    let reported = sent.iter().any(|op| match op {
        Op::Send { frame, .. } => {
            Header::decode(&frame.parts().concat()).map(|h| h.done == 1).unwrap_or(false)
        }
        _ => false,
    });
    assert!(reported, "done reported for the refused region: {sent:?}");
}

#[test]
fn wire_error_messages_are_cut_on_a_char_boundary() {
    let long = "é".repeat(MAX_ERROR_MESSAGE);
    let e = WireError::new(WireErrorCode::Handler, long);
    let enc = e.encode();
    assert!(enc.len() <= 2 + MAX_ERROR_MESSAGE);
    let dec = WireError::decode(&enc);
    assert_eq!(dec.code, WireErrorCode::Handler);
    assert!(dec.message.chars().all(|c| c == 'é'));
    assert_eq!(WireError::decode(&[]).code, WireErrorCode::Other(0));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut p = Pair::with(1024, 16);
        let now = p.now;
        let _ = Header::decode(&bytes);
        let _ = p.client.handle_recv(&bytes, p.now);
        let _ = p.server.handle_recv(&bytes, now);
        let _ = decode_desc(&bytes);
        let _ = WireError::decode(&bytes);
        let _ = Hello::decode(&bytes);
    }

    #[test]
    fn mutated_valid_frames_never_panic(pos in 0usize..64, val in any::<u8>(), cut in 0usize..64) {
        let mut h = request(3);
        h.flags = FLAG_RENDEZVOUS;
        let desc = rpc_transport::RegionDesc { addr: 1, len: 10, rkey: 2 };
        let mut f = frame(h, &encode_desc(&desc));
        if pos < f.len() { f[pos] = val; }
        f.truncate(f.len().saturating_sub(cut % 8));
        let mut p = Pair::with(1024, 16);
        let now = p.now;
        let _ = p.server.handle_recv(&f, now);
        let _ = p.client.handle_recv(&f, p.now);
        while p.server.poll_op().is_some() {}
        let _ = Bytes::new();
    }
}

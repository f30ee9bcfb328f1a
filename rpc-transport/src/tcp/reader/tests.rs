use std::task::Poll;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::tcp::push::Push;
use crate::tcp::wire;
use crate::{Completion, ConnParams, RegionDesc, TransportError};

struct Harness {
    reader: Reader,
    soft: Arc<Soft>,
    responses: crate::tcp::outbox::OutboxRx,
}

fn harness(recv_depth: u32, recv_size: u32) -> Harness {
    harness_with_push(recv_depth, recv_size, Push::new(0, 0, None))
}

fn harness_with_push(recv_depth: u32, recv_size: u32, push: Push) -> Harness {
    let soft = Soft::new(&ConnParams { recv_depth, recv_size, ..ConnParams::default() });
    let (out, responses) = crate::tcp::outbox::Outbox::new(None);
    let mut reader = Reader::new(soft.clone(), out, recv_size, Arc::new(push));
    reader.close_grace = std::time::Duration::ZERO;
    Harness { reader, soft, responses }
}

fn run(h: &mut Harness, input: &[u8]) -> Death {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let mut r = input;
    rt.block_on(h.reader.run(&mut r))
}

/// As [`run`], with the input read through a buffer of `capacity` bytes: frames longer than it
/// never lie whole in the buffer, so they take the per-frame path instead of the buffered one.
fn run_chunked(h: &mut Harness, input: &[u8], capacity: usize) -> Death {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let mut r = tokio::io::BufReader::with_capacity(capacity, input);
    rt.block_on(h.reader.run(&mut r))
}

fn completions(soft: &Soft) -> (Vec<Completion>, Poll<Result<(), TransportError>>) {
    let mut out = Vec::new();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        match soft.poll_completions(&mut cx, &mut out, 64) {
            Poll::Ready(Ok(())) => continue,
            other => return (out, other),
        }
    }
}

fn send_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = wire::encode_send(payload.len() as u32).to_vec();
    f.extend_from_slice(payload);
    f
}

#[test]
fn pipelined_sends_are_taken_from_the_read_buffer_in_order() {
    let mut input = Vec::new();
    for payload in [&b"one"[..], b"", b"three", b"four"] {
        input.extend(send_frame(payload));
    }
    for capacity in [input.len(), 5] {
        let mut h = harness(3, 16);
        let death = run_chunked(&mut h, &input, capacity);
        assert!(matches!(death, Death::Closed(_)), "clean EOF at a frame boundary: {death:?}");
        let (done, _) = completions(&h.soft);
        let got: Vec<&[u8]> = done
            .iter()
            .map(|c| match c {
                Completion::Recv { buf } => buf.bytes(),
                other => panic!("only receives: {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [&b"one"[..], b"", b"three"],
            "three posted receives, in order (capacity {capacity})"
        );
        assert_eq!(h.soft.counters().recv_unexpected, 1, "the fourth waits for a receive");
    }
}

#[test]
fn sends_land_in_posted_receives_then_wait_for_more() {
    let mut h = harness(1, 16);
    let mut input = send_frame(b"first");
    input.extend(send_frame(b"second"));
    let death = run(&mut h, &input);
    assert!(matches!(death, Death::Closed(_)), "clean EOF at a frame boundary: {death:?}");
    assert_eq!(h.soft.counters().recv_unexpected, 1);
    let (done, _) = completions(&h.soft);
    assert!(matches!(&done[..], [Completion::Recv { buf }] if buf.bytes() == b"first"));
    h.soft.post_recv(crate::RecvBuffer::new(16)).unwrap();
    let (done, _) = completions(&h.soft);
    assert!(matches!(&done[..], [Completion::Recv { buf }] if buf.bytes() == b"second"));
}

#[test]
fn framing_violations_are_malformed() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown type", vec![0xEE, 1, 2, 3]),
        ("send over recv_size", send_frame(&[0; 17])),
        ("response to nothing", wire::encode_read_resp(42, wire::STATUS_OK, 0).to_vec()),
    ];
    for (what, input) in cases {
        let mut h = harness(2, 16);
        let death = run(&mut h, &input);
        assert!(matches!(death, Death::Malformed(_)), "{what}: {death:?}");
    }
}

#[test]
fn a_stream_that_ends_inside_a_frame_is_a_close_not_a_violation() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("inside a header", wire::encode_read_req(1, 2, 3, 4)[..10].to_vec()),
        ("inside a SEND's payload", send_frame(b"0123456789")[..8].to_vec()),
        ("after the type byte", vec![wire::T_SEND]),
    ];
    for (what, input) in cases {
        let mut h = harness(2, 16);
        let death = run(&mut h, &input);
        assert!(
            matches!(&death, Death::Closed(d) if d.to_string().contains("inside a frame")),
            "{what}: {death:?}"
        );
    }
}

#[test]
fn read_responses_must_match_the_pending_read() {
    let remote = RegionDesc { addr: 0x100, len: 4, rkey: 9 };
    // Wrong length.
    let mut h = harness(1, 16);
    let id = h.soft.begin_read(1, remote, vec![0; 4].into()).unwrap();
    let death = run(&mut h, &wire::encode_read_resp(id, wire::STATUS_OK, 5));
    assert!(matches!(death, Death::Malformed(_)), "{death:?}");
    // Right length: filled and completed; a second answer to the same id is malformed.
    let mut h = harness(1, 16);
    let id = h.soft.begin_read(7, remote, vec![0; 4].into()).unwrap();
    let mut input = wire::encode_read_resp(id, wire::STATUS_OK, 4).to_vec();
    input.extend_from_slice(b"data");
    input.extend_from_slice(&wire::encode_read_resp(id, wire::STATUS_OK, 4));
    let death = run(&mut h, &input);
    assert!(matches!(death, Death::Malformed(_)), "{death:?}");
    let (done, _) = completions(&h.soft);
    assert!(matches!(&done[..], [Completion::Read { wr_id: 7, result: Ok(v) }] if v == b"data"));
}

#[test]
fn read_requests_are_served_or_refused_without_data() {
    type Frame = fn(RegionDesc) -> [u8; 29];
    let refusals: [(&str, Frame); 3] = [
        ("wrong key", |d: RegionDesc| wire::encode_read_req(2, d.addr, 6, d.rkey ^ 1)),
        ("below the region", |d: RegionDesc| wire::encode_read_req(2, d.addr - 1, 6, d.rkey)),
        ("past the end", |d: RegionDesc| wire::encode_read_req(2, d.addr, u64::MAX, d.rkey)),
    ];
    for (what, refused) in refusals {
        let mut h = harness(1, 16);
        let desc = h.soft.register(Bytes::from_static(b"secret-region"));
        let mut input = wire::encode_read_req(1, desc.addr, 6, desc.rkey).to_vec();
        input.extend(refused(desc));
        // Never read: the connection closes at the refusal, as on verbs.
        input.extend(wire::encode_read_req(3, desc.addr, 6, desc.rkey));
        input.extend(send_frame(b"after"));
        let death = run(&mut h, &input);
        assert!(
            matches!(&death, Death::Closed(r) if r.message().contains("refused the peer's READ")),
            "{what}: {death:?}"
        );
        let mut queued = Vec::new();
        while let Some(frame) = h.responses.try_recv() {
            queued.push(frame);
        }
        assert!(
            matches!(
                &queued[..],
                [
                    Outgoing::ReadResp { id: 1, result: Ok(data), .. },
                    Outgoing::ReadResp { id: 2, result: Err(_), .. },
                    Outgoing::Close { .. },
                ] if data[..] == b"secret"[..]
            ),
            "{what}: {queued:?}"
        );
        let c = h.soft.counters();
        assert_eq!((c.reads_served, c.reads_refused, c.recvs), (1, 1, 0), "{what}");
    }
}

#[test]
fn a_refused_read_completes_with_its_error_then_closes() {
    let mut h = harness(1, 16);
    let remote = RegionDesc { addr: 0x100, len: 4, rkey: 9 };
    let refused = h.soft.begin_read(7, remote, vec![0; 4].into()).unwrap();
    let _other = h.soft.begin_read(8, remote, vec![0; 4].into()).unwrap();
    let mut input = wire::encode_read_resp(refused, 1, 0).to_vec();
    input.extend(send_frame(b"never delivered"));
    let death = run(&mut h, &input);
    assert!(
        matches!(&death, Death::Closed(r) if r.message().contains("READ refused by the peer")),
        "{death:?}"
    );
    h.soft.fail(death);
    let (done, end) = completions(&h.soft);
    assert!(
        matches!(
            &done[..],
            [
                Completion::Read { wr_id: 7, result: Err(crate::ReadError::InvalidKey(9)) },
                Completion::Read { wr_id: 8, result: Err(crate::ReadError::Flushed) },
            ]
        ),
        "{done:?}"
    );
    assert!(matches!(end, Poll::Ready(Err(TransportError::Disconnected(_)))), "{end:?}");
}

#[test]
fn read_request_flood_stalls_instead_of_queueing_without_bound() {
    let mut h = harness(1, 16);
    let desc = h.soft.register(Bytes::from_static(b"region"));
    let input: Vec<u8> = (0..300).flat_map(|id| wire::encode_read_req(id, desc.addr, 1, desc.rkey)).collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let mut r = &input[..];
    let stalled = rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_millis(200), h.reader.run(&mut r)).await.is_err()
    });
    assert!(stalled, "the reader must wait for the writer once 256 responses are queued");
    let mut queued = 0;
    while h.responses.try_recv().is_some() {
        queued += 1;
    }
    assert_eq!(queued, 256);
}

fn push_frame(rkey: u32, addr: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = wire::encode_push(rkey, addr, payload.len() as u64).to_vec();
    f.extend_from_slice(payload);
    f
}

fn windows_queued(h: &mut Harness) -> Vec<(u32, u64)> {
    let mut back = Vec::new();
    while let Some(frame) = h.responses.try_recv() {
        if let Outgoing::Window { rkey, len } = frame {
            back.push((rkey, len));
        }
    }
    back
}

#[test]
fn pushes_are_kept_within_the_window_and_handed_back_when_revoked() {
    let mut h = harness_with_push(1, 16, Push::new(10, 0, None));
    let mut input = push_frame(1, 0x100, b"abcd");
    input.extend(wire::encode_revoke(1));
    input.extend(wire::encode_revoke(99)); // never pushed (or consumed already): nothing to do
    input.extend(push_frame(2, 0x200, b"0123456789"));
    let death = run(&mut h, &input);
    assert!(matches!(death, Death::Closed(_)), "{death:?}");
    assert_eq!(windows_queued(&mut h), [(1, 4)], "the revoked push handed back, once");
    assert_eq!((h.reader.push.held(), h.reader.push.regions_held()), (10, 1));
}

#[test]
fn push_violations_are_malformed() {
    let mut twice = push_frame(5, 0, b"ab");
    twice.extend(push_frame(5, 0, b"ab"));
    let mut over = push_frame(5, 0, b"0123456");
    over.extend(push_frame(6, 0, b"0123"));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("beyond the window at once", push_frame(5, 0, &[0; 11])),
        ("beyond the window together", over),
        ("a huge push", wire::encode_push(5, 0, u64::MAX).to_vec()),
        ("the same key twice", twice),
        ("a region never pushed handed back", wire::encode_window(1, 1).to_vec()),
    ];
    for (what, input) in cases {
        let mut h = harness_with_push(1, 16, Push::new(10, 0, None));
        let death = run(&mut h, &input);
        assert!(matches!(death, Death::Malformed(_)), "{what}: {death:?}");
    }
    // A push cut short by the end of the stream is the peer closing, not a violation.
    let mut h = harness_with_push(1, 16, Push::new(10, 0, None));
    let death = run(&mut h, &push_frame(5, 0, b"0123456789")[..25]);
    assert!(matches!(&death, Death::Closed(d) if d.to_string().contains("inside a frame")), "{death:?}");
}

#[test]
fn a_pushed_region_is_handed_back_once_with_its_length() {
    let push = Push::new(0, 100, None);
    assert!(push.start_push(&RegionDesc { addr: 0, len: 60, rkey: 1 }));
    assert!(push.start_push(&RegionDesc { addr: 0, len: 40, rkey: 2 }));
    let mut h = harness_with_push(1, 16, push);
    let mut input = wire::encode_window(1, 60).to_vec();
    input.extend(wire::encode_window(2, 40));
    let death = run(&mut h, &input);
    assert!(matches!(death, Death::Closed(_)), "{death:?}");
    assert_eq!(h.reader.push.window_left(), 100);
    let death = run(&mut h, &wire::encode_window(2, 40));
    assert!(matches!(death, Death::Malformed(_)), "handed back twice: {death:?}");
    let death = run(&mut h, &wire::encode_window(3, 0));
    assert!(matches!(death, Death::Malformed(_)), "never pushed: {death:?}");
}

/// Frames of any type (known or not) with random header and payload bytes.
fn frame_soup() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec((0u8..8, proptest::collection::vec(any::<u8>(), 0..48)), 0..12).prop_map(
        |frames| frames.into_iter().flat_map(|(ty, body)| std::iter::once(ty).chain(body)).collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_the_decoder(input in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut h = harness(2, 32);
        h.soft.register(Bytes::from_static(b"0123456789abcdef"));
        let _ = run(&mut h, &input);
    }

    #[test]
    fn buffered_and_frame_by_frame_reading_agree(
        frames in proptest::collection::vec((0u8..4, proptest::collection::vec(any::<u8>(), 0..40)), 0..12),
        capacity in 1usize..24,
        depth in 0u32..6,
    ) {
        // Mostly well-formed SENDs (some over recv_size 32), with other frame types between.
        let input: Vec<u8> = frames.iter().flat_map(|(kind, body)| match kind {
            0 | 1 => send_frame(body),
            2 => wire::encode_window(7, body.len() as u64).to_vec(),
            _ => std::iter::once(body.first().copied().unwrap_or(0) % 8).chain(body.iter().copied()).collect(),
        }).collect();
        let outcome = |h: &mut Harness, death: Death| {
            let unexpected = h.soft.counters().recv_unexpected;
            let (done, _) = completions(&h.soft);
            let done: Vec<String> = done.iter().map(|c| match c {
                Completion::Recv { buf } => format!("recv {:?}", buf.bytes()),
                other => format!("{other:?}"),
            }).collect();
            (format!("{death:?}"), unexpected, done)
        };
        let mut whole = harness(depth, 32);
        let death = run(&mut whole, &input);
        let whole = outcome(&mut whole, death);
        let mut chunked = harness(depth, 32);
        let death = run_chunked(&mut chunked, &input, capacity);
        prop_assert_eq!(whole, outcome(&mut chunked, death));
    }

    #[test]
    fn random_frames_never_panic_the_decoder(input in frame_soup(), pending in 0u64..4, window in 0u64..64) {
        let mut h = harness_with_push(2, 32, Push::new(window, window, None));
        let desc = h.soft.register(Bytes::from_static(b"0123456789abcdef"));
        for wr_id in 0..pending {
            h.soft.begin_read(wr_id, desc, vec![0; desc.len as usize].into()).unwrap();
        }
        let death = run(&mut h, &input);
        prop_assert!(h.reader.push.held() <= window, "pushed bytes held beyond the window");
        // Whatever happened, the endpoint can still be failed and then reports an error.
        h.soft.fail(death);
        let (_, end) = completions(&h.soft);
        prop_assert!(matches!(end, Poll::Ready(Err(_))));
    }
}

/// A socket that fails every read as a connection reset by the peer.
struct ResetSocket;

impl tokio::io::AsyncRead for ResetSocket {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        _buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()))
    }
}

#[test]
fn a_reset_socket_ends_the_connection_with_the_io_error_as_source() {
    use std::error::Error as _;
    let mut h = harness(1, 16);
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let death = rt.block_on(h.reader.run(&mut tokio::io::BufReader::new(ResetSocket)));
    h.soft.fail(death);
    let (_, end) = completions(&h.soft);
    let Poll::Ready(Err(err)) = end else { panic!("the connection failed: {end:?}") };
    assert!(matches!(err, TransportError::Disconnected(_)), "{err:?}");
    let io =
        err.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io::Error is the source");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
    let shown = err.to_string();
    assert!(shown.starts_with("connection closed: read failed: "), "{shown}");
    assert!(shown.ends_with(&io.to_string()), "{shown}");
}

//! Seed inputs of every target: a few valid frames and call sequences that reach the deep paths
//! (rendezvous both ways, deadlines, cancels, READ service). Checked in under `fuzz/seeds/`,
//! where `scripts/fuzz.sh` gives them to libFuzzer; regenerate with
//! `FUZZ_WRITE_SEEDS=1 cargo test --manifest-path fuzz/Cargo.toml --lib`.

use rpc_core::proto::{
    encode_desc, encode_request_body, Header, Hello, Kind, WireError, WireErrorCode, FLAG_METADATA,
    FLAG_RENDEZVOUS, HEADER_LEN,
};
use rpc_transport::fuzzing::{tcp_encode_hello, RdmaHello, TcpFrame};
use rpc_transport::RegionDesc;

use crate::enc::input;
use crate::input::{
    Arg, Blob, Body, ClientStep as C, DescLen, Frame, ReadOutcome, Reply, ServerStep as S, Setup, Timeout,
};
use crate::wire::{Chunk, ReaderSetup};

/// The targets, by name.
pub const TARGETS: [&str; 6] =
    ["proto_decode", "client_proto", "server_proto", "tcp_reader", "tcp_wire", "rdma_hello"];

/// `(name, bytes)` of each seed of `target`.
pub fn seeds(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    match target {
        "proto_decode" => proto_decode(),
        "client_proto" => client_proto(),
        "server_proto" => server_proto(),
        "tcp_reader" => tcp_reader(),
        "tcp_wire" => tcp_wire(),
        "rdma_hello" => rdma_hello(),
        _ => Vec::new(),
    }
}

/// Eager threshold 1024, 16 receives and calls each side, 64 KiB payloads.
pub fn setup() -> Setup {
    Setup {
        eager_threshold: 960,
        recv_depth: 12,
        max_in_flight: 15,
        max_message: u16::MAX,
        peer_recv_depth: 14,
        peer_recv_size: 1066,
        peer_eager: 1024,
        peer_max_message: 65535,
    }
}

/// A frame of `kind` for call `call_id` returning `credits`, with `flags` and `body`.
pub fn frame(kind: Kind, call_id: u8, credits: u8, flags: u8, body: Body) -> Frame {
    Frame { kind: kind as u8, flags, credits, call_id, method: 1, done: 0, arg: Arg::Zero, body }
}

fn desc(len: u16) -> Body {
    Body::Desc { addr: 0x1000, len: DescLen::Small(len), rkey: 7 }
}

fn raw_frame(kind: Kind, call_id: u64, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(kind);
    h.call_id = call_id;
    h.flags = flags;
    h.body_len = body.len() as u32;
    let mut head = [0u8; HEADER_LEN];
    h.encode(&mut head);
    let mut out = head.to_vec();
    out.extend_from_slice(body);
    out
}

/// `rest` behind a metadata section holding a trace id and a user.
fn with_metadata(rest: &[u8]) -> Vec<u8> {
    let md = rpc_core::Metadata::new().with("trace-id", "0123456789abcdef").and_then(|m| m.with("user", "alice"));
    let md = md.expect("small metadata").encode();
    encode_request_body(&md, bytes::Bytes::copy_from_slice(rest)).to_vec()
}

fn proto_decode() -> Vec<(&'static str, Vec<u8>)> {
    let d = encode_desc(&RegionDesc { addr: 0x1000, len: 5000, rkey: 9 });
    let err = WireError::new(WireErrorCode::Handler, "boom").encode();
    vec![
        ("request", raw_frame(Kind::Request, 1, 0, b"args")),
        ("rendezvous-request", raw_frame(Kind::Request, 2, 1, &d)),
        ("metadata-request", raw_frame(Kind::Request, 5, FLAG_METADATA, &with_metadata(b"args"))),
        (
            "metadata-rendezvous-request",
            raw_frame(Kind::Request, 6, FLAG_METADATA | FLAG_RENDEZVOUS, &with_metadata(&d)),
        ),
        ("error-response", raw_frame(Kind::Response, 3, 2, &err)),
        ("cancel", raw_frame(Kind::Cancel, 4, 0, b"")),
        ("credit", raw_frame(Kind::Credit, 0, 0, b"")),
        ("hello", Hello { eager_threshold: 8192, max_message_size: 1 << 30 }.encode()),
        ("desc", d.to_vec()),
        ("wire-error", err),
    ]
}

fn client_proto() -> Vec<(&'static str, Vec<u8>)> {
    let start = |len| C::Start { method: 1, len, timeout: None };
    let response = |body| C::Recv(frame(Kind::Response, 1, 1, 0, body));
    let mut done = frame(Kind::Credit, 0, 1, 0, Body::Empty);
    done.done = 1;
    vec![
        (
            "eager",
            input(&setup(), &[start(10), C::SendDone { pick: 0, ok: true }, response(Body::Payload(20))]),
        ),
        (
            "rendezvous-request",
            input(
                &setup(),
                &[
                    start(5000),
                    C::Registered { pick: 0, ok: true },
                    C::Recv(done),
                    response(Body::Payload(3)),
                ],
            ),
        ),
        (
            "rendezvous-response",
            input(
                &setup(),
                &[
                    start(10),
                    C::Recv(frame(Kind::Response, 1, 1, 1, desc(3000))),
                    C::ReadDone { pick: 0, outcome: ReadOutcome::Ok },
                ],
            ),
        ),
        (
            "deadline",
            input(
                &setup(),
                &[C::Start { method: 1, len: 10, timeout: Some(Timeout::Millis(5)) }, C::Advance(10)],
            ),
        ),
        ("cancel", input(&setup(), &[start(10), C::Cancel { pick: 0 }, response(Body::Payload(1))])),
        (
            "error-response",
            input(
                &setup(),
                &[
                    start(10),
                    C::Recv(frame(
                        Kind::Response,
                        1,
                        1,
                        2,
                        Body::Error { code: 3, message: Blob(b"boom".to_vec()) },
                    )),
                ],
            ),
        ),
    ]
}

fn server_proto() -> Vec<(&'static str, Vec<u8>)> {
    let request = |body| S::Recv(frame(Kind::Request, 1, 0, 0, body));
    let mut done = frame(Kind::Credit, 0, 2, 0, Body::Empty);
    done.done = 1;
    let mut timed = frame(Kind::Request, 1, 0, 0, Body::Payload(4));
    timed.arg = Arg::Millis(5);
    vec![
        (
            "eager",
            input(&setup(), &[request(Body::Payload(10)), S::Respond { pick: 0, reply: Reply::Ok(20) }]),
        ),
        (
            "rendezvous-both",
            input(
                &setup(),
                &[
                    S::Recv(frame(Kind::Request, 1, 0, 1, desc(5000))),
                    S::ReadDone { pick: 0, outcome: ReadOutcome::Ok },
                    S::Respond { pick: 0, reply: Reply::Ok(3000) },
                    S::Registered { pick: 0, ok: true },
                    S::Recv(done),
                ],
            ),
        ),
        ("deadline", input(&setup(), &[S::Recv(timed), S::Advance(10)])),
        (
            "cancel",
            input(&setup(), &[request(Body::Payload(1)), S::Recv(frame(Kind::Cancel, 1, 0, 0, Body::Empty))]),
        ),
        (
            "error-and-shutdown",
            input(
                &setup(),
                &[
                    request(Body::Payload(1)),
                    S::Respond { pick: 0, reply: Reply::Err { code: 3, len: 10 } },
                    S::Shutdown,
                ],
            ),
        ),
    ]
}

fn tcp_reader() -> Vec<(&'static str, Vec<u8>)> {
    let setup = ReaderSetup {
        recv_depth: 1,
        recv_size: 255,
        region_len: 64,
        reads: [Some(15), Some(99), None],
        push_window: 300,
        pushed: 100,
    };
    vec![
        ("send", input(&setup, &[Chunk::Send(5), Chunk::Send(200), Chunk::Send(0)])),
        (
            "read-requests",
            input(
                &setup,
                &[
                    Chunk::ReadReq { id: 1, offset: 0, len: 64, key_flip: 0 },
                    Chunk::ReadReq { id: 2, offset: 8, len: 8, key_flip: 1 },
                    Chunk::ReadReq { id: 3, offset: -1, len: 8, key_flip: 0 },
                ],
            ),
        ),
        (
            "read-responses",
            input(
                &setup,
                &[
                    Chunk::ReadResp { pick: 0, status: 0, len: None },
                    Chunk::ReadResp { pick: 1, status: 1, len: Some(0) },
                ],
            ),
        ),
        (
            "pushes",
            input(
                &setup,
                &[
                    Chunk::Push { key: 1, len: 200 },
                    Chunk::Push { key: 2, len: 100 },
                    Chunk::Revoke(1),
                    Chunk::Window { key: 0, len: None },
                    Chunk::Push { key: 3, len: 150 },
                    Chunk::Window { key: 1, len: Some(40) },
                ],
            ),
        ),
    ]
}

fn tcp_wire() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("hello", tcp_encode_hello(64, 8320, 32 << 20, b"private")),
        ("send", TcpFrame::Send { len: 77 }.encode()),
        ("read-req", TcpFrame::ReadReq { id: 1, addr: 0x1000, len: 64, rkey: 5 }.encode()),
        ("read-resp", TcpFrame::ReadResp { id: 1, status: 0, len: 64 }.encode()),
        ("push", TcpFrame::Push { rkey: 5, addr: 0x1000, len: 64 }.encode()),
        ("revoke", TcpFrame::Revoke { rkey: 5 }.encode()),
        ("window", TcpFrame::Window { rkey: 5, len: 64 }.encode()),
    ]
}

fn rdma_hello() -> Vec<(&'static str, Vec<u8>)> {
    let h = RdmaHello {
        recv_depth: 64,
        recv_size: 8320,
        max_dest_rd_atomic: 16,
        max_rd_atomic: 16,
        private_data: b"hi".to_vec(),
    };
    vec![("hello", h.encode())]
}

//! The tcp backend's wire format. All integers are little-endian.
//!
//! Setup: the connecting side sends its hello first; the accepting side reads and validates it,
//! then answers with its own (see `handshake.rs`):
//!
//! ```text
//! magic "RRPC" | version u16 | private_len u16 | recv_depth u32 | recv_size u32
//!   | push_window u64 | private_data
//! ```
//!
//! `push_window` is how many pushed bytes (see PUSH below) the sender of the hello accepts to
//! hold at once ([`crate::TcpSettings::push_window`]; 0: never push to it).
//!
//! Then frames, each a type byte and a fixed header, some followed by a payload:
//!
//! ```text
//! 1 SEND       len u32                                  | len bytes
//! 2 READ_REQ   id u64 | addr u64 | len u64 | rkey u32
//! 3 READ_RESP  id u64 | status u8 | len u64             | len bytes (status OK only; else len 0)
//! 4 PUSH       rkey u32 | addr u64 | len u64            | len bytes (a region's whole contents)
//! 5 REVOKE     rkey u32
//! 6 WINDOW     rkey u32 | len u64
//! ```
//!
//! A READ_RESP with a non-OK status is the last frame its sender writes: it then closes the
//! connection, and so does the receiver once it has completed the READ with its error.
//!
//! Push (see `push.rs`): when a region is registered and its whole length fits the push window
//! the peer has left, the owner sends PUSH with the region's bytes right away, before whatever
//! frame advertises the region. The receiver keeps them, and a READ of exactly that region
//! (same key, address and length) completes from them without a READ_REQ. The receiver hands
//! each pushed region back with WINDOW (its key and length, which return to the window) once,
//! when its bytes are consumed or dropped. When the owner revokes a pushed region not yet
//! handed back it sends REVOKE (ordered after everything before it), and the receiver drops
//! the bytes if still unread. A PUSH beyond the window left, a second PUSH of a key still held,
//! or a WINDOW for a region not pushed (or with another length) is malformed.

use crate::soft::check_sizes;
use crate::{ConnParams, ReadError, RegionDesc};

pub(crate) const MAGIC: [u8; 4] = *b"RRPC";
pub(crate) const VERSION: u16 = 2;
/// Bytes of the hello before the private data.
pub(crate) const HELLO_FIXED: usize = 24;

/// What a peer announced in its hello (the private data follows on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HelloHeader {
    pub(crate) recv_depth: u32,
    pub(crate) recv_size: u32,
    pub(crate) push_window: u64,
    pub(crate) private_len: usize,
}

/// Our hello, private data included.
pub(crate) fn encode_hello(params: &ConnParams) -> Vec<u8> {
    let private = &params.private_data;
    let mut out = Vec::with_capacity(HELLO_FIXED + private.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    // Validated by `validate_params` to be at most MAX_PRIVATE_DATA.
    out.extend_from_slice(&(private.len() as u16).to_le_bytes());
    out.extend_from_slice(&params.recv_depth.to_le_bytes());
    out.extend_from_slice(&params.recv_size.to_le_bytes());
    out.extend_from_slice(&params.tcp.push_window.to_le_bytes());
    out.extend_from_slice(private);
    out
}

/// Parses and validates the fixed part of a peer's hello.
pub(crate) fn decode_hello(fixed: &[u8; HELLO_FIXED]) -> Result<HelloHeader, String> {
    if fixed[..4] != MAGIC {
        return Err(format!("bad magic {:02x?}", &fixed[..4]));
    }
    let version = u16::from_le_bytes([fixed[4], fixed[5]]);
    if version != VERSION {
        return Err(format!("unsupported version {version} (this side speaks {VERSION})"));
    }
    let private_len = usize::from(u16::from_le_bytes([fixed[6], fixed[7]]));
    let recv_depth = u32_at(fixed, 8);
    let recv_size = u32_at(fixed, 12);
    let push_window = u64_at(fixed, 16);
    check_sizes(recv_depth, recv_size, private_len)?;
    Ok(HelloHeader { recv_depth, recv_size, push_window, private_len })
}

pub(crate) const T_SEND: u8 = 1;
pub(crate) const T_READ_REQ: u8 = 2;
pub(crate) const T_READ_RESP: u8 = 3;
pub(crate) const T_PUSH: u8 = 4;
pub(crate) const T_REVOKE: u8 = 5;
pub(crate) const T_WINDOW: u8 = 6;

pub(crate) const SEND_HEADER: usize = 4;
const READ_REQ_HEADER: usize = 8 + 8 + 8 + 4;
const READ_RESP_HEADER: usize = 8 + 1 + 8;
const PUSH_HEADER: usize = 4 + 8 + 8;
const REVOKE_HEADER: usize = 4;
const WINDOW_HEADER: usize = 4 + 8;
/// The longest fixed header after the type byte.
pub(crate) const MAX_HEADER: usize = READ_REQ_HEADER;

/// A frame's fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Header {
    Send { len: u32 },
    ReadReq { id: u64, addr: u64, len: u64, rkey: u32 },
    ReadResp { id: u64, status: u8, len: u64 },
    Push { rkey: u32, addr: u64, len: u64 },
    Revoke { rkey: u32 },
    Window { rkey: u32, len: u64 },
}

/// How many header bytes follow type byte `ty`; `None` for an unknown type.
pub(crate) fn header_len(ty: u8) -> Option<usize> {
    match ty {
        T_SEND => Some(SEND_HEADER),
        T_READ_REQ => Some(READ_REQ_HEADER),
        T_READ_RESP => Some(READ_RESP_HEADER),
        T_PUSH => Some(PUSH_HEADER),
        T_REVOKE => Some(REVOKE_HEADER),
        T_WINDOW => Some(WINDOW_HEADER),
        _ => None,
    }
}

/// Parses the header of type `ty` from `body` (which holds at least `header_len(ty)` bytes).
pub(crate) fn decode_header(ty: u8, body: &[u8]) -> Option<Header> {
    if body.len() < header_len(ty)? {
        return None;
    }
    Some(match ty {
        T_SEND => Header::Send { len: u32_at(body, 0) },
        T_READ_REQ => Header::ReadReq {
            id: u64_at(body, 0),
            addr: u64_at(body, 8),
            len: u64_at(body, 16),
            rkey: u32_at(body, 24),
        },
        T_READ_RESP => Header::ReadResp { id: u64_at(body, 0), status: body[8], len: u64_at(body, 9) },
        T_PUSH => Header::Push { rkey: u32_at(body, 0), addr: u64_at(body, 4), len: u64_at(body, 12) },
        T_REVOKE => Header::Revoke { rkey: u32_at(body, 0) },
        _ => Header::Window { rkey: u32_at(body, 0), len: u64_at(body, 4) },
    })
}

pub(crate) fn encode_send(len: u32) -> [u8; 1 + SEND_HEADER] {
    let mut out = [0; 1 + SEND_HEADER];
    out[0] = T_SEND;
    out[1..].copy_from_slice(&len.to_le_bytes());
    out
}

pub(crate) fn encode_read_req(id: u64, addr: u64, len: u64, rkey: u32) -> [u8; 1 + READ_REQ_HEADER] {
    let mut out = [0; 1 + READ_REQ_HEADER];
    out[0] = T_READ_REQ;
    out[1..9].copy_from_slice(&id.to_le_bytes());
    out[9..17].copy_from_slice(&addr.to_le_bytes());
    out[17..25].copy_from_slice(&len.to_le_bytes());
    out[25..29].copy_from_slice(&rkey.to_le_bytes());
    out
}

pub(crate) fn encode_read_resp(id: u64, status: u8, len: u64) -> [u8; 1 + READ_RESP_HEADER] {
    let mut out = [0; 1 + READ_RESP_HEADER];
    out[0] = T_READ_RESP;
    out[1..9].copy_from_slice(&id.to_le_bytes());
    out[9] = status;
    out[10..18].copy_from_slice(&len.to_le_bytes());
    out
}

pub(crate) fn encode_push(rkey: u32, addr: u64, len: u64) -> [u8; 1 + PUSH_HEADER] {
    let mut out = [0; 1 + PUSH_HEADER];
    out[0] = T_PUSH;
    out[1..5].copy_from_slice(&rkey.to_le_bytes());
    out[5..13].copy_from_slice(&addr.to_le_bytes());
    out[13..21].copy_from_slice(&len.to_le_bytes());
    out
}

pub(crate) fn encode_revoke(rkey: u32) -> [u8; 1 + REVOKE_HEADER] {
    let mut out = [0; 1 + REVOKE_HEADER];
    out[0] = T_REVOKE;
    out[1..].copy_from_slice(&rkey.to_le_bytes());
    out
}

pub(crate) fn encode_window(rkey: u32, len: u64) -> [u8; 1 + WINDOW_HEADER] {
    let mut out = [0; 1 + WINDOW_HEADER];
    out[0] = T_WINDOW;
    out[1..5].copy_from_slice(&rkey.to_le_bytes());
    out[5..13].copy_from_slice(&len.to_le_bytes());
    out
}

/// READ_RESP status codes.
pub(crate) const STATUS_OK: u8 = 0;
const STATUS_INVALID_KEY: u8 = 1;
const STATUS_OUT_OF_BOUNDS: u8 = 2;
const STATUS_FAILED: u8 = 3;

/// The status code that reports a refused READ (no memory is sent with it).
pub(crate) fn status_of(err: &ReadError) -> u8 {
    match err {
        ReadError::InvalidKey(_) => STATUS_INVALID_KEY,
        ReadError::OutOfBounds { .. } => STATUS_OUT_OF_BOUNDS,
        _ => STATUS_FAILED,
    }
}

/// The error a non-OK status means for our READ of `remote`; `None` for an unknown status.
pub(crate) fn error_of(status: u8, remote: &RegionDesc) -> Option<ReadError> {
    match status {
        STATUS_INVALID_KEY => Some(ReadError::InvalidKey(remote.rkey)),
        STATUS_OUT_OF_BOUNDS => Some(ReadError::OutOfBounds { addr: remote.addr, len: remote.len }),
        STATUS_FAILED => Some(ReadError::Failed("refused by the peer".into())),
        _ => None,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut le = [0; 4];
    le.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(le)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut le = [0; 8];
    le.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(le)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    #[test]
    fn headers_round_trip() {
        let send = encode_send(77);
        assert_eq!(decode_header(send[0], &send[1..]), Some(Header::Send { len: 77 }));
        let req = encode_read_req(1, 2, 3, 4);
        assert_eq!(
            decode_header(req[0], &req[1..]),
            Some(Header::ReadReq { id: 1, addr: 2, len: 3, rkey: 4 })
        );
        let resp = encode_read_resp(9, STATUS_OK, u64::MAX);
        assert_eq!(
            decode_header(resp[0], &resp[1..]),
            Some(Header::ReadResp { id: 9, status: 0, len: u64::MAX })
        );
        let push = encode_push(5, 6, 7);
        assert_eq!(decode_header(push[0], &push[1..]), Some(Header::Push { rkey: 5, addr: 6, len: 7 }));
        let revoke = encode_revoke(u32::MAX);
        assert_eq!(decode_header(revoke[0], &revoke[1..]), Some(Header::Revoke { rkey: u32::MAX }));
        let window = encode_window(9, 1 << 40);
        assert_eq!(decode_header(window[0], &window[1..]), Some(Header::Window { rkey: 9, len: 1 << 40 }));
        assert_eq!(header_len(0), None);
        assert_eq!(header_len(7), None);
        assert_eq!(decode_header(T_SEND, &[1, 2]), None, "short header");
    }

    #[test]
    fn hello_round_trips_and_rejects_bad_values() {
        let params = ConnParams {
            recv_depth: 8,
            recv_size: 4096,
            private_data: Bytes::from_static(b"hi"),
            tcp: crate::TcpSettings { push_window: 12345, ..crate::TcpSettings::default() },
            ..ConnParams::default()
        };
        let hello = encode_hello(&params);
        let fixed: [u8; HELLO_FIXED] = hello[..HELLO_FIXED].try_into().unwrap();
        assert_eq!(
            decode_hello(&fixed),
            Ok(HelloHeader { recv_depth: 8, recv_size: 4096, push_window: 12345, private_len: 2 })
        );
        assert_eq!(&hello[HELLO_FIXED..], b"hi");

        let mut bad = fixed;
        bad[0] = b'X';
        assert!(decode_hello(&bad).unwrap_err().contains("magic"));
        let mut bad = fixed;
        bad[4] = 1;
        assert!(decode_hello(&bad).unwrap_err().contains("version"));
        let mut bad = fixed;
        bad[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode_hello(&bad).unwrap_err().contains("recv_depth"));
        let mut bad = fixed;
        bad[6..8].copy_from_slice(&257u16.to_le_bytes());
        assert!(decode_hello(&bad).unwrap_err().contains("private data"));
    }

    #[test]
    fn refusals_map_to_errors_without_data() {
        let remote = RegionDesc { addr: 5, len: 6, rkey: 7 };
        for err in [ReadError::InvalidKey(7), ReadError::OutOfBounds { addr: 5, len: 6 }] {
            assert_eq!(error_of(status_of(&err), &remote), Some(err));
        }
        assert!(matches!(error_of(status_of(&ReadError::Flushed), &remote), Some(ReadError::Failed(_))));
        assert_eq!(error_of(STATUS_OK, &remote), None);
        assert_eq!(error_of(200, &remote), None);
    }

    proptest! {
        #[test]
        fn hello_decoder_never_panics(bytes in proptest::array::uniform24(any::<u8>())) {
            let _ = decode_hello(&bytes);
        }

        #[test]
        fn header_decoder_never_panics(ty in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Some(h) = decode_header(ty, &body) {
                prop_assert!(header_len(ty).is_some_and(|n| n <= body.len()), "{h:?}");
            }
        }
    }
}

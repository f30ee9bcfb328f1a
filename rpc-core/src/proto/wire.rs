//! Bodies: region descriptors, request metadata and wire errors.

use bytes::{BufMut, Bytes, BytesMut};
use rpc_transport::RegionDesc;

use super::error::ProtoError;

/// Encoded size of a region descriptor body: addr u64, len u64, rkey u32.
pub const DESC_LEN: usize = 20;

/// Encodes a region descriptor body.
pub fn encode_desc(d: &RegionDesc) -> [u8; DESC_LEN] {
    let mut out = [0u8; DESC_LEN];
    out[0..8].copy_from_slice(&d.addr.to_le_bytes());
    out[8..16].copy_from_slice(&d.len.to_le_bytes());
    out[16..20].copy_from_slice(&d.rkey.to_le_bytes());
    out
}

/// Decodes a region descriptor body; a zero length is invalid (it would be sent eagerly).
pub fn decode_desc(body: &[u8]) -> Result<RegionDesc, ProtoError> {
    let b: &[u8; DESC_LEN] = body.try_into().map_err(|_| ProtoError::BadDescriptor)?;
    let mut u64s = [0u64; 2];
    for (i, v) in u64s.iter_mut().enumerate() {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[i * 8..i * 8 + 8]);
        *v = u64::from_le_bytes(a);
    }
    let rkey = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
    if u64s[1] == 0 {
        return Err(ProtoError::BadDescriptor);
    }
    Ok(RegionDesc { addr: u64s[0], len: u64s[1], rkey })
}

/// Longest metadata section of a request, in bytes. With its length prefix and a region
/// descriptor it fits the smallest receive buffer this crate posts (room for a wire error), so a
/// request with metadata can always take the rendezvous path.
pub const MAX_METADATA_LEN: usize = 1000;
const _: () = assert!(2 + MAX_METADATA_LEN + DESC_LEN <= 2 + MAX_ERROR_MESSAGE);

/// Bytes a metadata section adds to a request body (0 without metadata).
pub fn metadata_overhead(metadata: &[u8]) -> usize {
    if metadata.is_empty() {
        0
    } else {
        2 + metadata.len()
    }
}

/// A request body: `meta_len u16 | metadata | rest` when there is metadata (the frame carries
/// `FLAG_METADATA`), else `rest` alone. `metadata` must be at most [`MAX_METADATA_LEN`] bytes.
pub fn encode_request_body(metadata: &[u8], rest: Bytes) -> Bytes {
    if metadata.is_empty() {
        return rest;
    }
    let mut out = BytesMut::with_capacity(2 + metadata.len() + rest.len());
    out.put_u16_le(metadata.len() as u16);
    out.put_slice(metadata);
    out.put_slice(&rest);
    out.freeze()
}

/// Splits a request body carrying `FLAG_METADATA` into the metadata and the rest.
pub fn split_metadata(body: &[u8]) -> Result<(&[u8], &[u8]), ProtoError> {
    let [a, b, rest @ ..] = body else { return Err(ProtoError::BadMetadata { len: body.len() }) };
    let len = usize::from(u16::from_le_bytes([*a, *b]));
    if len == 0 || len > MAX_METADATA_LEN || len > rest.len() {
        return Err(ProtoError::BadMetadata { len });
    }
    Ok(rest.split_at(len))
}

/// Error codes carried in an error response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WireErrorCode {
    /// No method with that id.
    UnknownMethod,
    /// The arguments could not be decoded.
    BadRequest,
    /// The handler failed (panicked, or returned an application error).
    Handler,
    /// Too many calls in progress at the server.
    Overloaded,
    /// The server is shutting down and takes no new calls.
    ShuttingDown,
    /// The advertised payload is larger than the receiver accepts.
    PayloadTooLarge,
    /// The server could not READ the advertised request payload.
    ReadFailed,
    /// A code this version does not know.
    Other(u16),
}

impl WireErrorCode {
    fn to_u16(self) -> u16 {
        match self {
            WireErrorCode::UnknownMethod => 1,
            WireErrorCode::BadRequest => 2,
            WireErrorCode::Handler => 3,
            WireErrorCode::Overloaded => 4,
            WireErrorCode::ShuttingDown => 5,
            WireErrorCode::PayloadTooLarge => 6,
            WireErrorCode::ReadFailed => 7,
            WireErrorCode::Other(c) => c,
        }
    }
    fn from_u16(c: u16) -> Self {
        match c {
            1 => WireErrorCode::UnknownMethod,
            2 => WireErrorCode::BadRequest,
            3 => WireErrorCode::Handler,
            4 => WireErrorCode::Overloaded,
            5 => WireErrorCode::ShuttingDown,
            6 => WireErrorCode::PayloadTooLarge,
            7 => WireErrorCode::ReadFailed,
            other => WireErrorCode::Other(other),
        }
    }
}

/// An error that travels from server to client in a response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct WireError {
    /// What kind of failure.
    pub code: WireErrorCode,
    /// Human-readable detail (truncated to fit an eager frame).
    pub message: String,
}

/// Longest error message carried on the wire, in bytes.
pub const MAX_ERROR_MESSAGE: usize = 1024;

impl WireError {
    /// A wire error.
    pub fn new(code: WireErrorCode, message: impl Into<String>) -> Self {
        WireError { code, message: message.into() }
    }

    /// Encodes as `code u16 | utf-8 message`, the message cut at [`MAX_ERROR_MESSAGE`] on a char
    /// boundary.
    pub fn encode(&self) -> Vec<u8> {
        let mut cut = self.message.len().min(MAX_ERROR_MESSAGE);
        while !self.message.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut out = Vec::with_capacity(2 + cut);
        out.extend_from_slice(&self.code.to_u16().to_le_bytes());
        out.extend_from_slice(&self.message.as_bytes()[..cut]);
        out
    }

    /// Decodes; invalid UTF-8 is replaced, a body shorter than 2 bytes is an unknown error.
    pub fn decode(body: &[u8]) -> WireError {
        match body {
            [a, b, rest @ ..] => WireError {
                code: WireErrorCode::from_u16(u16::from_le_bytes([*a, *b])),
                message: String::from_utf8_lossy(rest).into_owned(),
            },
            _ => WireError::new(WireErrorCode::Other(0), "empty error body"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::header::{Header, Kind, FLAG_METADATA, HEADER_LEN};

    #[test]
    fn metadata_sections_round_trip() {
        let body = encode_request_body(b"meta", Bytes::from_static(b"payload"));
        assert_eq!(&body[..2], &4u16.to_le_bytes());
        assert_eq!(split_metadata(&body), Ok((&b"meta"[..], &b"payload"[..])));
        assert_eq!(metadata_overhead(b"meta"), 6);
        assert_eq!(metadata_overhead(b""), 0);
        assert_eq!(encode_request_body(b"", Bytes::from_static(b"p")), Bytes::from_static(b"p"));
    }

    #[test]
    fn malformed_metadata_sections_are_errors() {
        assert_eq!(split_metadata(&[4]), Err(ProtoError::BadMetadata { len: 1 }));
        assert_eq!(split_metadata(&[0, 0, 1]), Err(ProtoError::BadMetadata { len: 0 }));
        assert_eq!(split_metadata(&[5, 0, 1, 2]), Err(ProtoError::BadMetadata { len: 5 }));
        let too_long = ((MAX_METADATA_LEN + 1) as u16).to_le_bytes();
        let mut body = too_long.to_vec();
        body.resize(2 + MAX_METADATA_LEN + 1, 0);
        assert_eq!(split_metadata(&body), Err(ProtoError::BadMetadata { len: MAX_METADATA_LEN + 1 }));
    }

    #[test]
    fn only_requests_carry_metadata() {
        for kind in [Kind::Response, Kind::Cancel, Kind::Credit] {
            let mut h = Header::new(kind);
            h.call_id = 1;
            h.flags = FLAG_METADATA;
            let mut frame = [0u8; HEADER_LEN];
            h.encode(&mut frame);
            assert!(Header::decode(&frame).is_err(), "{kind:?} with FLAG_METADATA");
        }
    }
}

//! Bodies: region descriptors and wire errors.

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

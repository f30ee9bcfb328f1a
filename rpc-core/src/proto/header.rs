//! The fixed, versioned frame header (40 bytes, little endian).
//!
//! ```text
//!  0..2   magic       u16  0x5244 ("RD")
//!  2      version     u8   2
//!  3      kind        u8   Request=1 Response=2 Cancel=3 Credit=4 Ping=5 Pong=6
//!  4..6   flags       u16  RENDEZVOUS=1 (body is a region descriptor), ERROR=2 (body is a wire error),
//!                           METADATA=4 (Request only: the body starts with a metadata section)
//!  6..8   credits     u16  receives the sender re-posted since its previous frame
//!  8..16  call_id     u64  the client's call id (0 only in Credit frames)
//! 16..20  method_id   u32  Request only
//! 20..24  body_len    u32  bytes after the header; must equal the rest of the frame
//! 24..32  done        u64  call whose advertised region the sender finished READing (0 = none)
//! 32..40  arg         u64  Request: relative deadline in microseconds (0 = none)
//! ```
//!
//! A Request with METADATA has the body `meta_len u16 | metadata (meta_len bytes, at most
//! [`MAX_METADATA_LEN`](super::MAX_METADATA_LEN)) | payload or region descriptor`; the protocol
//! carries the metadata as opaque bytes (the runtime's `Metadata` encodes them).
//!
//! Version history: 1, the first; 2 added METADATA.

use super::error::ProtoError;

/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 40;
/// First two bytes of every frame.
pub const MAGIC: u16 = 0x5244;
/// Wire version this crate speaks.
pub const VERSION: u8 = 2;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A call: method, arguments (inline or advertised), deadline.
    Request = 1,
    /// The result of a call (inline or advertised), or a wire error.
    Response = 2,
    /// The client abandoned a call.
    Cancel = 3,
    /// Header only: returns credits and/or reports a finished READ.
    Credit = 4,
    /// Header only: keepalive; the peer answers with a Pong.
    Ping = 5,
    /// Header only: the answer to a Ping (also returns credits).
    Pong = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Result<Kind, ProtoError> {
        Ok(match v {
            1 => Kind::Request,
            2 => Kind::Response,
            3 => Kind::Cancel,
            4 => Kind::Credit,
            5 => Kind::Ping,
            6 => Kind::Pong,
            other => return Err(ProtoError::UnknownKind(other)),
        })
    }
}

/// Flag: the body is a [`RegionDesc`](rpc_transport::RegionDesc) to READ, not the payload.
pub const FLAG_RENDEZVOUS: u16 = 1;
/// Flag: the (response) body is a wire error, not a result.
pub const FLAG_ERROR: u16 = 2;
/// Flag (requests only): the body starts with a length-prefixed metadata section.
pub const FLAG_METADATA: u16 = 4;
const KNOWN_FLAGS: u16 = FLAG_RENDEZVOUS | FLAG_ERROR | FLAG_METADATA;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: Kind,
    /// Flags (`FLAG_*`).
    pub flags: u16,
    /// Credits returned.
    pub credits: u16,
    /// Call id.
    pub call_id: u64,
    /// Method id (requests).
    pub method_id: u32,
    /// Body length.
    pub body_len: u32,
    /// Finished-READ report (0 = none).
    pub done: u64,
    /// Kind-specific argument.
    pub arg: u64,
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: Kind) -> Header {
        Header { kind, flags: 0, credits: 0, call_id: 0, method_id: 0, body_len: 0, done: 0, arg: 0 }
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        out[2] = VERSION;
        out[3] = self.kind as u8;
        out[4..6].copy_from_slice(&self.flags.to_le_bytes());
        out[6..8].copy_from_slice(&self.credits.to_le_bytes());
        out[8..16].copy_from_slice(&self.call_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.method_id.to_le_bytes());
        out[20..24].copy_from_slice(&self.body_len.to_le_bytes());
        out[24..32].copy_from_slice(&self.done.to_le_bytes());
        out[32..40].copy_from_slice(&self.arg.to_le_bytes());
    }

    /// Decodes and validates the header at the start of `frame` (the whole received message).
    pub fn decode(frame: &[u8]) -> Result<Header, ProtoError> {
        let h: &[u8; HEADER_LEN] = frame
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(ProtoError::Truncated { len: frame.len() })?;
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
        if u16_at(0) != MAGIC {
            return Err(ProtoError::BadMagic(u16_at(0)));
        }
        if h[2] != VERSION {
            return Err(ProtoError::UnsupportedVersion(h[2]));
        }
        let header = Header {
            kind: Kind::from_u8(h[3])?,
            flags: u16_at(4),
            credits: u16_at(6),
            call_id: u64_at(8),
            method_id: u32_at(16),
            body_len: u32_at(20),
            done: u64_at(24),
            arg: u64_at(32),
        };
        header.validate(frame.len() - HEADER_LEN)?;
        Ok(header)
    }

    fn validate(&self, body_len: usize) -> Result<(), ProtoError> {
        if self.body_len as usize != body_len {
            return Err(ProtoError::LengthMismatch { declared: self.body_len, actual: body_len });
        }
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(ProtoError::UnknownFlags(self.flags));
        }
        let needs_call = matches!(self.kind, Kind::Request | Kind::Response | Kind::Cancel);
        if needs_call && self.call_id == 0 {
            return Err(ProtoError::ZeroCallId);
        }
        let bodyless = matches!(self.kind, Kind::Cancel | Kind::Credit | Kind::Ping | Kind::Pong);
        if bodyless && (body_len != 0 || self.flags != 0) {
            return Err(ProtoError::UnexpectedBody(self.kind));
        }
        if self.kind == Kind::Request && self.flags & FLAG_ERROR != 0 {
            return Err(ProtoError::UnknownFlags(self.flags));
        }
        if self.kind != Kind::Request && self.flags & FLAG_METADATA != 0 {
            return Err(ProtoError::UnknownFlags(self.flags));
        }
        Ok(())
    }
}

//! Errors of the protocol core.

use super::header::Kind;

/// A violation of the wire protocol by the peer. Fatal for the connection (it is closed), never
/// for the process or for other connections.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// Shorter than a header.
    #[error("truncated frame of {len} bytes")]
    Truncated {
        /// Received length.
        len: usize,
    },
    /// Wrong magic number.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A version this side does not speak.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Unknown or misplaced flags.
    #[error("unknown flags {0:#x}")]
    UnknownFlags(u16),
    /// The declared body length is not the received one.
    #[error("body length {declared} declared, {actual} received")]
    LengthMismatch {
        /// From the header.
        declared: u32,
        /// Received.
        actual: usize,
    },
    /// A call frame with call id 0.
    #[error("call id 0")]
    ZeroCallId,
    /// A body where none is allowed.
    #[error("{0:?} frame with a body or flags")]
    UnexpectedBody(Kind),
    /// A request's metadata section is empty, longer than
    /// [`MAX_METADATA_LEN`](super::MAX_METADATA_LEN) or longer than its body.
    #[error("malformed metadata section ({len} bytes declared)")]
    BadMetadata {
        /// The declared length (or the body's, when too short for the prefix).
        len: usize,
    },
    /// A rendezvous body that is not a valid region descriptor.
    #[error("malformed region descriptor")]
    BadDescriptor,
    /// A frame this side's role never receives (e.g. a Request sent to a client).
    #[error("{0:?} frame not expected by this side")]
    UnexpectedKind(Kind),
    /// The peer reused the id of a call still in progress.
    #[error("duplicate call id {0}")]
    DuplicateCall(u64),
    /// More credits returned than receives were ever granted.
    #[error("peer returned more credits than it was granted")]
    CreditOverflow,
    /// An eager frame larger than this side's receive buffers, or an invalid hello.
    #[error("handshake: {0}")]
    Handshake(String),
    /// The peer sent a frame when it had no credit left (no receive was posted for it).
    #[error("peer sent beyond the credits it was granted")]
    CreditViolation,
    /// The peer did not report its READ of our region done in time.
    #[error("peer did not finish READing call {call_id}'s region within {timeout:?}")]
    DoneTimeout {
        /// The call whose region was advertised.
        call_id: u64,
        /// The configured `done_timeout`.
        timeout: std::time::Duration,
    },
    /// A READ we issued did not complete in time.
    #[error("READ for call {call_id} did not complete within {timeout:?}")]
    ReadTimeout {
        /// The call being READ.
        call_id: u64,
        /// The configured `read_timeout`.
        timeout: std::time::Duration,
    },
    /// Nothing arrived from the peer for `idle_timeout`, keepalive pings included.
    #[error("peer silent for {idle:?}")]
    PeerSilent {
        /// How long it has been silent.
        idle: std::time::Duration,
    },
    /// A SEND failed: the connection is no longer usable.
    #[error("send failed: {0}")]
    SendFailed(String),
}

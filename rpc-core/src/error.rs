//! The errors users see.

use crate::proto::{WireError, WireErrorCode};

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The call's deadline passed before the response arrived; the server was told to stop.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The call was cancelled.
    #[error("call cancelled")]
    Cancelled,
    /// The connection is gone (closed, peer died, transport failure); the call may or may not
    /// have run.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// The server answered with an error.
    #[error("remote error: {0}")]
    Remote(#[from] RemoteError),
    /// The peer broke the protocol (the connection was closed), or a response did not match.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Encoding the arguments or decoding the response failed.
    #[error("codec error: {0}")]
    Codec(String),
    /// A payload is larger than the receiving side accepts.
    #[error("payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLarge {
        /// Payload length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The rendezvous transfer failed (READ refused or failed, registration failed).
    #[error("transfer failed: {0}")]
    Transfer(String),
}

/// An error reported by the server, carried over the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RemoteError {
    /// What kind of failure.
    pub code: WireErrorCode,
    /// Detail from the server.
    pub message: String,
}

impl From<WireError> for RemoteError {
    fn from(e: WireError) -> Self {
        RemoteError { code: e.code, message: e.message }
    }
}

/// How a service's method failed at the server; sent to the client as a [`RemoteError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// No such method.
    #[error("unknown method {method:#010x} on service {service}")]
    UnknownMethod {
        /// Service name.
        service: &'static str,
        /// The id asked for.
        method: u32,
    },
    /// The arguments did not decode.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The handler failed.
    #[error("handler failed: {0}")]
    Handler(String),
}

impl ServiceError {
    pub(crate) fn to_wire(&self) -> WireError {
        let code = match self {
            ServiceError::UnknownMethod { .. } => WireErrorCode::UnknownMethod,
            ServiceError::BadRequest(_) => WireErrorCode::BadRequest,
            ServiceError::Handler(_) => WireErrorCode::Handler,
        };
        WireError::new(code, self.to_string())
    }
}

/// Why connecting or binding failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The transport failed.
    #[error(transparent)]
    Transport(#[from] rpc_transport::TransportError),
    /// The peer is not a compatible endpoint.
    #[error("handshake failed: {0}")]
    Handshake(String),
}

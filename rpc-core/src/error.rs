//! The errors users see.

use crate::proto::{WireError, WireErrorCode};

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The call's deadline passed before the response arrived; the server was told to stop.
    /// The deadline counts from the moment the call was made, so time spent encoding the
    /// arguments or waiting for an in-flight slot counts too (a call whose deadline passes
    /// before it is sent is never sent). A call the caller gives up on (by dropping its future)
    /// has no error: dropping it cancels it at the server.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The connection is gone (closed, peer died, transport failure); the call may or may not
    /// have run.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// The call was not sent: the connection is down and a
    /// [reconnecting](crate::ClientConfig::reconnect) client is waiting to connect again. Unlike
    /// [`CallError::Disconnected`], the call certainly did not run: it is safe to retry.
    #[error("not connected: {0}")]
    NotConnected(String),
    /// The call's metadata is over a limit (the call was not sent).
    #[error("metadata: {0}")]
    Metadata(#[from] crate::context::MetadataError),
    /// The server answered with an error. A server refusing a payload as too large is reported
    /// as [`CallError::PayloadTooLarge`] instead.
    #[error("remote error: {0}")]
    Remote(RemoteError),
    /// The peer broke the protocol (the connection was closed), or a response did not match.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Encoding the arguments or decoding the response failed.
    #[error("codec error: {0}")]
    Codec(String),
    /// A payload is larger than the receiving side accepts: a request over the server's limit
    /// (found by the client before sending, or by the server, which refuses it unread), or a
    /// response over this client's limit (found by the server before sending, or by the client,
    /// which refuses to READ it). One condition, one variant, whichever side found it.
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

impl CallError {
    /// A short name of the failure, for metrics labels and logs: `deadline_exceeded`,
    /// `disconnected`, `not_connected`, `protocol`, `codec`, `payload_too_large`, `transfer`, or
    /// for a server's answer its code (`remote_handler`, `remote_unknown_method`, ..).
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::DeadlineExceeded => "deadline_exceeded",
            CallError::Disconnected(_) => "disconnected",
            CallError::NotConnected(_) => "not_connected",
            CallError::Remote(r) => match r.code {
                WireErrorCode::UnknownMethod => "remote_unknown_method",
                WireErrorCode::BadRequest => "remote_bad_request",
                WireErrorCode::Handler => "remote_handler",
                WireErrorCode::Overloaded => "remote_overloaded",
                WireErrorCode::ShuttingDown => "remote_shutting_down",
                WireErrorCode::PayloadTooLarge => "payload_too_large",
                WireErrorCode::ReadFailed => "remote_read_failed",
                _ => "remote_other",
            },
            CallError::Protocol(_) => "protocol",
            CallError::Codec(_) => "codec",
            CallError::PayloadTooLarge { .. } => "payload_too_large",
            CallError::Transfer(_) => "transfer",
            CallError::Metadata(_) => "metadata",
        }
    }
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

impl From<RemoteError> for CallError {
    /// A `PayloadTooLarge` answer becomes [`CallError::PayloadTooLarge`], with the lengths the
    /// server's message states (0 for either it does not state); any other answer is
    /// [`CallError::Remote`].
    fn from(e: RemoteError) -> Self {
        if e.code == WireErrorCode::PayloadTooLarge {
            let (len, max) = too_large_lengths(&e.message);
            return CallError::PayloadTooLarge { len, max };
        }
        CallError::Remote(e)
    }
}

/// The payload length and the limit in a server's `PayloadTooLarge` message, which reads
/// "request of {len} bytes exceeds the server's limit of {max}" (or "response of .. the
/// client's limit of .."): the number before "bytes" and the number after "limit of". A number
/// the message does not carry is 0.
fn too_large_lengths(message: &str) -> (u64, u64) {
    let words: Vec<&str> = message.split_whitespace().collect();
    let number_at = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
    let len = words.iter().position(|w| *w == "bytes").and_then(|i| i.checked_sub(1)).and_then(number_at);
    let max = words.windows(2).position(|w| w == ["limit", "of"]).and_then(|i| number_at(i + 2));
    (len.unwrap_or(0), max.unwrap_or(0))
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

/// Why connecting or binding failed. Its message includes the cause (e.g. "connect to
/// 127.0.0.1:7000 failed: Connection refused (os error 111)"), and
/// [`source()`](std::error::Error::source) still returns it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The transport failed.
    #[error(transparent)]
    Transport(#[from] rpc_transport::TransportError),
    /// The peer is not a compatible endpoint.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// Connecting took longer than the client's `connect_timeout`.
    #[error("connecting timed out after {0:?}")]
    Timeout(std::time::Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(code: WireErrorCode, message: &str) -> CallError {
        RemoteError { code, message: message.into() }.into()
    }

    #[test]
    fn a_too_large_answer_is_payload_too_large_with_its_lengths() {
        let e = remote(
            WireErrorCode::PayloadTooLarge,
            "request of 5000 bytes exceeds the server's limit of 4096",
        );
        assert_eq!(e, CallError::PayloadTooLarge { len: 5000, max: 4096 });
        let e = remote(
            WireErrorCode::PayloadTooLarge,
            "response of 70000 bytes exceeds the client's limit of 65536",
        );
        assert_eq!(e, CallError::PayloadTooLarge { len: 70000, max: 65536 });
    }

    #[test]
    fn lengths_a_message_does_not_carry_are_zero() {
        assert_eq!(
            remote(WireErrorCode::PayloadTooLarge, "too big"),
            CallError::PayloadTooLarge { len: 0, max: 0 }
        );
        assert_eq!(
            remote(WireErrorCode::PayloadTooLarge, "bytes exceed the limit of 12"),
            CallError::PayloadTooLarge { len: 0, max: 12 }
        );
        assert_eq!(
            remote(WireErrorCode::PayloadTooLarge, "limit of"),
            CallError::PayloadTooLarge { len: 0, max: 0 }
        );
    }

    #[test]
    fn other_answers_stay_remote() {
        let e = remote(WireErrorCode::Handler, "request of 5 bytes exceeds the limit of 4");
        assert!(matches!(e, CallError::Remote(RemoteError { code: WireErrorCode::Handler, .. })));
    }
}

//! The errors users see.
//!
//! Errors keep their source: a failure caused by another error (a socket read, a bincode
//! decode, a READ) carries it in a [`Detail`], and [`source()`](std::error::Error::source)
//! walks the chain down to the root cause, which `downcast_ref` recovers as its own type:
//!
//! ```text
//! CallError::Disconnected  "connection lost: connection closed: read failed: Connection reset by peer (os error 104)"
//!  -> TransportError::Disconnected  "connection closed: read failed: Connection reset by peer (os error 104)"
//!   -> std::io::Error  "Connection reset by peer (os error 104)"     (kind() == ConnectionReset)
//! CallError::Codec  "codec error: decoding the response: .."  -> CodecError -> bincode's DecodeError
//! CallError::Transfer  "transfer failed: reading the response: .."  -> rpc_transport::ReadError
//! ```
//!
//! Each message already includes its cause's message, so logging the top error alone is
//! enough; the chain is there to act on the cause's type (an `io::ErrorKind`, a decode error).
//! Only what happened on this side has a source: an error the server reports
//! ([`CallError::Remote`]) crosses the wire as a code and a message.

use std::error::Error;
use std::fmt;

pub use rpc_transport::Detail;

use crate::proto::{WireError, WireErrorCode};

/// Why a call failed.
///
/// Cheap to clone: the causes it keeps are shared ([`Detail`]). Equality (kept for tests and
/// matching on a whole error) compares the variant and its fields, a [`Detail`] by its message
/// only: two errors with the same message and different causes are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallError {
    /// The call's deadline passed before the response arrived; the server was told to stop.
    /// The deadline counts from the moment the call was made, so time spent encoding the
    /// arguments, waiting for an in-flight slot or in the connection's queue counts too (a call
    /// whose deadline passes before it is sent is never sent). A call the caller gives up on
    /// (by dropping its future) has no error: dropping it cancels it at the server.
    DeadlineExceeded,
    /// The connection is gone (closed, peer died, transport failure); the call may or may not
    /// have run. The source is the transport's error when the transport failed (and its source
    /// the `io::Error` of a tcp connection that was reset).
    Disconnected(Detail),
    /// The call was not sent: the connection is down and a
    /// [reconnecting](crate::ClientConfig::reconnect) client is waiting to connect again. Unlike
    /// [`CallError::Disconnected`], the call certainly did not run: it is safe to retry.
    NotConnected(Detail),
    /// The call's metadata is over a limit (the call was not sent).
    Metadata(crate::context::MetadataError),
    /// The server answered with an error. A server refusing a payload as too large is reported
    /// as [`CallError::PayloadTooLarge`] instead.
    Remote(RemoteError),
    /// The peer broke the protocol (the connection was closed), or a response did not match, or
    /// the call could not start (the source says why).
    Protocol(Detail),
    /// Encoding the arguments or decoding the response failed. The source is the
    /// [`CodecError`](crate::codec::CodecError), whose source is bincode's error.
    Codec(Detail),
    /// A payload is larger than the receiving side accepts: a request over the server's limit
    /// (found by the client before sending, or by the server, which refuses it unread), or a
    /// response over this client's limit (found by the server before sending, or by the client,
    /// which refuses to READ it). One condition, one variant, whichever side found it.
    PayloadTooLarge {
        /// Payload length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The rendezvous transfer failed (READ refused or failed, registration failed). The source
    /// is the [`ReadError`](rpc_transport::ReadError) or the transport's registration error.
    Transfer(Detail),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::DeadlineExceeded => f.write_str("deadline exceeded"),
            CallError::Disconnected(d) => write!(f, "connection lost: {d}"),
            CallError::NotConnected(d) => write!(f, "not connected: {d}"),
            CallError::Metadata(e) => write!(f, "metadata: {e}"),
            CallError::Remote(e) => write!(f, "remote error: {e}"),
            CallError::Protocol(d) => write!(f, "protocol error: {d}"),
            CallError::Codec(d) => write!(f, "codec error: {d}"),
            CallError::PayloadTooLarge { len, max } => {
                write!(f, "payload of {len} bytes exceeds the limit of {max}")
            }
            CallError::Transfer(d) => write!(f, "transfer failed: {d}"),
        }
    }
}

impl Error for CallError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            CallError::Disconnected(d)
            | CallError::NotConnected(d)
            | CallError::Protocol(d)
            | CallError::Codec(d)
            | CallError::Transfer(d) => cause(d),
            CallError::Metadata(e) => Some(e),
            CallError::DeadlineExceeded | CallError::Remote(_) | CallError::PayloadTooLarge { .. } => None,
        }
    }
}

impl From<crate::context::MetadataError> for CallError {
    fn from(e: crate::context::MetadataError) -> Self {
        CallError::Metadata(e)
    }
}

fn cause(d: &Detail) -> Option<&(dyn Error + 'static)> {
    d.cause().map(|c| c as &(dyn Error + 'static))
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
///
/// At the server, [`source()`](std::error::Error::source) returns the cause (the decode error
/// of bad arguments, the encode error of a response). A source cannot cross the wire: the
/// client gets the code and this error's message (which includes the cause's message) in its
/// [`CallError::Remote`], and no source. Equality compares messages, as for [`CallError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceError {
    /// No such method.
    UnknownMethod {
        /// Service name.
        service: &'static str,
        /// The id asked for.
        method: u32,
    },
    /// The arguments did not decode.
    BadRequest(Detail),
    /// The handler failed (today: its response did not encode).
    Handler(Detail),
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::UnknownMethod { service, method } => {
                write!(f, "unknown method {method:#010x} on service {service}")
            }
            ServiceError::BadRequest(d) => write!(f, "bad request: {d}"),
            ServiceError::Handler(d) => write!(f, "handler failed: {d}"),
        }
    }
}

impl Error for ServiceError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ServiceError::UnknownMethod { .. } => None,
            ServiceError::BadRequest(d) | ServiceError::Handler(d) => cause(d),
        }
    }
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

    fn io(kind: std::io::ErrorKind) -> rpc_transport::TransportError {
        let e = std::io::Error::from(kind);
        rpc_transport::TransportError::Disconnected(Detail::caused_by("read failed", e))
    }

    /// Every variant says what failed, with its detail; those built with a cause chain to it.
    #[test]
    fn each_variant_is_informative_and_keeps_its_cause() {
        let reset = io(std::io::ErrorKind::ConnectionReset);
        let reset_text = reset.to_string();
        let read = rpc_transport::ReadError::InvalidKey(7);
        let cases: Vec<(CallError, &str)> = vec![
            (CallError::DeadlineExceeded, "deadline exceeded"),
            (
                CallError::Disconnected(Detail::from_error(reset)),
                "connection lost: connection closed: read failed: ",
            ),
            (
                CallError::NotConnected("connection to x lost; reconnecting".into()),
                "not connected: connection to x",
            ),
            (
                CallError::Metadata(crate::context::MetadataError::TooLarge { bytes: 2000, max: 1000 }),
                "metadata: ",
            ),
            (remote(WireErrorCode::Handler, "boom"), "remote error: Handler: boom"),
            (CallError::Protocol("call id 0 is reserved".into()), "protocol error: call id 0 is reserved"),
            (
                CallError::Codec(Detail::caused_by(
                    "decoding the response",
                    crate::codec::decode::<bool>(&[2]).unwrap_err(),
                )),
                "codec error: decoding the response: ",
            ),
            (CallError::PayloadTooLarge { len: 5, max: 4 }, "payload of 5 bytes exceeds the limit of 4"),
            (
                CallError::Transfer(Detail::caused_by("reading the response", read.clone())),
                "transfer failed: reading the response: remote key 0x7 is not registered",
            ),
        ];
        for (err, starts) in &cases {
            let shown = err.to_string();
            assert!(shown.starts_with(starts), "{shown:?} should start with {starts:?}");
            assert!(shown.len() > starts.len() || shown == *starts, "{shown}");
        }
        let root = |e: &CallError| {
            let mut at: &(dyn Error + 'static) = e;
            while let Some(next) = at.source() {
                at = next;
            }
            at.to_string()
        };
        assert!(cases[1].0.to_string().ends_with(&reset_text));
        assert_eq!(root(&cases[1].0), std::io::Error::from(std::io::ErrorKind::ConnectionReset).to_string());
        assert!(cases[6]
            .0
            .source()
            .and_then(|e| e.source())
            .is_some_and(|e| e.is::<bincode::error::DecodeError>()));
        assert_eq!(
            cases[8].0.source().and_then(|e| e.downcast_ref::<rpc_transport::ReadError>()),
            Some(&read)
        );
        for i in [0, 2, 4, 5, 7] {
            assert!(cases[i].0.source().is_none(), "{:?} has no cause", cases[i].0);
        }
        assert!(cases[3].0.source().is_some_and(|e| e.is::<crate::context::MetadataError>()));
    }

    /// Equality is by variant and message: the cause does not take part; a clone shares it.
    #[test]
    fn errors_compare_by_message_and_clones_share_the_cause() {
        let with =
            CallError::Disconnected(Detail::new("gone").with_cause(io(std::io::ErrorKind::BrokenPipe)));
        let without = CallError::Disconnected("gone".into());
        assert_eq!(with, without);
        assert_ne!(with, CallError::NotConnected("gone".into()));
        assert_ne!(without, CallError::Disconnected("went".into()));
        let copy = with.clone();
        let (CallError::Disconnected(a), CallError::Disconnected(b)) = (&with, &copy) else { unreachable!() };
        assert!(std::sync::Arc::ptr_eq(a.shared_cause().unwrap(), b.shared_cause().unwrap()));
    }

    #[test]
    fn service_errors_keep_their_cause_at_the_server_and_send_only_words() {
        let decode = crate::codec::decode::<bool>(&[2]).unwrap_err();
        let e = ServiceError::BadRequest(Detail::from_error(decode.clone()));
        assert!(e.source().is_some_and(|s| s.is::<crate::codec::CodecError>()));
        let wire = e.to_wire();
        assert_eq!(wire.code, WireErrorCode::BadRequest);
        assert_eq!(wire.message, format!("bad request: {decode}"));
        let h = ServiceError::Handler(Detail::caused_by("encoding the response", decode));
        assert!(h.to_string().starts_with("handler failed: encoding the response: "), "{h}");
        let unknown = ServiceError::UnknownMethod { service: "Kv", method: 0x1234 };
        assert_eq!(unknown.to_string(), "unknown method 0x00001234 on service Kv");
        assert!(unknown.source().is_none());
    }

    #[test]
    fn other_answers_stay_remote() {
        let e = remote(WireErrorCode::Handler, "request of 5 bytes exceeds the limit of 4");
        assert!(matches!(e, CallError::Remote(RemoteError { code: WireErrorCode::Handler, .. })));
    }
}

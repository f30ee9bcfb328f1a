use std::error::Error;
use std::fmt;
use std::io;
use std::sync::Arc;

/// An error shared between the clones of the error that carries it.
pub type SharedError = Arc<dyn Error + Send + Sync + 'static>;

/// What went wrong, in words, and the error that caused it when there is one: the payload of
/// error variants that describe a failure ([`TransportError::Disconnected`], and in `rpc-core`
/// `CallError::Disconnected`, `Codec`, `Transfer`, ..).
///
/// - **Message**: what `Display` prints. [`Detail::caused_by`] ends it with the cause's own
///   message ("read failed: Connection reset by peer (os error 104)"), so the top error's line
///   alone says what happened.
/// - **Cause**: kept as it was, so the carrying error's [`source()`](Error::source) returns it
///   and a caller can walk the chain down to the root (e.g. `downcast_ref::<std::io::Error>()`
///   to read its `kind()`).
/// - **Cheap to clone**: the cause is shared (an [`Arc`]).
/// - **Equality compares messages only** (an error has no equality in general): two details
///   with the same message are equal, whatever their causes.
#[derive(Clone)]
pub struct Detail {
    message: String,
    cause: Option<SharedError>,
}

impl Detail {
    /// A detail with no cause.
    pub fn new(message: impl Into<String>) -> Detail {
        Detail { message: message.into(), cause: None }
    }

    /// "`context`: `cause`", keeping `cause` as the source.
    pub fn caused_by<E: Error + Send + Sync + 'static>(context: impl fmt::Display, cause: E) -> Detail {
        Detail { message: format!("{context}: {cause}"), cause: Some(Arc::new(cause)) }
    }

    /// The message of `cause` itself, keeping `cause` as the source.
    pub fn from_error<E: Error + Send + Sync + 'static>(cause: E) -> Detail {
        Detail { message: cause.to_string(), cause: Some(Arc::new(cause)) }
    }

    /// "`context`: `cause`", with a cause already shared.
    pub fn caused_by_shared(context: impl fmt::Display, cause: SharedError) -> Detail {
        Detail { message: format!("{context}: {cause}"), cause: Some(cause) }
    }

    /// The same message, with `cause` as the source (the message should say what the cause
    /// says: prefer [`Detail::caused_by`], which writes it so).
    pub fn with_cause<E: Error + Send + Sync + 'static>(self, cause: E) -> Detail {
        Detail { message: self.message, cause: Some(Arc::new(cause)) }
    }

    /// "`context`: `self`", with the same cause.
    pub fn context(&self, context: impl fmt::Display) -> Detail {
        Detail { message: format!("{context}: {}", self.message), cause: self.cause.clone() }
    }

    /// The message (what `Display` prints).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error that caused this one, if known: what the carrying error's
    /// [`source()`](Error::source) returns.
    pub fn cause(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        self.cause.as_deref()
    }

    /// The cause, shared.
    pub fn shared_cause(&self) -> Option<&SharedError> {
        self.cause.as_ref()
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Without a cause, the message as a string literal (as a `String` payload printed); with one,
/// both.
impl fmt::Debug for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            None => fmt::Debug::fmt(&self.message, f),
            Some(cause) => {
                f.debug_struct("Detail").field("message", &self.message).field("cause", cause).finish()
            }
        }
    }
}

impl PartialEq for Detail {
    fn eq(&self, other: &Detail) -> bool {
        self.message == other.message
    }
}

impl Eq for Detail {}

impl PartialEq<str> for Detail {
    fn eq(&self, other: &str) -> bool {
        self.message == other
    }
}

impl PartialEq<&str> for Detail {
    fn eq(&self, other: &&str) -> bool {
        self.message == *other
    }
}

impl From<String> for Detail {
    fn from(message: String) -> Detail {
        Detail::new(message)
    }
}

impl From<&str> for Detail {
    fn from(message: &str) -> Detail {
        Detail::new(message)
    }
}

/// Why a transport operation failed. [`source()`](Error::source) returns the underlying error:
/// the `io::Error` of a failed connect, listen or socket operation, and for `Disconnected` the
/// error that ended the connection when there was one (a tcp connection reset by the peer: the
/// `io::Error` of the failed read or write).
#[derive(Debug)]
#[non_exhaustive]
pub enum TransportError {
    /// The address could not be parsed or names an unknown backend.
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The backend is not compiled in or not usable on this machine (e.g. no RDMA device).
    Unavailable(String),
    /// Connecting to the peer failed.
    Connect {
        /// The peer address.
        addr: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Binding or listening failed.
    Listen {
        /// The local address.
        addr: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Connection setup (exchange of parameters) failed or was malformed.
    Handshake(String),
    /// The connection is closed or the peer is gone; pending operations were flushed. Its
    /// detail's cause (the failed socket read, ..) is the [`source()`](Error::source).
    Disconnected(Detail),
    /// An I/O error on the underlying channel.
    Io(io::Error),
    /// The peer sent bytes that violate the transport's framing; the connection was closed.
    Malformed(String),
    /// A message larger than the peer's receive buffers.
    MessageTooLarge {
        /// The message length.
        len: usize,
        /// The peer's receive buffer size.
        max: usize,
    },
    /// A READ whose destination length does not match the region, or beyond the limits.
    InvalidRead(String),
    /// Deregistering a key that is not registered here.
    UnknownKey(u32),
    /// A failure injected by the `mem` backend's fault plan.
    Injected(&'static str),
    /// A verbs call failed.
    Verbs {
        /// Which call.
        call: &'static str,
        /// The provider's error.
        detail: String,
    },
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::InvalidAddress { addr, reason } => {
                write!(f, "invalid address {addr:?}: {reason}")
            }
            TransportError::Unavailable(why) => write!(f, "transport backend unavailable: {why}"),
            TransportError::Connect { addr, source } => write!(f, "connect to {addr} failed: {source}"),
            TransportError::Listen { addr, source } => write!(f, "listen on {addr} failed: {source}"),
            TransportError::Handshake(why) => write!(f, "connection setup failed: {why}"),
            TransportError::Disconnected(detail) => write!(f, "connection closed: {detail}"),
            TransportError::Io(e) => write!(f, "transport I/O error: {e}"),
            TransportError::Malformed(why) => write!(f, "malformed transport frame: {why}"),
            TransportError::MessageTooLarge { len, max } => {
                write!(f, "message of {len} bytes exceeds the peer's receive size {max}")
            }
            TransportError::InvalidRead(why) => write!(f, "invalid READ: {why}"),
            TransportError::UnknownKey(key) => write!(f, "unknown region key {key:#x}"),
            TransportError::Injected(what) => write!(f, "injected fault: {what}"),
            TransportError::Verbs { call, detail } => write!(f, "verbs call {call} failed: {detail}"),
        }
    }
}

impl Error for TransportError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            TransportError::Connect { source, .. } | TransportError::Listen { source, .. } => Some(source),
            TransportError::Io(e) => Some(e),
            TransportError::Disconnected(detail) => detail.cause().map(|c| c as &(dyn Error + 'static)),
            _ => None,
        }
    }
}

impl From<io::Error> for TransportError {
    fn from(e: io::Error) -> TransportError {
        TransportError::Io(e)
    }
}

/// Why a one-sided READ failed. The peer's memory is never exposed by a refused READ.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The key is not (or no longer) registered at the peer.
    #[error("remote key {0:#x} is not registered at the peer (wrong or revoked)")]
    InvalidKey(u32),
    /// The requested range is not inside the region.
    #[error("READ of {len} bytes at {addr:#x} is outside the registered region")]
    OutOfBounds {
        /// Requested address.
        addr: u64,
        /// Requested length.
        len: u64,
    },
    /// The connection died before the READ completed (flushed).
    #[error("READ flushed: connection closed")]
    Flushed,
    /// The READ failed for another reason (injected fault, provider error).
    #[error("READ failed: {0}")]
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_says_its_cause_and_keeps_it() {
        let d = Detail::caused_by("read failed", io::Error::from(io::ErrorKind::ConnectionReset));
        let io_text = io::Error::from(io::ErrorKind::ConnectionReset).to_string();
        assert_eq!(d.to_string(), format!("read failed: {io_text}"));
        let cause = d.cause().and_then(|c| c.downcast_ref::<io::Error>()).expect("the io::Error");
        assert_eq!(cause.kind(), io::ErrorKind::ConnectionReset);
        // Context keeps the cause; equality looks at messages only.
        let outer = d.context("peer closed");
        assert_eq!(outer.message(), format!("peer closed: read failed: {io_text}"));
        assert!(outer.cause().is_some_and(|c| c.is::<io::Error>()));
        assert_eq!(Detail::new(d.message()), d);
        assert_ne!(outer, d);
        assert_eq!(Detail::from("x"), "x");
        assert_eq!(format!("{:?}", Detail::new("plain")), "\"plain\"");
        assert!(format!("{d:?}").contains("cause"), "{d:?}");
        let err = TransportError::Disconnected(d);
        assert!(err.source().is_some_and(|s| s.is::<io::Error>()));
        assert!(TransportError::Disconnected("no cause".into()).source().is_none());
    }
}

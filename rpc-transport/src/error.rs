use std::io;

/// Why a transport operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The address could not be parsed or names an unknown backend.
    #[error("invalid address {addr:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The backend is not compiled in or not usable on this machine (e.g. no RDMA device).
    #[error("transport backend unavailable: {0}")]
    Unavailable(String),
    /// Connecting to the peer failed.
    #[error("connect to {addr} failed: {source}")]
    Connect {
        /// The peer address.
        addr: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Binding or listening failed.
    #[error("listen on {addr} failed: {source}")]
    Listen {
        /// The local address.
        addr: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Connection setup (exchange of parameters) failed or was malformed.
    #[error("connection setup failed: {0}")]
    Handshake(String),
    /// The connection is closed or the peer is gone; pending operations were flushed.
    #[error("connection closed: {0}")]
    Disconnected(String),
    /// An I/O error on the underlying channel.
    #[error("transport I/O error: {0}")]
    Io(#[from] io::Error),
    /// The peer sent bytes that violate the transport's framing; the connection was closed.
    #[error("malformed transport frame: {0}")]
    Malformed(String),
    /// A message larger than the peer's receive buffers.
    #[error("message of {len} bytes exceeds the peer's receive size {max}")]
    MessageTooLarge {
        /// The message length.
        len: usize,
        /// The peer's receive buffer size.
        max: usize,
    },
    /// A READ whose destination length does not match the region, or beyond the limits.
    #[error("invalid READ: {0}")]
    InvalidRead(String),
    /// Deregistering a key that is not registered here.
    #[error("unknown region key {0:#x}")]
    UnknownKey(u32),
    /// A failure injected by the `mem` backend's fault plan.
    #[error("injected fault: {0}")]
    Injected(&'static str),
    /// A verbs call failed.
    #[error("verbs call {call} failed: {detail}")]
    Verbs {
        /// Which call.
        call: &'static str,
        /// The provider's error.
        detail: String,
    },
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

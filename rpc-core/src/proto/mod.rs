//! The sans-I/O protocol core: no sockets, no tokio, no clock of its own.
//!
//! [`ClientProto`] and [`ServerProto`] are the two ends of one connection. Each is a state
//! machine driven in the quinn-proto manner:
//!
//! * **inputs** (`handle_*`): a received frame ([`ClientProto::handle_recv`]), a completion of an
//!   operation it asked for (`handle_registered`, `handle_read_complete`,
//!   `handle_send_complete`), the passage of time (`handle_timeout(now)`);
//! * **application calls**: `start_call` / `cancel` on the client, `respond` on the server;
//! * **outputs**, polled after every input, in this order: `poll_op` (operations to post on the
//!   transport: SEND, register, deregister, READ), then `poll_event` (what the application must
//!   learn: a finished call, a request to run, a handler to abort), then `poll_timeout` (when
//!   `handle_timeout` must next be called).
//!
//! The caller must re-post the receive buffer of every frame it passes to `handle_recv` before
//! it next calls `poll_op` (the credits reported to the peer count those re-posts), except at
//! most [`SPARE_RECEIVES`] of them, re-posted right after the SENDs that `poll_op` returned:
//! the spare receives posted beyond the credits stand in for them meanwhile.
//!
//! Paths: a payload of at most the eager threshold (and of what fits the peer's receive buffers)
//! travels inline in the request or response frame; a larger one is registered, its descriptor
//! `(addr, len, rkey)` travels instead, the peer READs it, reports the READ done (in the `done`
//! field of its next frame, or a credit frame), and only then is the key revoked. Requests and
//! responses both take that path.

mod budget;
mod client;
mod config;
mod deadlines;
mod error;
mod header;
mod link;
mod liveness;
mod rendezvous;
mod server;
mod stats;
mod wire;

#[cfg(test)]
mod tests;

pub use budget::SharedBudget;
pub(crate) use client::Payload;
pub use client::{CallFailure, ClientEvent, ClientProto, StartError};
pub(crate) use config::MIN_EAGER_THRESHOLD;
pub use config::{Hello, PeerLimits, ProtoConfig, SPARE_RECEIVES};
pub use error::ProtoError;
pub use header::{Header, Kind, FLAG_ERROR, FLAG_METADATA, FLAG_RENDEZVOUS, HEADER_LEN, MAGIC, VERSION};
pub use link::Op;
pub use server::{CancelReason, ServerEvent, ServerProto};
pub use stats::ProtoStats;
pub use wire::{
    decode_desc, encode_desc, encode_request_body, metadata_overhead, split_metadata, WireError,
    WireErrorCode, DESC_LEN, MAX_ERROR_MESSAGE, MAX_METADATA_LEN,
};

/// How a payload travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Path {
    /// Inline in one SEND.
    #[default]
    Eager,
    /// Advertised and pulled by the peer with a one-sided READ.
    Rendezvous,
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Path::Eager => "eager",
            Path::Rendezvous => "rendezvous",
        })
    }
}

/// Which path each direction of a call took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallInfo {
    /// The request payload's path.
    pub request: Path,
    /// The response payload's path.
    pub response: Path,
}

/// Method identifier: a stable hash of `"Service.method"`.
pub type MethodId = u32;

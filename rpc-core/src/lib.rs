//! Async RPC over RDMA: a sans-I/O protocol core and its tokio runtime.
//!
//! ```ignore
//! #[rpc_core::service]
//! pub trait Kv {
//!     async fn get(&self, key: String) -> Option<Vec<u8>>;
//!     async fn put(&self, key: String, value: Vec<u8>) -> u64;
//! }
//!
//! // server
//! let server = rpc_core::Server::bind("tcp://127.0.0.1:7000", ServerConfig::default(), KvServer::new(MyKv)).await?;
//! // client
//! let kv = KvClient::new(rpc_core::Client::connect("tcp://127.0.0.1:7000", ClientConfig::default()).await?);
//! let v = kv.with_options(CallOptions::new().deadline(Duration::from_millis(50))).get("k".into()).await?;
//! ```
//!
//! Handlers read their call's [`Context`] (peer, deadline, caller metadata) with
//! [`context::current()`]; a [`Router`] serves several services on one server; a client
//! reconnects with [`ClientConfig::reconnect`]; every call is traced (a `call` span per side,
//! named by its method) and measured through the `metrics` facade (see the README).
//!
//! # Layers
//! * [`proto`]: the wire protocol as a state machine (no I/O, no tokio, time passed in).
//! * [`runtime`]: one driver task per connection that feeds the state machine from a
//!   [`rpc_transport::Connection`] and runs handlers; [`Client`] and [`Server`] handles.
//! * `rpc_transport`: the verbs-shaped seam and its backends (`mem`, `tcp`, `rdma`).
//!
//! # Cancel safety
//! Dropping a call future before it completes cancels the call: a Cancel frame goes to the
//! server, which aborts the handler. Regions are not revoked at that moment, since the peer may
//! be READing them: each side revokes its region on the peer's done report (sent as soon as a
//! READ in flight completes, at once if none was started), or when the connection dies, or after
//! the done timeout (which closes the connection). Buffers of operations in flight belong to the
//! connection's driver until their completions arrive, never to the dropped future.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod arena;
pub mod codec;
pub mod context;
mod error;
mod future_slot;
pub mod proto;
pub mod router;
pub mod runtime;
mod service;

/// The byte buffer type of payloads (`bytes::Bytes`, with its `serde` feature): arguments and
/// results written `Bytes` of more than 1 KiB are decoded without a copy, smaller ones from the
/// copy of their message made as it arrived (see [`codec::SharedBytes`]).
pub use bytes::Bytes;
pub use context::{Context, Metadata, MetadataError};
pub use error::{CallError, ConnectError, Detail, RemoteError, ServiceError};
pub use future_slot::{FutureSlot, ServiceFuture};
pub use proto::{CallInfo, MethodId, Path, ProtoConfig, ProtoStats, WireErrorCode};
pub use router::{RouteCollision, Router};
pub use rpc_macros::service;
pub use rpc_transport as transport;
/// A received payload as it lies in its receive buffer ([`Service::call`]'s argument): decoding
/// it freezes it into [`Bytes`] only if the value keeps a slice of it.
pub use rpc_transport::Received;
pub use runtime::{
    CallOptions, Client, ClientConfig, ConnStats, InlineHandlers, Reconnect, Server, ServerConfig,
    ServerResources,
};
pub use service::{response_bound, MethodDesc, Service};

#[doc(hidden)]
pub mod __private {
    //! Used by the code `#[service]` generates; not a public API.
    pub use crate::codec::SharedBytes;
    pub use crate::context::current_or_detached as current_context;
    pub use crate::runtime::observe::ClientMethod;
    pub use crate::service::{assert_unique_ids, call, method_id, serve, unknown_method, Boxed, Place};
    pub use ::bytes::Bytes;
    pub use ::futures::future::BoxFuture;
    pub use ::rpc_transport::Received;
    pub use ::serde;
    pub use ::std::sync::Arc;
}

//! Real RDMA verbs through [`sideway`] (cargo feature `rdma`): RC queue pairs set up with rdma_cm,
//! our own asynchronous completion-queue poller, registered-memory pools, and one-sided READs.
//!
//! Works on InfiniBand / RoCE (tested on soft-RoCE, `rdma_rxe`) and iWARP (tested on soft-iWARP,
//! `siw`). `sideway` loads libibverbs / librdmacm at run time: a binary built with this feature
//! still starts where rdma-core or a device is missing, and [`connect`] / [`listen`] then return
//! [`crate::TransportError::Unavailable`].
//!
//! # Design
//!
//! * **Listener** (`listener.rs`): connect requests are set up concurrently, each in its own
//!   task, at most `ConnParams::max_pending_handshakes` at once (as many more wait, further ones
//!   are refused) and each within `ConnParams::handshake_timeout`: a silent peer holds one setup
//!   slot for that long and blocks nobody. Every hello field is bounded (`hello.rs`).
//! * **Setup** (`setup.rs`): rdma_cm with user-created basic CQ and QP (sideway's extended
//!   objects hang or fail on rxe and are unsupported on siw). Receives are posted before
//!   `rdma_connect` / `rdma_accept`. sideway offers no rdma_cm private data, so our parameters
//!   (receive depth and size, READ depths, the caller's private data) travel as an in-band hello,
//!   the first SEND of each side (`hello.rs`).
//! * **Completions** (`cq.rs`): one CQ per connection on its own completion channel, polled
//!   asynchronously under tokio's `AsyncFd` (arm, poll once more, sleep; events acked in batches,
//!   all acked before the CQ is destroyed; optional busy-poll window; bounded work per wake).
//!   Completions are routed by `wr_id` to slab entries that own the operation's buffers.
//! * **Memory** (`buffers.rs`): eager receives and non-inline SENDs go through registered slab
//!   pools owned by the connection (copied from / to the caller's buffers); SENDs up to the QP's
//!   `max_inline_data` are posted inline; send slabs are sized from our own receive size (capped
//!   by the peer's, never sized by it), and a rare larger SEND goes out from a buffer registered
//!   for it alone; a READ writes straight into the caller's destination, registered for that READ. Regions advertised with [`crate::Connection::register`] are
//!   REMOTE_READ only.
//! * **Revocation**: [`crate::Connection::deregister`] deregisters the memory region
//!   (`ibv_dereg_mr`): when it returns, the NIC refuses the key. Type-2 memory windows would
//!   avoid re-registering the same buffer, but binding and invalidating them are send-queue work
//!   requests of the extended QP API (`ibv_wr_bind_mw` / `IBV_WR_LOCAL_INV`), which we cannot use
//!   on rxe, and siw has no memory windows at all; deregistration is also synchronous, where an
//!   invalidation is only done when its completion arrives.
//! * **READs** honour the negotiated `max_rd_atomic` (more wait in a software queue) and are split
//!   into work requests no larger than the port's `max_msg_sz`.
//! * **Failure** (`complete.rs`): an error completion, a flush, a DISCONNECTED event or a failed
//!   poll fails the connection: the QP goes to the error state, every pending operation completes
//!   with an error, then `poll_completions` returns `Err`. Async device events are logged.
//!
//! # Counters
//!
//! `reads_served` / `reads_refused` stay 0: the NIC serves the peer's READs without telling
//! software. `recv_unexpected` counts SENDs of ours that found no receive posted at the peer
//! (RNR retries exhausted, which also fails the connection); iWARP has no RNR at all and fails
//! the connection in that case.
//!
//! # Configuration
//!
//! [`RdmaConfig`]: `RPC_RDMA_DEVICE`, `RPC_RDMA_PORT`, `RPC_RDMA_GID_INDEX`,
//! `RPC_RDMA_BUSY_POLL_US`. Note that rdma_cm, not this crate, picks the device from the IP
//! address; when several devices carry the same address (rxe0 and siw0 on one netdev) the first
//! one registered wins, and a configured `RPC_RDMA_DEVICE` that disagrees is reported as
//! [`RdmaError::WrongDevice`].

mod buffers;
mod cm;
mod complete;
mod config;
mod conn;
mod cq;
mod device;
mod error;
pub(crate) mod hello;
mod inspect;
mod listener;
mod post;
mod setup;
mod slab;
mod sys;

pub use config::{RdmaConfig, ENV_BUSY_POLL_US, ENV_DEVICE, ENV_GID_INDEX, ENV_PORT};
pub use conn::RdmaConnection;
pub use error::RdmaError;
pub use hello::HELLO_NUDGES;
pub use inspect::inspect_devices;
pub use listener::{listen, listen_with, RdmaListener};
pub use setup::{connect, connect_with};

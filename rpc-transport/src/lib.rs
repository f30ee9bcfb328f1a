//! The transport seam of the framework, shaped like RDMA verbs.
//!
//! A [`Connection`] behaves like a reliable-connected queue pair:
//!
//! * **Receives are posted in advance.** The transport creates `recv_depth` receive buffers of
//!   `recv_size` bytes when the connection is set up and posts them *before* the peer can send
//!   (exactly as a verbs application posts receives before moving a QP to RTR). A receive
//!   completion hands the [`RecvBuffer`] to the caller, who re-posts it with
//!   [`Connection::post_recv`] once it has consumed the bytes. A SEND that arrives while no
//!   receive is posted is counted in [`TransportCounters::recv_unexpected`]; the protocol's credit
//!   scheme keeps that counter at zero.
//! * **Two-sided SEND** of a message no larger than the peer's `recv_size`:
//!   [`Connection::post_send`], from a [`SendBuf`] (a pool buffer the message was written into,
//!   shared `Bytes`, or a short head and shared `Bytes` side by side: a gather list).
//! * **Registered memory**: [`Connection::register`] pins a buffer and returns a [`RegionDesc`]
//!   `(addr, len, rkey)` that may be advertised to the peer. The region is readable by the peer
//!   (REMOTE_READ only) until [`Connection::deregister`] revokes its key.
//! * **One-sided READ** of a peer's advertised region into a local buffer:
//!   [`Connection::post_read`]. A READ the peer refuses (wrong or revoked key, out of bounds)
//!   is fatal to the connection on every backend, as it is for an RC queue pair: the READ
//!   completes with its [`ReadError`], then both ends fail with `Disconnected`. A region must
//!   therefore be revoked only once the peer can no longer be reading it.
//! * **Completions** arrive on the connection's completion queue, drained with
//!   [`Connection::poll_completions`], which registers the task's waker when the queue is empty.
//!
//! # Buffer ownership
//!
//! Every buffer handed to a `post_*` call belongs to that operation until its completion comes
//! back through [`Connection::poll_completions`] (a send's bytes, a receive buffer, a READ's
//! destination). Nothing in this API lets a caller free or reuse memory that the transport or the
//! peer may still touch: the operations take their buffers by value and the completions give them
//! back. A region handed to [`Connection::register`] is kept alive by the transport at least until
//! it is deregistered (and, for a READ being served at that moment, until that READ is done).
//!
//! # Backends
//!
//! * [`mem`]: in-process fabric with fault injection, for tests and docs.
//! * [`tcp`]: for hosts without RDMA NICs. SEND is a framed message; READ is served by the peer's
//!   transport from its registered regions after checking key, bounds and registration, or from
//!   the region's bytes the peer pushed at registration, within a window the reader announced
//!   ([`TcpSettings::push_window`]).
//! * `rdma` (cargo feature `rdma`): verbs through `sideway`; `rdma::inspect_devices` reports every
//!   device's ports, GIDs and limits as the plain types of [`device_report`] (which, with the rules
//!   that read them, exist without the feature too).
//!
//! Addresses name a backend: `mem://name`, `tcp://127.0.0.1:7000`, `rdma://10.0.2.15:7471`.

#![warn(missing_docs)]

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

mod address;
mod busy_window;
pub mod device_report;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod mem;
mod pool;
#[cfg(feature = "rdma")]
pub mod rdma;
mod received;
mod send_buf;
mod soft;
mod take_each;
pub mod tcp;
mod tcp_settings;

pub use address::{connect, listen, Address};
pub use error::{Detail, ReadError, SharedError, TransportError};
pub use pool::{Buf, MemPool, PoolCounters, PoolLimits, CHUNK_BYTES, MAX_CLASS};
pub use received::Received;
pub use send_buf::{Head, SendBuf, MAX_HEAD};
#[doc(hidden)] // for rpc-core's driver; not part of the seam
pub use take_each::take_each;
pub use tcp_settings::TcpSettings;

/// A boxed, `Send` future, as returned by the object-safe parts of the seam.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The identifier a caller gives a posted operation; it comes back in the operation's completion.
pub type WrId = u64;

/// A remote key: the capability that lets a peer READ one registered region.
pub type RKey = u32;

/// What a peer needs to READ a registered region: its address, length and remote key.
///
/// Only the key makes a READ valid; the address is checked against the region's bounds by the
/// backend that serves the READ (`tcp`, `mem`) or by the NIC (`rdma`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionDesc {
    /// Address of the first byte, in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key (never the local key).
    pub rkey: RKey,
}

impl fmt::Debug for RegionDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Region({:#x}+{}, rkey={:#x})", self.addr, self.len, self.rkey)
    }
}

/// Parameters of the queue-pair-like connection, fixed at setup time.
///
/// Build it with struct update syntax so that new fields keep their defaults:
/// `ConnParams { recv_depth: 16, ..ConnParams::default() }`.
#[derive(Debug, Clone)]
pub struct ConnParams {
    /// How many receive buffers the transport posts before the peer can send. Default 64.
    /// Memory cost: `recv_depth * recv_size` bytes per connection.
    pub recv_depth: u32,
    /// Size in bytes of each receive buffer: the largest SEND this side accepts. Default 8 KiB + 128.
    pub recv_size: u32,
    /// Opaque bytes given to the peer during connection setup (like rdma_cm private data);
    /// the protocol uses it for its hello. At most 256 bytes.
    pub private_data: Bytes,
    /// Bound on connection setup (the peer's hello, and on `rdma` the whole rdma_cm exchange of
    /// an accepted connection). Default 5 s. A peer that connects and stays silent holds, for at
    /// most this long, one socket (tcp: its receive pool is allocated only after its hello is
    /// read and valid) or one queue pair with its receive pool (rdma: the pool is posted before
    /// the peer can send, as verbs requires).
    pub handshake_timeout: std::time::Duration,
    /// Listeners only: connections being set up at once. Default 64. Further incoming
    /// connections wait until a setup finishes, and that wait counts against the peer's own
    /// handshake timeout: tcp leaves them in the kernel's listen backlog (not `accept()`ed);
    /// rdma keeps up to as many connect requests waiting (an rdma_cm identifier each) and
    /// refuses the rest; mem makes `connect` wait for room in the accept queue. Cost: up to
    /// this many sockets (tcp) or queue pairs with `recv_depth * recv_size` bytes of registered
    /// receives each (rdma), plus the set-up connections waiting for [`Listener::accept`]
    /// (tcp, rdma: up to 64 more; mem: its accept queue holds this many).
    pub max_pending_handshakes: usize,
    /// Settings of the tcp backend (ignored by `mem` and `rdma`): keepalive, push window,
    /// the look after a SEND. Default [`TcpSettings::default`].
    pub tcp: TcpSettings,
    /// Bounds of the connection's memory pool ([`Connection::pool`]): default 256 MiB kept for
    /// reuse, of which at most 64 MiB of large buffers idle. On `rdma` this memory is pinned
    /// (registered); an idle connection that once moved large payloads keeps up to
    /// `max_idle_bytes` plus the 1 MiB chunks its small buffers came from (receives: about
    /// `recv_depth * 1.25 * recv_size`).
    pub pool: PoolLimits,
    /// What a peer may READ with the keys it is given (`rdma`; `mem` and `tcp` always check a
    /// region's own key and bounds). Default [`KeyPolicy::PoolKeys`].
    pub key_policy: KeyPolicy,
    /// Settings of the verbs backend (ignored by `mem` and `tcp`).
    pub rdma: RdmaSettings,
}

/// The verbs backend's settings a program sets in code. Each `RPC_RDMA_*` environment variable,
/// when set, overrides its field (so that tools and tests can redirect a program).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaSettings {
    /// Device that must carry the connection (`RPC_RDMA_DEVICE`); `None`: whichever device
    /// rdma_cm binds the address to.
    pub device: Option<String>,
    /// Port of the device (`RPC_RDMA_PORT`); `None`: 1.
    pub port: Option<u8>,
    /// GID index checked at setup (`RPC_RDMA_GID_INDEX`); `None`: 1, the IPv4-mapped GID on rxe.
    pub gid_index: Option<u32>,
    /// Busy-poll window (`RPC_RDMA_BUSY_POLL_US`); default zero: sleep on the completion channel
    /// as soon as the completion queue is empty. Otherwise, after each completion the
    /// connection's task keeps polling for up to this long, yielding to the runtime between
    /// polls (other tasks run, the thread is never blocked), before it sleeps. Cost: up to this
    /// much CPU per burst of completions on the thread that drives the connection (counted in
    /// `TransportCounters::busy_poll_spins`); gain: no event, syscall and wake-up on the
    /// completions that arrive within the window.
    pub busy_poll: std::time::Duration,
}

impl RdmaSettings {
    /// Sets the device.
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.device = Some(name.into());
        self
    }
    /// Sets the port.
    pub fn port(mut self, port: u8) -> Self {
        self.port = Some(port);
        self
    }
    /// Sets the GID index.
    pub fn gid_index(mut self, index: u32) -> Self {
        self.gid_index = Some(index);
        self
    }
    /// Sets the busy-poll window.
    pub fn busy_poll(mut self, window: std::time::Duration) -> Self {
        self.busy_poll = window;
        self
    }
}

/// Which keys advertised regions carry, and so what a peer can READ with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyPolicy {
    /// Regions from the connection's pool are advertised with their chunk's key: no
    /// registration per call. The pool and its protection domain belong to this connection
    /// alone, so the key lets this peer READ only memory that holds data that was, or is about
    /// to be, exchanged with this same peer; a buffer is reused only after the peer reported its
    /// READ done (the region was deregistered) or the connection died.
    #[default]
    PoolKeys,
    /// Every advertised region gets a registration (and key) of its own, revoked at the NIC
    /// when the region is deregistered: a peer can READ exactly the advertised bytes, for
    /// exactly as long as advertised. Costs an `ibv_reg_mr` and an `ibv_dereg_mr` per large
    /// payload (on a real NIC roughly a microsecond per 4 KiB page).
    PerCallKeys,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            recv_depth: 64,
            recv_size: 8192 + 128,
            private_data: Bytes::new(),
            handshake_timeout: std::time::Duration::from_secs(5),
            max_pending_handshakes: 64,
            tcp: TcpSettings::default(),
            pool: PoolLimits::default(),
            key_policy: KeyPolicy::PoolKeys,
            rdma: RdmaSettings::default(),
        }
    }
}

/// Largest private data accepted in [`ConnParams::private_data`].
pub const MAX_PRIVATE_DATA: usize = 256;

/// Limits of an established connection that the protocol must respect.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's private data from connection setup.
    pub peer_private_data: Bytes,
    /// Largest message the peer accepts in one SEND (the peer's `recv_size`).
    pub peer_recv_size: u32,
    /// Receives the peer posted before the connection was established (its `recv_depth`).
    pub peer_recv_depth: u32,
    /// Largest single READ this connection can issue (the port's max message size for verbs).
    pub max_read_size: u64,
    /// READs that may be outstanding at once (negotiated `max_rd_atomic` for verbs).
    pub max_reads_in_flight: u32,
    /// A human-readable name of the peer, for logs.
    pub peer: String,
    /// The backend's name: `mem`, `tcp`, `rdma`, `shm`.
    pub backend: &'static str,
    /// A [`Connection::poll_completions`] that finds nothing costs a system call (verbs: it
    /// re-arms the completion queue; `mem` and `tcp` only look at a queue in memory). A driver
    /// that has what it was waiting for may then leave that confirming poll to later, off the
    /// call's path.
    pub idle_poll_is_costly: bool,
    /// SENDs of at most this many bytes are copied as they are posted (verbs: inline, the
    /// device's `max_inline_data`; `tcp`: into the socket or the writer's queue; `mem`: into the
    /// peer's receive), so they may come from any memory: registered memory buys them nothing.
    /// Larger ones go out best from the connection's pool ([`Connection::pool`]).
    pub copied_sends: u32,
}

impl ConnInfo {
    /// Checks the arguments of a READ against this connection: the destination must be exactly
    /// as long as the region, and the region no longer than [`ConnInfo::max_read_size`].
    pub fn check_read(&self, remote: &RegionDesc, dst_len: usize) -> Result<(), TransportError> {
        if dst_len as u64 != remote.len {
            return Err(TransportError::InvalidRead(format!(
                "destination of {dst_len} bytes for a region of {} bytes",
                remote.len
            )));
        }
        if remote.len > self.max_read_size {
            return Err(TransportError::InvalidRead(format!(
                "READ of {} bytes exceeds max_read_size {}",
                remote.len, self.max_read_size
            )));
        }
        Ok(())
    }
}

/// A receive buffer: owned by the receive queue while posted, by the caller after its completion.
///
/// Backends post buffers of their connection's [`MemPool`] (registered memory on `rdma`), so the
/// NIC writes the message where the caller reads it; [`RecvBuffer::into_received`] hands the
/// message on without copying (and [`Received::lend`] decodes it where it lies), and the memory
/// returns to the pool when the message, or the last `Bytes` made of it, drops.
pub struct RecvBuffer {
    buf: Buf,
    /// The largest message it takes (the receive size it was posted for).
    limit: usize,
}

impl RecvBuffer {
    /// A new heap buffer of `size` bytes (tests; backends use their pool).
    pub fn new(size: usize) -> Self {
        RecvBuffer::from_buf(Buf::zeroed(size))
    }
    /// Wraps a buffer; it takes messages of up to its current length.
    pub fn from_buf(mut buf: Buf) -> Self {
        let limit = buf.len();
        buf.set_len(0);
        RecvBuffer { buf, limit }
    }
    /// The bytes received in the completion that returned this buffer.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
    /// Capacity: the largest message this buffer can hold.
    pub fn capacity(&self) -> usize {
        self.limit
    }
    /// The received message as [`Bytes`], without copying (freezing the buffer: one
    /// allocation; [`RecvBuffer::into_received`] hands it on without).
    pub fn into_bytes(self) -> Bytes {
        self.buf.freeze()
    }
    /// The received message, as it lies in the buffer (nothing frozen, nothing allocated).
    pub fn into_received(self) -> Received {
        Received::from(self.buf)
    }
    /// The underlying buffer (its length is the message's).
    pub fn into_buf(self) -> Buf {
        self.buf
    }
    /// The same buffer, emptied, to be posted again for a message of up to the same size (a
    /// consumer that copied the message out re-posts its receive buffer as verbs does: no
    /// buffer taken from or given back to the pool).
    pub fn reuse(mut self) -> RecvBuffer {
        self.buf.set_len(0);
        self
    }
    /// Fills the buffer with a received message, given in two pieces copied one after the
    /// other; returns `false` (and leaves it empty) if the message does not fit.
    pub(crate) fn fill(&mut self, [head, body]: [&[u8]; 2]) -> bool {
        let len = head.len() + body.len();
        if len > self.limit {
            self.buf.set_len(0);
            return false;
        }
        self.buf.set_len(len);
        self.buf[..head.len()].copy_from_slice(head);
        self.buf[head.len()..].copy_from_slice(body);
        true
    }
    /// Raw access for backends that let hardware write into the buffer.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn buf_mut(&mut self) -> &mut Buf {
        &mut self.buf
    }
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn set_len(&mut self, len: usize) {
        self.buf.set_len(len);
    }
}

impl fmt::Debug for RecvBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBuffer").field("len", &self.buf.len()).field("cap", &self.capacity()).finish()
    }
}

/// A completion taken from a connection's completion queue.
#[derive(Debug)]
#[non_exhaustive]
pub enum Completion {
    /// A message arrived into a posted receive buffer. Re-post the buffer when done with it.
    Recv {
        /// The buffer, holding the message.
        buf: RecvBuffer,
    },
    /// A posted SEND finished (its bytes may be reused), or failed. `Ok` says the transport is
    /// done with the bytes, not that the peer received them (a reply says that): a small rdma
    /// SEND posted unsignaled reports `Ok` once posted. A SEND that fails later fails the
    /// connection, which [`Connection::poll_completions`] then reports.
    Send {
        /// The id given to [`Connection::post_send`].
        wr_id: WrId,
        /// `Err` for a flushed or failed send.
        result: Result<(), TransportError>,
    },
    /// A posted READ finished: the destination buffer comes back, filled, or with the error.
    Read {
        /// The id given to [`Connection::post_read`].
        wr_id: WrId,
        /// The filled destination (exactly the requested length) or why the READ failed.
        result: Result<Buf, ReadError>,
    },
}

/// Counters a connection keeps; cheap to read at any time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportCounters {
    /// SENDs posted.
    pub sends: u64,
    /// Messages received into posted buffers.
    pub recvs: u64,
    /// Receive buffers (re-)posted, including the initial ones.
    pub recvs_posted: u64,
    /// Messages that arrived while no receive was posted (RNR on verbs). Must stay 0.
    pub recv_unexpected: u64,
    /// READs this side issued.
    pub reads_issued: u64,
    /// Bytes this side READ from the peer.
    pub bytes_read: u64,
    /// READs the peer issued against this side that were served.
    pub reads_served: u64,
    /// READs the peer issued that were refused (wrong key, out of bounds, revoked).
    pub reads_refused: u64,
    /// Regions registered.
    pub regions_registered: u64,
    /// Regions deregistered (keys revoked).
    pub regions_revoked: u64,
    /// Memory registrations (`ibv_reg_mr`) of every kind: pool chunks, and one-off
    /// registrations (per-call keys, buffers from outside the pool). 0 on `mem` and `tcp`.
    pub mr_registrations: u64,
    /// Memory deregistrations (`ibv_dereg_mr`).
    pub mr_deregistrations: u64,
    /// Bytes sent, advertised or READ into that were not in the connection's pool and had to
    /// be copied into it or registered for the operation (rdma; 0 on `mem` and `tcp`).
    pub bytes_outside_pool: u64,
    /// Empty looks spent inside busy-poll windows, each one pass of a task through the runtime:
    /// their CPU cost. rdma: completion-queue polls (with `RdmaSettings::busy_poll`); tcp: reads
    /// of the socket that found nothing, a `recv` system call each (with
    /// `TcpSettings::busy_poll`).
    pub busy_poll_spins: u64,
    /// Regions whose bytes this side pushed to the peer at registration (tcp only).
    pub regions_pushed: u64,
    /// Bytes this side pushed to the peer (tcp only).
    pub bytes_pushed: u64,
    /// READs this side issued that completed from bytes the peer had pushed, without a request
    /// to the peer (tcp only; also counted in `reads_issued` and `bytes_read`).
    pub reads_served_from_push: u64,
    /// SENDs posted without asking for a work completion (rdma: small inline SENDs, all but one
    /// in `signal_every`); also counted in `sends`.
    pub sends_unsignaled: u64,
    /// SENDs the caller wrote to the socket itself, the writer task being idle (tcp); also
    /// counted in `sends`.
    pub sends_direct: u64,
    /// Zero-length RDMA WRITEs sent while waiting for the peer's hello (rdma over iWARP,
    /// connecting side: see `RdmaConfig::hello_nudge_after`).
    pub hello_nudges: u64,
    /// Times work went to the device or the socket on the sending side: `ibv_post_send` calls
    /// (rdma: SENDs and READs, up to 16 work requests each), write system calls (tcp: the
    /// caller's direct writes and the writer task's; each carries any number of frames), calls
    /// that posted SENDs (mem). Fewer than `sends` when SENDs leave in batches.
    pub send_posts: u64,
    /// tcp: looks at the socket right after a SEND whose write took long (see
    /// [`TcpSettings::read_after_send`]).
    pub tcp_looks: u64,
    /// tcp: looks that found bytes (or the end of the stream).
    pub tcp_looks_found: u64,
}

impl TransportCounters {
    /// Field-by-field sum, for totals over connections.
    pub fn merged(&self, other: &TransportCounters) -> TransportCounters {
        let mut out = *self;
        out.sends += other.sends;
        out.recvs += other.recvs;
        out.recvs_posted += other.recvs_posted;
        out.recv_unexpected += other.recv_unexpected;
        out.reads_issued += other.reads_issued;
        out.bytes_read += other.bytes_read;
        out.reads_served += other.reads_served;
        out.reads_refused += other.reads_refused;
        out.regions_registered += other.regions_registered;
        out.regions_revoked += other.regions_revoked;
        out.mr_registrations += other.mr_registrations;
        out.mr_deregistrations += other.mr_deregistrations;
        out.bytes_outside_pool += other.bytes_outside_pool;
        out.busy_poll_spins += other.busy_poll_spins;
        out.regions_pushed += other.regions_pushed;
        out.bytes_pushed += other.bytes_pushed;
        out.reads_served_from_push += other.reads_served_from_push;
        out.sends_unsignaled += other.sends_unsignaled;
        out.sends_direct += other.sends_direct;
        out.send_posts += other.send_posts;
        out.hello_nudges += other.hello_nudges;
        out.tcp_looks += other.tcp_looks;
        out.tcp_looks_found += other.tcp_looks_found;
        out
    }
}

/// One end of an established connection, shaped like an RC queue pair plus its completion queue.
///
/// All methods are non-blocking. `post_*` calls only queue work; their outcome arrives as a
/// [`Completion`]. After the connection fails or is closed, pending operations complete with
/// errors (flushed), and then [`Connection::poll_completions`] returns the error.
pub trait Connection: Send + fmt::Debug + 'static {
    /// Limits negotiated at setup, and the peer's private data.
    fn info(&self) -> &ConnInfo;

    /// Posts a receive buffer (normally one that a [`Completion::Recv`] returned).
    fn post_recv(&mut self, buf: RecvBuffer) -> Result<(), TransportError>;

    /// Posts every buffer of `bufs` (drained, in order) as [`Connection::post_recv`] would, in
    /// as few calls to the device as it can (rdma: one `ibv_post_recv` per 16). All are posted
    /// when it returns.
    fn post_recv_batch(&mut self, bufs: &mut Vec<RecvBuffer>) -> Result<(), TransportError> {
        take_each(bufs, |buf| self.post_recv(buf))
    }

    /// Posts a two-sided SEND of `msg` (at most [`ConnInfo::peer_recv_size`] bytes). The
    /// operation owns `msg` until its completion: a [`SendBuf::Owned`] buffer of
    /// [`Connection::pool`] is sent as it is and returns to the pool afterwards.
    fn post_send(&mut self, wr_id: WrId, msg: SendBuf) -> Result<(), TransportError>;

    /// Posts every SEND of `sends` (drained, in order) as [`Connection::post_send`] would, in
    /// as few calls to the device as it can (rdma: one `ibv_post_send` per 16). An error means
    /// what it means for `post_send` (the connection is unusable); the SENDs after the one that
    /// failed are dropped unposted.
    fn post_send_batch(&mut self, sends: &mut Vec<(WrId, SendBuf)>) -> Result<(), TransportError> {
        take_each(sends, |(wr_id, msg)| self.post_send(wr_id, msg))
    }

    /// [`Connection::post_send_batch`], except that the SENDs that completed as they were
    /// posted (rdma: an unsignaled SEND; tcp: written to the socket by this call; mem: delivered
    /// by this call) are appended to `done` with their results instead of coming back from
    /// [`Connection::poll_completions`]: the caller handles them at once, without polling again
    /// for them. A SEND is reported this way only when no SEND posted before it is still in
    /// flight (a completion of an earlier one already waiting in the queue may still come out
    /// of `poll_completions` after it). The default reports none this way.
    fn post_send_batch_reporting(
        &mut self,
        sends: &mut Vec<(WrId, SendBuf)>,
        done: &mut Vec<(WrId, Result<(), TransportError>)>,
    ) -> Result<(), TransportError> {
        let _ = done;
        self.post_send_batch(sends)
    }

    /// The connection's pool of registered memory. Buffers from it are sent, advertised and
    /// READ into without registering anything; encode into them. Cheap to clone and to use
    /// from any thread.
    fn pool(&self) -> &MemPool;

    /// Registers `data` for remote READ and returns its descriptor. The transport keeps the
    /// bytes alive until [`Connection::deregister`]. Bytes from [`Connection::pool`] need no
    /// registration (see [`KeyPolicy`] for what the peer may then READ).
    fn register(&mut self, data: Bytes) -> Result<RegionDesc, TransportError>;

    /// Revokes a registered region (the descriptor [`Connection::register`] returned): the
    /// transport lets go of its bytes, and a later READ of it is refused where the key was the
    /// region's own, which closes the connection (see [`Connection::post_read`]). Unknown
    /// regions are an error (a double revoke is a bug in the caller).
    fn deregister(&mut self, region: RegionDesc) -> Result<(), TransportError>;

    /// Posts a one-sided READ of the peer's region `remote` into `dst`, which must have
    /// `remote.len` bytes of length (take it from [`Connection::pool`]: other memory is
    /// registered for the READ alone); `dst` comes back in the [`Completion::Read`].
    ///
    /// If the peer refuses it (key not registered or revoked, range outside the region), the
    /// READ completes with [`ReadError::InvalidKey`] or [`ReadError::OutOfBounds`] (verbs: see
    /// the `rdma` module for what each provider reports), and then the connection fails on both
    /// ends: everything else pending is flushed and `poll_completions` returns `Disconnected`.
    fn post_read(&mut self, wr_id: WrId, remote: RegionDesc, dst: Buf) -> Result<(), TransportError>;

    /// Moves up to `max` completions into `out`. Returns `Ready(Ok(()))` when at least one was
    /// moved; `Pending` (with the waker registered) when none is queued; `Ready(Err(_))` once the
    /// connection is dead and every pending operation has been flushed to `out`.
    fn poll_completions(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Poll<Result<(), TransportError>>;

    /// Arms the connection for `waker` if no completion is queued: the next completion wakes
    /// it, as after a [`Connection::poll_completions`] that found nothing, and `true` is
    /// returned. `false`: a completion is queued (poll to take it), or the transport cannot arm
    /// this way. A driver that has done its work arms here instead of polling once more. The
    /// default returns `false`: verbs arms its completion queue as its poll finds it empty
    /// (`ibv_req_notify_cq`, a system call on rxe, and one look more), so its driver polls.
    /// `tcp` and `mem` look at a queue in memory.
    fn arm(&mut self, waker: &Waker) -> bool {
        let _ = waker;
        false
    }

    /// Counters since setup.
    fn counters(&self) -> TransportCounters;

    /// Closes the connection: the peer sees it disconnect, pending operations are flushed.
    fn close(&mut self);
}

/// Accepts connections on a bound address.
pub trait Listener: Send + fmt::Debug + 'static {
    /// Waits for the next connection; its receives are posted before the peer learns of it.
    ///
    /// Connections are set up in the background (at most
    /// [`ConnParams::max_pending_handshakes`] at once, each within
    /// [`ConnParams::handshake_timeout`]); one whose setup fails or times out is logged and never
    /// returned here.
    fn accept(&mut self) -> BoxFuture<'_, Result<Box<dyn Connection>, TransportError>>;
    /// The address actually bound (with the real port for `tcp://...:0`).
    fn local_addr(&self) -> Address;
}

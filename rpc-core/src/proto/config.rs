//! Protocol configuration and the hello exchanged at connection setup.

use std::time::Duration;

use super::error::ProtoError;
use super::header::HEADER_LEN;
use super::wire::{DESC_LEN, MAX_ERROR_MESSAGE};

/// The smallest [`ProtoConfig::eager_threshold`] the setter allows: payloads this small travel
/// inline with any configuration made through it.
pub(crate) const MIN_EAGER_THRESHOLD: usize = 64;

/// Protocol settings of one side of a connection. Both sides send theirs in the hello; each
/// side's limits bind what the other may send it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProtoConfig {
    /// Payloads up to this many bytes travel inline in one SEND (eager); larger ones are
    /// advertised and READ by the peer (rendezvous). Default 8 KiB. The receive buffers are sized
    /// from it, so the memory cost is `(recv_depth + 1) * (eager_threshold + 40)` bytes per
    /// connection.
    pub eager_threshold: usize,
    /// Credits granted to the peer: receive buffers posted per connection, besides one spare
    /// ([`SPARE_RECEIVES`]). Default 64, minimum 4.
    pub recv_depth: u32,
    /// Calls in progress at once on one connection (client: outstanding calls; server: calls
    /// accepted and not yet answered). Default 1024.
    pub max_in_flight: u32,
    /// Largest payload (request or response) accepted from the peer. Default 1 GiB.
    pub max_message_size: u64,
    /// Rendezvous bytes this connection may hold at once: READ destinations from the moment
    /// their READ is issued until it completes, plus our regions advertised to the peer until it
    /// reports them READ. Default 256 MiB. A READ that does not fit waits; one payload larger
    /// than the budget proceeds alone when nothing else is held. This is the memory (pinned, on
    /// verbs) one peer can make this side hold for rendezvous.
    pub max_rendezvous_bytes: u64,
    /// How long the peer has to READ a region we advertised and report it done. Default 30 s.
    /// Then the region is revoked and the connection closed (a READ with a revoked key would
    /// break a verbs connection anyway).
    pub done_timeout: Duration,
    /// How long a READ we issued may take. Default 30 s. Then the connection is closed (a
    /// verbs READ cannot be called back without it).
    pub read_timeout: Duration,
    /// After this long without receiving anything, send a Ping. Default 2 s. Costs one 40-byte
    /// frame per interval each way on an idle connection.
    pub keepalive_interval: Duration,
    /// After this long without receiving anything (not even a Pong), the peer is considered
    /// dead: the connection is closed and its calls fail with `Disconnected`. Default 10 s.
    pub idle_timeout: Duration,
    /// Frames waiting for the peer's credits above which a server stops returning credits to
    /// that client (backpressure). Default 256 frames, at most
    /// `256 * (40 + eager_threshold)` bytes (2 MiB with the defaults) per connection.
    pub max_queued_frames: u32,
    /// Bounds of the connection's registered-memory pool, where payloads are encoded, frames
    /// assembled, receives posted and READs land (see [`rpc_transport::PoolLimits`]). Default
    /// 256 MiB kept for reuse, of which at most 64 MiB of large buffers idle; on `rdma` this is
    /// pinned memory. An idle connection pins its receive buffers (about
    /// `recv_depth * 1.25 * recv_size`, 640 KiB with the defaults), the small chunks it used
    /// (up to 1 MiB per size class) and up to `max_idle_bytes` of large buffers.
    pub pool: rpc_transport::PoolLimits,
    /// What a peer may READ with the keys we advertise (`rdma`). Default
    /// [`rpc_transport::KeyPolicy::PoolKeys`]: keys of this connection's pool, no registration
    /// per call. `PerCallKeys`: a registration per large payload, revoked at the NIC when the
    /// peer reports its READ done.
    pub key_policy: rpc_transport::KeyPolicy,
}

impl Default for ProtoConfig {
    fn default() -> Self {
        ProtoConfig {
            eager_threshold: 8192,
            recv_depth: 64,
            max_in_flight: 1024,
            max_message_size: 1 << 30,
            max_rendezvous_bytes: 256 << 20,
            done_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(10),
            max_queued_frames: 256,
            pool: rpc_transport::PoolLimits::default(),
            key_policy: rpc_transport::KeyPolicy::default(),
        }
    }
}

impl ProtoConfig {
    /// Sets [`ProtoConfig::eager_threshold`] (clamped to at least 64 bytes).
    pub fn eager_threshold(mut self, bytes: usize) -> Self {
        self.eager_threshold = bytes.max(MIN_EAGER_THRESHOLD);
        self
    }
    /// Sets [`ProtoConfig::recv_depth`] (clamped to at least 4).
    pub fn recv_depth(mut self, depth: u32) -> Self {
        self.recv_depth = depth.clamp(4, u16::MAX as u32);
        self
    }
    /// Sets [`ProtoConfig::max_in_flight`] (at least 1).
    pub fn max_in_flight(mut self, calls: u32) -> Self {
        self.max_in_flight = calls.max(1);
        self
    }
    /// Sets [`ProtoConfig::max_message_size`].
    pub fn max_message_size(mut self, bytes: u64) -> Self {
        self.max_message_size = bytes;
        self
    }
    /// Sets [`ProtoConfig::max_rendezvous_bytes`].
    pub fn max_rendezvous_bytes(mut self, bytes: u64) -> Self {
        self.max_rendezvous_bytes = bytes;
        self
    }
    /// Sets [`ProtoConfig::done_timeout`].
    pub fn done_timeout(mut self, d: Duration) -> Self {
        self.done_timeout = d;
        self
    }
    /// Sets [`ProtoConfig::read_timeout`].
    pub fn read_timeout(mut self, d: Duration) -> Self {
        self.read_timeout = d;
        self
    }
    /// Sets [`ProtoConfig::keepalive_interval`] (at least 1 ms).
    pub fn keepalive_interval(mut self, d: Duration) -> Self {
        self.keepalive_interval = d.max(Duration::from_millis(1));
        self
    }
    /// Sets [`ProtoConfig::idle_timeout`] (at least 1 ms).
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d.max(Duration::from_millis(1));
        self
    }
    /// Sets [`ProtoConfig::max_queued_frames`] (at least 1).
    pub fn max_queued_frames(mut self, frames: u32) -> Self {
        self.max_queued_frames = frames.max(1);
        self
    }
    /// Sets [`ProtoConfig::pool`].
    pub fn pool(mut self, limits: rpc_transport::PoolLimits) -> Self {
        self.pool = limits;
        self
    }
    /// Sets [`ProtoConfig::key_policy`].
    pub fn key_policy(mut self, policy: rpc_transport::KeyPolicy) -> Self {
        self.key_policy = policy;
        self
    }
    /// Size of each receive buffer: the largest frame this side accepts.
    pub fn recv_size(&self) -> u32 {
        let frame = HEADER_LEN + self.eager_threshold.max(DESC_LEN).max(2 + MAX_ERROR_MESSAGE);
        frame.min(u32::MAX as usize) as u32
    }
    /// The hello this side sends in the connection's private data.
    pub fn hello(&self) -> Hello {
        Hello { eager_threshold: self.eager_threshold as u32, max_message_size: self.max_message_size }
    }
}

/// What each side tells the other at setup (carried as transport private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The sender's eager threshold.
    pub eager_threshold: u32,
    /// Largest payload the sender accepts.
    pub max_message_size: u64,
}

const HELLO_MAGIC: &[u8; 4] = b"RPCH";
const HELLO_LEN: usize = 4 + 1 + 4 + 8;

impl Hello {
    /// Encodes: magic "RPCH", version, eager threshold u32, max message u64.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HELLO_LEN);
        out.extend_from_slice(HELLO_MAGIC);
        out.push(super::header::VERSION);
        out.extend_from_slice(&self.eager_threshold.to_le_bytes());
        out.extend_from_slice(&self.max_message_size.to_le_bytes());
        out
    }

    /// Decodes and checks magic and version.
    pub fn decode(b: &[u8]) -> Result<Hello, ProtoError> {
        let bad = |why: &str| ProtoError::Handshake(why.to_string());
        if b.len() != HELLO_LEN || &b[..4] != HELLO_MAGIC {
            return Err(bad("peer is not an rpc-core endpoint (bad hello)"));
        }
        if b[4] != super::header::VERSION {
            return Err(bad(&format!("peer speaks protocol version {}", b[4])));
        }
        let mut t = [0u8; 4];
        t.copy_from_slice(&b[5..9]);
        let mut m = [0u8; 8];
        m.copy_from_slice(&b[9..17]);
        Ok(Hello { eager_threshold: u32::from_le_bytes(t), max_message_size: u64::from_le_bytes(m) })
    }
}

/// Receives each side posts beyond the credits it grants: a side that posted `n` receives
/// granted its peer `n - SPARE_RECEIVES` credits. The spare lets a driver re-post the buffer of
/// the message it just handled after the answer, which already reports that buffer's credit,
/// has gone out: at most this many re-posts are ever outstanding, so a SEND still never meets an
/// empty receive queue. A peer must post at least `2 + SPARE_RECEIVES` (a data frame needs two
/// credits, unless it returns credits itself: see the credit rules in `proto::link`).
pub const SPARE_RECEIVES: u32 = 1;

/// What the protocol knows of the peer once the connection is set up.
#[derive(Debug, Clone, Copy)]
pub struct PeerLimits {
    /// Receives the peer posted: our initial credits.
    pub recv_depth: u32,
    /// The peer's receive buffer size: our largest frame.
    pub recv_size: u32,
    /// The peer's hello.
    pub hello: Hello,
    /// READs this side may have outstanding at once (the transport's negotiated READ depth).
    pub max_reads_in_flight: u32,
    /// Largest single READ the transport can issue.
    pub max_read_size: u64,
}

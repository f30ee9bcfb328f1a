//! Configuration of the verbs backend, with defaults that work on soft-RoCE (rxe) and soft-iWARP (siw).

use std::time::Duration;

/// Environment variable naming the RDMA device to use (e.g. `rxe0`, `siw0`). Unset: whichever
/// device rdma_cm binds the address to.
pub const ENV_DEVICE: &str = "RPC_RDMA_DEVICE";
/// Environment variable with the port number (default 1).
pub const ENV_PORT: &str = "RPC_RDMA_PORT";
/// Environment variable with the GID index (default 1: the IPv4-mapped GID on rxe).
pub const ENV_GID_INDEX: &str = "RPC_RDMA_GID_INDEX";
/// Environment variable with the CQ busy-poll window in microseconds (default 0: none).
pub const ENV_BUSY_POLL_US: &str = "RPC_RDMA_BUSY_POLL_US";

/// Settings of the verbs backend. [`RdmaConfig::from_env`] is what `rdma://` addresses use.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RdmaConfig {
    /// Device that must carry the connection (`RPC_RDMA_DEVICE`). rdma_cm chooses the device from
    /// the IP address; when this is set and rdma_cm chose another device, setup fails with
    /// [`super::RdmaError::WrongDevice`] instead of silently using the other one.
    pub device: Option<String>,
    /// Port of the device (`RPC_RDMA_PORT`, default 1).
    pub port: u8,
    /// GID index that must exist on the port (`RPC_RDMA_GID_INDEX`, default 1 = the IPv4-mapped
    /// GID on rxe). rdma_cm picks the GID it routes with; this index is checked at setup so that a
    /// misconfigured port fails early with [`super::RdmaError::GidNotFound`].
    pub gid_index: u32,
    /// Busy-poll window (`RPC_RDMA_BUSY_POLL_US`, default 0): see
    /// [`crate::RdmaSettings::busy_poll`].
    pub busy_poll: Duration,
    /// Largest number of completions taken from the CQ in one wake-up (bounded work per wake).
    pub poll_budget: usize,
    /// Send-queue depth requested for the QP (clamped to the device's limit). SENDs and READs
    /// beyond it wait in software queues.
    pub send_queue_depth: u32,
    /// Number of registered send slabs used for SENDs too large to go inline. Each slab is as
    /// large as the smaller of our own `recv_size` and the peer's: memory cost at most
    /// `send_slabs * ConnParams::recv_size` per connection, whatever the peer announces.
    pub send_slabs: u32,
    /// Largest READ accepted by `post_read` (`ConnInfo::max_read_size`), default 1 GiB.
    pub max_read_size: u64,
    /// Largest single READ work request; larger READs are split (also bounded by the port's
    /// `max_msg_sz`).
    pub max_read_chunk: u64,
    /// Timeout of address and route resolution, each.
    pub resolve_timeout: Duration,
    /// Bound of the whole connection setup on the connecting side (resolution, rdma_cm exchange
    /// and the in-band hello). The accepting side is bounded by `ConnParams::handshake_timeout`.
    pub setup_timeout: Duration,
    /// Transport retry count of the QP (0..=7).
    pub retry_count: u8,
    /// RNR retry count (0..=7, 7 = forever). A SEND that finds no receive posted at the peer is
    /// retried this many times, then fails the connection (and counts `recv_unexpected`).
    pub rnr_retry_count: u8,
    /// iWARP only: how long the connecting side waits for the peer's hello after sending its
    /// own before it sends a *nudge* (a zero-length RDMA WRITE), default 250 ms; then twice as
    /// long before the next, at most [`HELLO_NUDGES`](super::HELLO_NUDGES) nudges.
    /// `Duration::ZERO`: never.
    ///
    /// Why: soft-iWARP (siw) hands the accepting side's socket to its QP only after the MPA
    /// reply went out; a first message that arrives in between stays unread (no new wake-up
    /// comes for it), and both sides then wait for each other's hello until the accepting
    /// side's handshake timeout (seen in 1 connect in 50 to 300 in the project's VM). Any later
    /// frame makes siw read the socket. A zero-length WRITE takes none of the peer's receives,
    /// gives it no completion, and its key is not checked (RFC 6581's ready-to-receive message).
    /// Costs nothing unless the hello is late. Counted in `TransportCounters::hello_nudges`.
    pub hello_nudge_after: Duration,
    /// Testing only: the accepting side waits this long before it answers the peer's hello
    /// (a slow peer, to exercise `hello_nudge_after`). Default zero.
    #[doc(hidden)]
    pub hello_delay: Duration,
    /// Testing only: the connecting side completes the rdma_cm exchange, then never sends its
    /// hello (a silent peer, as the listener's bounds must survive). `connect_with` then fails
    /// when the listener gives up on it, or at `setup_timeout`. Default `false`.
    #[doc(hidden)]
    pub silent_after_connect: bool,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            device: None,
            port: 1,
            gid_index: 1,
            busy_poll: Duration::ZERO,
            poll_budget: 64,
            send_queue_depth: 256,
            send_slabs: 64,
            max_read_size: 1 << 30,
            max_read_chunk: 1 << 30,
            resolve_timeout: Duration::from_secs(5),
            setup_timeout: Duration::from_secs(30),
            retry_count: 7,
            rnr_retry_count: 6,
            hello_nudge_after: Duration::from_millis(250),
            hello_delay: Duration::ZERO,
            silent_after_connect: false,
        }
    }
}

impl RdmaConfig {
    /// The defaults, overridden by `RPC_RDMA_DEVICE`, `RPC_RDMA_PORT`, `RPC_RDMA_GID_INDEX` and
    /// `RPC_RDMA_BUSY_POLL_US`. Unparsable numbers are ignored with a warning.
    pub fn from_env() -> Self {
        RdmaConfig::default().with_env()
    }

    /// The settings a program gave ([`crate::ConnParams::rdma`]), then the environment's
    /// overrides: what `rdma://` addresses use.
    pub fn from_settings(s: &crate::RdmaSettings) -> Self {
        let mut cfg = RdmaConfig::default();
        if let Some(dev) = &s.device {
            cfg.device = Some(dev.clone());
        }
        if let Some(port) = s.port {
            cfg.port = port;
        }
        if let Some(gid) = s.gid_index {
            cfg.gid_index = gid;
        }
        cfg.busy_poll = s.busy_poll;
        cfg.with_env()
    }

    /// Applies the `RPC_RDMA_*` environment variables that are set.
    fn with_env(self) -> Self {
        let mut cfg = self;
        if let Ok(dev) = std::env::var(ENV_DEVICE) {
            if !dev.trim().is_empty() {
                cfg.device = Some(dev.trim().to_string());
            }
        }
        if let Some(port) = env_number(ENV_PORT) {
            cfg.port = port;
        }
        if let Some(gid) = env_number(ENV_GID_INDEX) {
            cfg.gid_index = gid;
        }
        if let Some(us) = env_number::<u64>(ENV_BUSY_POLL_US) {
            cfg.busy_poll = Duration::from_micros(us);
        }
        cfg
    }
}

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    match raw.trim().parse() {
        Ok(v) => Some(v),
        Err(_) => {
            tracing::warn!(var = name, value = %raw, "ignoring unparsable rdma setting");
            None
        }
    }
}

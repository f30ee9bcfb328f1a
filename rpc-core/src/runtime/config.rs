//! Configuration of clients, servers and calls.

use std::time::Duration;

use crate::context::{Metadata, MetadataError};
use crate::proto::ProtoConfig;

/// Client settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Protocol settings (eager threshold, receive depth, calls in flight, size limit,
    /// rendezvous budget, timeouts, keepalive).
    pub proto: ProtoConfig,
    /// Deadline applied to calls whose [`CallOptions`] set none. Default 30 s, so that no call
    /// waits forever on a server that accepted it and never answers; `None` turns it off.
    pub default_deadline: Option<Duration>,
    /// Longest a connection attempt may take (the first one and every reconnect). Default 10 s.
    pub connect_timeout: Duration,
    /// Reconnect when the connection is lost. Default `None`: a lost connection stays lost and
    /// every later call fails with `Disconnected`. See [`Reconnect`].
    pub reconnect: Option<Reconnect>,
    /// The verbs backend's settings for `rdma://` addresses: device, port, GID index, busy-poll
    /// window (see [`rpc_transport::RdmaSettings`]). Default: whatever device rdma_cm picks,
    /// port 1, GID index 1, no busy-polling. Each `RPC_RDMA_*` environment variable, when set,
    /// overrides its field.
    pub rdma: rpc_transport::RdmaSettings,
    /// The tcp backend's settings for `tcp://` addresses: keepalive, push window, the look at
    /// the socket after a SEND (see [`rpc_transport::TcpSettings`], each field's default and
    /// cost). Default [`rpc_transport::TcpSettings::default`]: keepalive after 10 s idle, a
    /// 32 MiB push window, looks on.
    pub tcp: rpc_transport::TcpSettings,
    /// A call made while no other is in flight on its connection does the connection driver's
    /// work in the calling task: it posts its request at once and polls the connection while it
    /// waits, with no queue and no task in between. Over rdma the caller stops as soon as it
    /// has its answer: the rounds that would only confirm the connection has nothing more
    /// (taking the CQ event and re-arming it: system calls) are left to the driver task, polled
    /// once per such call, which runs them off the call's path (or finds the next lone call
    /// driving already). Over mem and tcp, where arming costs no system call, the caller arms
    /// the connection at the end of the round that took its answer (a look at a queue in
    /// memory, no further round) and the driver task is not woken. Calls made while others are in flight go
    /// through the driver task, which batches their SENDs; so does a call that starts alone
    /// just after several calls ended together (a caller that keeps calls in flight is about to
    /// start as many again, and they leave in one batch). Default `true`; `false`: every call
    /// goes through the driver task. No memory cost either way.
    pub caller_drives: bool,
    /// Connection timers (call deadlines, keepalive, READ and done timeouts) wait on the
    /// process's timer thread, not in the tokio runtime's timer wheel. Default `true`: a
    /// runtime whose wheel holds a timer parks with a timeout, which costs each of its wake-ups
    /// two more clock reads and a kernel timer armed and cancelled, and a connection always
    /// has a timer armed (about 4% of a 32 B round trip over tcp; BENCHMARKS.md). The thread
    /// sleeps until the earliest timer of all connections and wakes only that connection; it
    /// follows the system clock. `false`: timers go in the runtime's wheel, as tokio's own do;
    /// use it under tokio's paused test clock (`test-util`) to have deadlines follow that
    /// clock. Memory: one thread per process (128 KiB of stack), started on first use, and one
    /// entry per connection while its timer is armed. If the thread cannot be started,
    /// connections use the runtime's wheel.
    pub timer_thread: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            proto: ProtoConfig::default(),
            default_deadline: Some(Duration::from_secs(30)),
            connect_timeout: Duration::from_secs(10),
            reconnect: None,
            rdma: rpc_transport::RdmaSettings::default(),
            tcp: rpc_transport::TcpSettings::default(),
            caller_drives: true,
            timer_thread: true,
        }
    }
}

/// How a client reconnects ([`ClientConfig::reconnect`]): when its connection is lost, a
/// background task connects again, waiting `initial_backoff` after a failed attempt, doubling
/// the wait after each further failure up to `max_backoff`; each attempt is bounded by
/// [`ClientConfig::connect_timeout`]. While it is not connected, calls fail at once with
/// `CallError::NotConnected` (they were not sent). **No call is retried**: a call in progress
/// when the connection was lost fails with `CallError::Disconnected`, which means it may or may
/// not have run at the server; only the caller knows whether it is safe to repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconnect {
    /// Wait after the first failed attempt. Default 50 ms.
    pub initial_backoff: Duration,
    /// Longest wait between attempts. Default 5 s.
    pub max_backoff: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect { initial_backoff: Duration::from_millis(50), max_backoff: Duration::from_secs(5) }
    }
}

impl Reconnect {
    /// Sets [`Reconnect::initial_backoff`].
    pub fn initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }
    /// Sets [`Reconnect::max_backoff`].
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }
}

impl ClientConfig {
    /// Sets [`ClientConfig::rdma`].
    pub fn rdma(mut self, settings: rpc_transport::RdmaSettings) -> Self {
        self.rdma = settings;
        self
    }
    /// Sets [`ClientConfig::tcp`].
    pub fn tcp(mut self, settings: rpc_transport::TcpSettings) -> Self {
        self.tcp = settings;
        self
    }
    /// Sets [`ClientConfig::proto`].
    pub fn proto(mut self, proto: ProtoConfig) -> Self {
        self.proto = proto;
        self
    }
    /// Sets [`ClientConfig::default_deadline`].
    pub fn default_deadline(mut self, d: Duration) -> Self {
        self.default_deadline = Some(d);
        self
    }
    /// Sets [`ClientConfig::connect_timeout`].
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
    /// Sets [`ClientConfig::reconnect`].
    pub fn reconnect(mut self, policy: Reconnect) -> Self {
        self.reconnect = Some(policy);
        self
    }
    /// Calls without a deadline of their own wait for as long as the connection lives.
    pub fn no_default_deadline(mut self) -> Self {
        self.default_deadline = None;
        self
    }
    /// Sets [`ClientConfig::caller_drives`].
    pub fn caller_drives(mut self, on: bool) -> Self {
        self.caller_drives = on;
        self
    }
    /// Sets [`ClientConfig::timer_thread`].
    pub fn timer_thread(mut self, on: bool) -> Self {
        self.timer_thread = on;
        self
    }
}

/// Server settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Protocol settings of each accepted connection.
    pub proto: ProtoConfig,
    /// Handlers running at once, over all connections; further requests wait (no task is
    /// spawned for them), served in arrival order across connections. Default 1024.
    pub max_concurrent_handlers: usize,
    /// Handlers one connection may run at once, so that one client cannot take every slot of
    /// [`ServerConfig::max_concurrent_handlers`]; its further requests wait in order. Default 128.
    pub max_handlers_per_connection: usize,
    /// Connections open at once. Further connections are not accepted (they wait in the
    /// transport's backlog) until one closes. Default 1024. Each costs its receive pool,
    /// `(recv_depth + 1) * (40 + eager_threshold)` bytes (520 KiB with the defaults), and keeps
    /// up to 32 KiB of its finished handlers' emptied boxes and contexts for the next ones (at
    /// least 4 boxes whatever their size) and up to 64 idle handler tasks (a few hundred bytes
    /// each), so that its handlers allocate nothing per call.
    pub max_connections: usize,
    /// Rendezvous bytes all connections together may hold (READ destinations in flight and
    /// response regions awaiting the client's READ). Default 1 GiB. Each connection is also held
    /// to `proto.max_rendezvous_bytes`.
    pub max_rendezvous_bytes: u64,
    /// Deadline applied to requests that carry none, so that no call holds a handler slot
    /// forever. Default 60 s; `None` turns it off.
    pub default_deadline: Option<Duration>,
    /// How long a connecting peer has to complete setup (its hello). Default 5 s. A peer that
    /// connects and stays silent holds one socket (tcp) or one queue pair (rdma) that long.
    pub handshake_timeout: Duration,
    /// Connections being set up at once; further ones wait in the kernel's backlog. Default 64.
    pub max_pending_handshakes: usize,
    /// How long a graceful shutdown waits for calls in progress before aborting them. Default 30 s.
    pub shutdown_timeout: Duration,
    /// The verbs backend's settings for `rdma://` addresses (see [`ClientConfig::rdma`]).
    pub rdma: rpc_transport::RdmaSettings,
    /// The tcp backend's settings for `tcp://` addresses (see [`ClientConfig::tcp`]); the
    /// listener's [`rpc_transport::TcpSettings::push_listener_total`] bounds what its
    /// connections' peers push, together (default 256 MiB).
    pub tcp: rpc_transport::TcpSettings,
    /// Which handlers have their first poll in the connection's driver rather than in a task.
    /// Default [`InlineHandlers::Marked`]: those of methods marked `#[rpc(inline)]` in the
    /// `#[service]` trait ([`MethodDesc::inline`](crate::MethodDesc::inline)); every other
    /// handler runs in a task of its own, as in tarpc and tonic (one of the connection's handler
    /// tasks, kept from one handler to the next, so none is allocated per call). Whichever the
    /// setting, only small calls are polled in the driver: one whose request came by rendezvous
    /// (over [`ProtoConfig::eager_threshold`]), or whose method's answers lately did, runs in a
    /// task, since copying its payload in the driver would stall the connection (a 16 MiB echo
    /// held it ~3.8 ms); a method's first call on a connection counts as small. A handler polled
    /// in the driver that finishes without waiting (most small ones) is answered at once: no
    /// task, no channel, no extra wake-up (a 32 B call over tcp ~16.8k -> ~13.7k instructions,
    /// see BENCHMARKS.md); one that waits is moved to a task and carries on there. The cost: a
    /// handler that computes for long before its first `.await` stalls its whole connection by
    /// that long, its other calls and its keepalive answers included (a client declares the
    /// connection dead after [`ProtoConfig::idle_timeout`] of silence): one slow handler (a 64
    /// MiB response built in place, under emulation) was enough to stall a connection past its
    /// idle timeout; such a handler is reported ([`ServerConfig::inline_stall`]). Either way a handler holds its slot of
    /// [`ServerConfig::max_concurrent_handlers`] while it runs, and a panic is answered as a
    /// `Handler` error.
    pub inline_handlers: InlineHandlers,
    /// How long a handler's first poll in the connection's driver (see
    /// [`ServerConfig::inline_handlers`]) may hold it before it is reported as a stall: the
    /// connection's other calls and its keepalive answers waited that long. Default 1 ms (a
    /// handler that answers at once takes microseconds). `None` turns the check off.
    ///
    /// A stall counts in [`ConnStats::inline_stalls`](crate::ConnStats::inline_stalls) and in
    /// the `rpc_server_inline_stalls_total` metric of its method, and is logged in the call's
    /// span: as a `debug` event the first time, as a `warn` event when the same method stalls
    /// again within 1,000 of its runs in that connection's driver (at most one warning per
    /// connection every 10 s, with the count so far). A method warned about should not be
    /// marked `#[rpc(inline)]`, or the server should run with [`InlineHandlers::Never`]. A
    /// handler that holds the driver every time is warned at its second run.
    ///
    /// The measure is one reading of the clock per handler polled in the driver, once its answer
    /// is made and before it is sent (~25 ns where the clock is read in user space): the send is
    /// not the handler's doing, and one that wakes a peer on the same CPU can hand that CPU to
    /// the peer for as long as it runs. It is wall-clock time: a handler whose thread the kernel
    /// took off its CPU meanwhile counts that time too. With client and server on one vCPU
    /// (`rpc-bench run --client-cpu 0 --server-cpu 0`) and a 100 us limit, a 32 B echo's handler
    /// was reported 5-10 times in 5 s (about 250,000 calls; 250-340 times when the measure took
    /// in the answer's send); at 64 calls in flight, where a handler's measure starts where the
    /// one before it ended, 0-14 times in 5 s (about 4 million calls) at the 1 ms default. Such
    /// stalls seldom come two within 1,000 runs of a method, so they are counted, not warned.
    ///
    /// Cost: ~20 instructions per handler polled in the driver for counting its method's runs,
    /// and 16 bytes per method of the service per connection (none when off).
    pub inline_stall: Option<Duration>,
    /// Where connection timers wait: see [`ClientConfig::timer_thread`]. Default `true`.
    pub timer_thread: bool,
}

/// Which handlers a server polls first in the connection's driver
/// ([`ServerConfig::inline_handlers`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InlineHandlers {
    /// None: every handler runs in a task (to rule out a stall by a marked method's handler
    /// without rebuilding the service).
    Never,
    /// Those of methods marked `#[rpc(inline)]` (the default).
    #[default]
    Marked,
    /// Every handler: for services whose handlers all answer quickly or `spawn_blocking` their
    /// heavy work.
    Always,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            proto: ProtoConfig::default(),
            max_concurrent_handlers: 1024,
            max_handlers_per_connection: 128,
            max_connections: 1024,
            max_rendezvous_bytes: 1 << 30,
            default_deadline: Some(Duration::from_secs(60)),
            handshake_timeout: Duration::from_secs(5),
            max_pending_handshakes: 64,
            shutdown_timeout: Duration::from_secs(30),
            rdma: rpc_transport::RdmaSettings::default(),
            tcp: rpc_transport::TcpSettings::default(),
            inline_handlers: InlineHandlers::Marked,
            inline_stall: Some(Duration::from_millis(1)),
            timer_thread: true,
        }
    }
}

impl ServerConfig {
    /// Sets [`ServerConfig::proto`].
    pub fn proto(mut self, proto: ProtoConfig) -> Self {
        self.proto = proto;
        self
    }
    /// Sets [`ServerConfig::max_concurrent_handlers`] (at least 1).
    pub fn max_concurrent_handlers(mut self, n: usize) -> Self {
        self.max_concurrent_handlers = n.max(1);
        self
    }
    /// Sets [`ServerConfig::max_handlers_per_connection`] (at least 1).
    pub fn max_handlers_per_connection(mut self, n: usize) -> Self {
        self.max_handlers_per_connection = n.max(1);
        self
    }
    /// Sets [`ServerConfig::max_connections`] (at least 1).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }
    /// Sets [`ServerConfig::max_rendezvous_bytes`].
    pub fn max_rendezvous_bytes(mut self, bytes: u64) -> Self {
        self.max_rendezvous_bytes = bytes;
        self
    }
    /// Sets [`ServerConfig::default_deadline`].
    pub fn default_deadline(mut self, d: Option<Duration>) -> Self {
        self.default_deadline = d;
        self
    }
    /// Sets [`ServerConfig::handshake_timeout`].
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = d;
        self
    }
    /// Sets [`ServerConfig::max_pending_handshakes`] (at least 1).
    pub fn max_pending_handshakes(mut self, n: usize) -> Self {
        self.max_pending_handshakes = n.max(1);
        self
    }
    /// Sets [`ServerConfig::shutdown_timeout`].
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
    /// Sets [`ServerConfig::rdma`].
    pub fn rdma(mut self, settings: rpc_transport::RdmaSettings) -> Self {
        self.rdma = settings;
        self
    }
    /// Sets [`ServerConfig::tcp`].
    pub fn tcp(mut self, settings: rpc_transport::TcpSettings) -> Self {
        self.tcp = settings;
        self
    }
    /// Sets [`ServerConfig::inline_handlers`].
    pub fn inline_handlers(mut self, which: InlineHandlers) -> Self {
        self.inline_handlers = which;
        self
    }
    /// Sets [`ServerConfig::inline_stall`].
    pub fn inline_stall(mut self, after: Option<Duration>) -> Self {
        self.inline_stall = after;
        self
    }
    /// Sets [`ServerConfig::timer_thread`].
    pub fn timer_thread(mut self, on: bool) -> Self {
        self.timer_thread = on;
        self
    }
}

/// Per-call options, set without changing the service trait:
/// `client.with_options(CallOptions::new().deadline(d)).method(..)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallOptions {
    /// Time allowed for the call, from when it is issued. Travels to the server as a relative
    /// duration; the server cancels the handler when it passes. Default: the client's default.
    pub deadline: Option<Duration>,
    /// Key-value pairs sent with the call (a trace id, an auth token), bounded in count and bytes
    /// (see [`Metadata`]); the handler reads them from its
    /// [`Context`](crate::context::Context). Default: none.
    pub metadata: Metadata,
}

impl CallOptions {
    /// Options with nothing set.
    pub fn new() -> Self {
        CallOptions::default()
    }
    /// Sets [`CallOptions::deadline`].
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }
    /// Sets [`CallOptions::metadata`].
    pub fn metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }
    /// Adds one metadata entry, or refuses with the limit it would break.
    pub fn with_metadata(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, MetadataError> {
        self.metadata.insert(key, value)?;
        Ok(self)
    }
}

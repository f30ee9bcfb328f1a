//! The tcp backend's settings ([`crate::ConnParams::tcp`]; ignored by `mem` and `rdma`).

use std::time::Duration;

/// The tcp backend's settings a program sets in code (ignored by `mem` and `rdma`).
///
/// Build it from the default with the setters, so that new fields keep their defaults:
/// `TcpSettings::default().push_window(0)`. It is `#[non_exhaustive]`: other crates cannot name
/// its fields in a struct expression (struct update syntax included), only read them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpSettings {
    /// `SO_KEEPALIVE` on every stream (both sides), so that a peer that vanishes without a FIN
    /// (host down, cable cut) is detected by the kernel. `Some(idle)`: the first probe after
    /// `idle` without traffic, then one every `max(idle / 5, 1 s)`; after 3 unanswered probes
    /// the connection fails with `Disconnected`; `TCP_USER_TIMEOUT` is set to the same total, so
    /// data of ours left unacknowledged that long fails it too. Default `Some(10 s)`, i.e. a dead
    /// peer is found within about 16 s of silence; at least 1 s. Cost: a probe of ~60 bytes per
    /// idle interval per idle connection. `None` leaves keepalive and the user timeout off.
    /// (Liveness of a peer whose host is up but whose process hangs is the protocol's
    /// keepalive's job.)
    pub keepalive: Option<Duration>,
    /// How many bytes of pushed regions this side accepts to hold at once, announced to the peer
    /// in the hello. When the peer registers a region whose whole length fits the window it has
    /// left, its transport sends the bytes right away, ahead of the frame that advertises the
    /// region, and our READ of exactly that region completes from them without a round trip (see
    /// the `tcp` module). Bytes come back to the window when read, or dropped when the peer
    /// revokes the region; a peer that pushes beyond the window fails the connection as
    /// `Malformed`. Default 32 MiB (a 16 MiB payload with its encoding fits). Memory cost: up to
    /// this many bytes per connection, held by the transport for regions the peer registered and
    /// we have not read yet, on top of what the protocol above budgets for its READs, plus one
    /// idle buffer of at most this size kept for the next push; a listener's connections hold at
    /// most [`TcpSettings::push_listener_total`] together. 0 disables pushing to this side (every
    /// READ then goes to the peer).
    pub push_window: u64,
    /// Listeners only: pushed bytes (see [`TcpSettings::push_window`]) that all the connections
    /// accepted by the listener hold at once, together. A push beyond it is read off the socket
    /// and discarded, its window handed back at once, and the READ of its region goes to the peer
    /// as if it had not been pushed. Default 256 MiB. Memory cost: at most this many bytes over
    /// the listener's connections (each also at most its `push_window`).
    pub push_listener_total: u64,
    /// A SEND written by the caller whose write took at least twice the fastest of the last 256
    /// is followed by one read of the socket, whatever the runtime's readiness says. A write that
    /// long usually had the peer run inside it (both on one CPU) and answer: the answer is then
    /// read without a wait for readiness (an `epoll_wait` system call and a turn of the runtime's
    /// I/O driver). Looks that mostly find nothing pause themselves (for 1, 2, 4 ... up to 64
    /// windows of 256 SENDs). Default `true`. Cost: two readings of the time-stamp counter per
    /// SEND the caller writes, and a `recv` system call per look that finds nothing. Counted in
    /// [`crate::TransportCounters::tcp_looks`].
    pub read_after_send: bool,
    /// Busy-poll window: default zero, the reader sleeps until the runtime reports the socket
    /// readable. Otherwise, once bytes arrived, the reader keeps reading the socket (one `recv`
    /// system call per look, yielding to the runtime between looks: its other tasks run, the
    /// thread is never blocked) for up to this long after it first finds nothing, before it
    /// sleeps; bytes that keep coming keep it spinning. Gain: across CPUs, no sleep of the
    /// process and no wake-up of an idle CPU per message (a 32 B echo with client and server on
    /// two vCPUs of a KVM guest: p50 56 us without, 11 us with both sides spinning; BENCHMARKS.md,
    /// session 64). Cost: up to a whole CPU for the thread that runs the connection while
    /// messages come within the window (counted in `TransportCounters::busy_poll_spins`). Only
    /// for a thread with a CPU of its own: with both peers on one CPU, a spinning side takes the
    /// CPU its peer needs to answer, and round trips get far slower, as with
    /// [`crate::RdmaSettings::busy_poll`].
    pub busy_poll: Duration,
}

impl Default for TcpSettings {
    fn default() -> Self {
        TcpSettings {
            keepalive: Some(Duration::from_secs(10)),
            push_window: 32 << 20,
            push_listener_total: 256 << 20,
            read_after_send: true,
            busy_poll: Duration::ZERO,
        }
    }
}

impl TcpSettings {
    /// Sets [`TcpSettings::keepalive`].
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = idle;
        self
    }
    /// Sets [`TcpSettings::push_window`].
    pub fn push_window(mut self, bytes: u64) -> Self {
        self.push_window = bytes;
        self
    }
    /// Sets [`TcpSettings::push_listener_total`].
    pub fn push_listener_total(mut self, bytes: u64) -> Self {
        self.push_listener_total = bytes;
        self
    }
    /// Sets [`TcpSettings::read_after_send`].
    pub fn read_after_send(mut self, on: bool) -> Self {
        self.read_after_send = on;
        self
    }
    /// Sets [`TcpSettings::busy_poll`].
    pub fn busy_poll(mut self, window: Duration) -> Self {
        self.busy_poll = window;
        self
    }
}

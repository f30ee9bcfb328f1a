//! What the client and server drivers share: feeding completions into the state machine and
//! posting the operations it asks for.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;

use futures::stream::{FuturesUnordered, StreamExt};
use rpc_transport::{
    Buf, Completion, ConnInfo, Connection, Detail, ReadError, Received, RecvBuffer, RegionDesc, SendBuf,
    TransportCounters, TransportError, WrId,
};
use tokio::task::JoinHandle;
use tokio::time::Sleep;

use super::timer_thread::Alarm;
use crate::proto::{ClientProto, Op, ProtoError, ProtoStats, ServerProto};

/// Completions taken per poll of the completion queue.
pub(crate) const COMPLETION_BATCH: usize = 64;
/// Received frames of at most this many bytes are copied out of their receive buffer, which is
/// re-posted as it is ([`poll_completions`]); their payloads are then [`Bytes`] of at most 1
/// KiB, whose small `Bytes` values decode as slices of the copy (`codec::SharedBytes`).
const SMALL_FRAME: usize = crate::arena::SMALL;
/// Rounds of (commands, completions, ops) one wake-up may run before yielding to the scheduler.
pub(crate) const ROUNDS_PER_WAKE: usize = 16;

/// Counters of one connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnStats {
    /// The protocol's counters.
    pub proto: ProtoStats,
    /// The transport's counters.
    pub transport: TransportCounters,
    /// Calls in progress.
    pub calls_in_flight: usize,
    /// Times the connection's driver task was polled since it started: its wake-ups (a poll
    /// that runs several rounds of work counts once).
    pub driver_polls: u64,
    /// Passes over the connection run by the task of a call alone in flight, which drives the
    /// connection itself (see `ClientConfig::caller_drives`). A client's; 0 on a server.
    pub caller_passes: u64,
    /// Handlers that finished in their first poll, run inline in the connection's driver (no
    /// task spawned; see `ServerConfig::inline_handlers`). A server's; 0 on a client.
    pub handlers_inline: u64,
    /// Handlers the connection's driver ran in tasks (they waited in their first poll, or
    /// `inline_handlers` did not put their first poll in the driver): in its handler tasks,
    /// each kept from one handler to the next. A server's; 0 on a client.
    pub handlers_spawned: u64,
    /// Handlers whose first poll in the connection's driver held it for
    /// [`ServerConfig::inline_stall`](crate::ServerConfig::inline_stall) or longer. A server's;
    /// 0 on a client.
    pub inline_stalls: u64,
    /// Boxes the connection allocated for its handlers' futures (a server's; 0 on a client):
    /// a handler's future goes in the box of an earlier one that finished if one has its
    /// layout (see [`Service::call_in`](crate::Service::call_in)), so this grows with the
    /// layouts of the service's futures and the handlers that run at once, not with calls.
    /// Boxes a service's own `call` makes (a hand-written service without `call_in`) are not
    /// counted.
    pub handler_boxes: u64,
}

impl ConnStats {
    /// Field-by-field sum, for totals over connections.
    pub fn sum(&self, other: &ConnStats) -> ConnStats {
        ConnStats {
            proto: self.proto.merged(&other.proto),
            transport: self.transport.merged(&other.transport),
            calls_in_flight: self.calls_in_flight + other.calls_in_flight,
            driver_polls: self.driver_polls + other.driver_polls,
            caller_passes: self.caller_passes + other.caller_passes,
            handlers_inline: self.handlers_inline + other.handlers_inline,
            handlers_spawned: self.handlers_spawned + other.handlers_spawned,
            inline_stalls: self.inline_stalls + other.inline_stalls,
            handler_boxes: self.handler_boxes + other.handler_boxes,
        }
    }
}

/// The inputs both state machines take from the transport.
pub(crate) trait ProtoEnd {
    fn handle_frame(&mut self, frame: Received, now: Instant) -> Result<(), ProtoError>;
    /// [`ProtoEnd::handle_frame`] of a small frame the state machine copies (into its arena):
    /// the caller keeps the buffer it lies in.
    fn handle_frame_copied(&mut self, frame: &[u8], now: Instant) -> Result<(), ProtoError> {
        self.handle_frame(Received::from(Bytes::copy_from_slice(frame)), now)
    }
    fn handle_send(&mut self, wr_id: WrId, result: Result<(), String>) -> Result<(), ProtoError>;
    fn handle_read(&mut self, wr_id: WrId, result: Result<Bytes, ReadError>);
    fn handle_registered(&mut self, call_id: u64, result: Result<RegionDesc, Detail>);
    fn next_op(&mut self) -> Option<Op>;
    /// [`ProtoEnd::next_op`], with the SENDs put straight into `batch`: only the other
    /// operations are returned.
    fn next_op_into(&mut self, batch: &mut Vec<(WrId, SendBuf)>) -> Option<Op>;
    /// Whether [`ProtoEnd::next_op`] has anything to do (when not, it would return `None` and
    /// change nothing).
    fn has_ops(&self) -> bool;
    /// Whether the state machine has results or requests for its driver to take.
    fn has_events(&self) -> bool;
    fn timeout(&mut self) -> Option<Instant>;
    /// The earliest timeout added since the last look (see [`ClientProto::take_added_timeout`]).
    fn take_added_timeout(&mut self) -> Option<Instant>;
    fn expire(&mut self, now: Instant) -> Result<(), ProtoError>;
}

macro_rules! impl_proto_end {
    ($ty:ty, |$p:ident, $frame:ident, $now:ident| $recv:expr) => {
        impl ProtoEnd for $ty {
            fn handle_frame(&mut self, $frame: Received, $now: Instant) -> Result<(), ProtoError> {
                let $p = self;
                $recv
            }
            fn handle_frame_copied(&mut self, frame: &[u8], now: Instant) -> Result<(), ProtoError> {
                self.handle_recv(frame, now)
            }
            fn handle_send(&mut self, wr_id: WrId, result: Result<(), String>) -> Result<(), ProtoError> {
                self.handle_send_complete(wr_id, result)
            }
            fn handle_read(&mut self, wr_id: WrId, result: Result<Bytes, ReadError>) {
                self.handle_read_complete(wr_id, result)
            }
            fn handle_registered(&mut self, call_id: u64, result: Result<RegionDesc, Detail>) {
                <$ty>::handle_registered(self, call_id, result)
            }
            fn next_op(&mut self) -> Option<Op> {
                self.poll_op()
            }
            #[inline]
            fn next_op_into(&mut self, batch: &mut Vec<(WrId, SendBuf)>) -> Option<Op> {
                self.poll_op_into(batch)
            }
            // Asked by every round (`post_ops`' quick look): inlined, it costs a few loads.
            #[inline]
            fn has_ops(&self) -> bool {
                self.has_ops()
            }
            #[inline]
            fn has_events(&self) -> bool {
                self.has_events()
            }
            fn timeout(&mut self) -> Option<Instant> {
                self.poll_timeout()
            }
            fn take_added_timeout(&mut self) -> Option<Instant> {
                <$ty>::take_added_timeout(self)
            }
            fn expire(&mut self, now: Instant) -> Result<(), ProtoError> {
                self.handle_timeout(now)
            }
        }
    };
}

impl_proto_end!(ClientProto, |p, frame, now| p.handle_recv_bytes(frame, now));
impl_proto_end!(ServerProto, |p, frame, now| p.handle_recv_bytes(frame, now));

/// Why a connection's driver stops.
#[derive(Debug)]
pub(crate) enum Fatal {
    Transport(TransportError),
    Protocol(ProtoError),
}

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fatal::Transport(e) => write!(f, "{e}"),
            Fatal::Protocol(
                e @ (ProtoError::PeerSilent { .. }
                | ProtoError::DoneTimeout { .. }
                | ProtoError::ReadTimeout { .. }),
            ) => {
                write!(f, "{e}")
            }
            Fatal::Protocol(e) => write!(f, "protocol violation by the peer: {e}"),
        }
    }
}

impl Fatal {
    /// Why, with the transport's or the protocol's error kept as the cause (so a call failed by
    /// it has the chain: `CallError` -> `TransportError` -> e.g. the `io::Error`).
    pub(crate) fn into_detail(self) -> Detail {
        let message = Detail::new(self.to_string());
        match self {
            Fatal::Transport(e) => message.with_cause(e),
            Fatal::Protocol(e) => message.with_cause(e),
        }
    }
}

/// The current time, from tokio's clock (so paused-time tests work).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A driver's reading of the clock: taken at most once per wake-up, and again only after user
/// code (an inline handler) ran. Reading the clock is a system call where it has no vDSO (a VM
/// whose clocksource is the HPET, as in the project's TCG VM, where it was 15 system calls per
/// call before this); timeouts and durations are milliseconds, a wake-up's work microseconds.
#[derive(Debug, Default)]
pub(crate) struct Clock(Option<tokio::time::Instant>);

impl Clock {
    /// The time as of this wake-up (read now if not yet read).
    pub(crate) fn now(&mut self) -> tokio::time::Instant {
        *self.0.get_or_insert_with(tokio::time::Instant::now)
    }

    /// Moves the reading on to `at` (a timer found due says the time is at least that).
    fn advance_to(&mut self, at: tokio::time::Instant) {
        let now = self.now();
        self.0 = Some(now.max(at));
    }

    /// Takes `at`, just read, as the reading (user code ran, and the caller read the clock after
    /// it).
    pub(crate) fn set(&mut self, at: tokio::time::Instant) {
        self.0 = Some(at);
    }

    /// Forgets the reading: a new wake-up, or user code ran since.
    pub(crate) fn reset(&mut self) {
        self.0 = None;
    }
}

/// Polls the completion queue once and feeds what it returns into `proto`. Returns whether any
/// completion was handled. Receive buffers are re-posted before the next operation is polled,
/// as the credit scheme requires.
pub(crate) fn poll_completions<P: ProtoEnd>(
    cx: &mut Context<'_>,
    conn: &mut dyn Connection,
    proto: &mut P,
    scratch: &mut Scratch,
) -> Result<bool, Fatal> {
    let mut posted = false;
    // Polled only while it holds something: an empty set has nothing to wake us for, and a
    // destination pushed by `post_ops` is polled in the round that follows (`post_ops` reports
    // it as progress).
    while !scratch.destinations.is_empty() {
        let Poll::Ready(Some(ready)) = scratch.destinations.poll_next_unpin(cx) else { break };
        let (wr_id, remote, dst) = ready.map_err(|e| {
            Fatal::Transport(TransportError::Disconnected(Detail::caused_by(
                "making a READ destination failed",
                e,
            )))
        })?;
        conn.post_read(wr_id, remote, dst).map_err(Fatal::Transport)?;
        posted = true;
    }
    let Scratch { completions: scratch, reposts, deferred_repost, clock, .. } = scratch;
    match conn.poll_completions(cx, scratch, COMPLETION_BATCH) {
        Poll::Pending => return Ok(posted),
        Poll::Ready(Err(e)) => return Err(Fatal::Transport(e)),
        Poll::Ready(Ok(())) => {}
    }
    // Taken one by one (`take_each`: cheaper than a `Drain` for the few a poll finds); after an
    // error the rest are dropped.
    rpc_transport::take_each(scratch, |completion| {
        match completion {
            Completion::Recv { buf } => {
                // Read once per wake-up, and only for a message (its arrival counts for the
                // connection's liveness): a SEND or READ completion needs no time.
                let now = clock.now().into_std();
                // A small message is copied out (into the state machine's arena: less work than
                // a buffer taken from the pool and given back) and its receive buffer goes back
                // into the receive queue as it is. A larger one is handed on as it lies in the
                // receive buffer (no copy), and a fresh buffer of the connection's pool takes
                // its place. Either way the receive is re-posted (all of the batch's in one
                // post, below) before the state machine can return the credit.
                let (handled, repost) = if buf.bytes().len() <= SMALL_FRAME {
                    (proto.handle_frame_copied(buf.bytes(), now), buf.reuse())
                } else {
                    let size = buf.capacity();
                    let handled = proto.handle_frame(buf.into_received(), now);
                    (handled, RecvBuffer::from_buf(conn.pool().alloc_or_heap(size)))
                };
                reposts.push(repost);
                if let Err(e) = handled {
                    reposts.extend(deferred_repost.take());
                    conn.post_recv_batch(reposts).map_err(Fatal::Transport)?;
                    return Err(Fatal::Protocol(e));
                }
            }
            Completion::Send { wr_id, result } => send_completed(proto, wr_id, result)?,
            Completion::Read { wr_id, result } => proto.handle_read(wr_id, result.map(Buf::freeze)),
            other => tracing::warn!(?other, "unknown completion kind ignored"),
        }
        Ok(())
    })?;
    if let Some(defer) = reposts.pop() {
        // One re-post may wait until the round's answers are out (`flush_repost`): the spare
        // receive stands in for it (see `proto::SPARE_RECEIVES`). One deferred earlier and
        // not yet posted goes now, so that never more than the spare is outstanding.
        reposts.extend(deferred_repost.replace(defer));
        if !reposts.is_empty() {
            conn.post_recv_batch(reposts).map_err(Fatal::Transport)?;
        }
    }
    Ok(true)
}

/// Posts the receive [`poll_completions`] left for after the answers (if one waits): called
/// once the round's SENDs are posted, so that re-posting a receive (a call into the provider,
/// and the receive queue's lock) is not on the way from a message to its answer.
pub(crate) fn flush_repost(conn: &mut dyn Connection, scratch: &mut Scratch) -> Result<(), Fatal> {
    match scratch.deferred_repost.take() {
        Some(buf) => conn.post_recv(buf).map_err(Fatal::Transport),
        None => Ok(()),
    }
}

/// Buffers a driver reuses from one poll to the next (no allocation per poll).
#[derive(Debug)]
pub(crate) struct Scratch {
    completions: Vec<Completion>,
    /// Receive buffers to post in place of those the batch's messages arrived in.
    reposts: Vec<RecvBuffer>,
    /// A receive to re-post once the round's answers are out (at most one: the spare).
    deferred_repost: Option<RecvBuffer>,
    /// SENDs of one `post_ops`, posted together.
    sends: Vec<(WrId, SendBuf)>,
    /// SENDs that completed as they were posted, to hand to the state machine.
    sent: Vec<(WrId, Result<(), TransportError>)>,
    /// READ destinations being made (registered) on blocking threads, each with its READ.
    destinations: FuturesUnordered<JoinHandle<(WrId, RegionDesc, Buf)>>,
    /// The clock as of this wake-up (the driver resets it at each poll).
    pub(crate) clock: Clock,
}

impl Scratch {
    /// Nothing left in it for a later round: no SEND to post or to report, no READ
    /// destination being made. (A receive left to re-post after the next answer or request is
    /// out, `flush_repost`, waits for that, not for a round.)
    pub(crate) fn is_idle(&self) -> bool {
        self.sends.is_empty() && self.sent.is_empty() && self.destinations.is_empty()
    }

    pub(crate) fn new() -> Self {
        Scratch {
            completions: Vec::with_capacity(COMPLETION_BATCH),
            reposts: Vec::with_capacity(COMPLETION_BATCH),
            deferred_repost: None,
            sends: Vec::with_capacity(COMPLETION_BATCH),
            sent: Vec::with_capacity(COMPLETION_BATCH),
            destinations: FuturesUnordered::new(),
            clock: Clock::default(),
        }
    }
}

/// Posts every operation the state machine asks for. SENDs go to the transport together at the
/// end (rdma: one doorbell per 16), or before a revocation, so that the order of SENDs and
/// revocations is kept. Returns whether a READ destination is being made: the caller must run
/// another round, whose [`poll_completions`] polls it (and registers for its end).
#[inline]
pub(crate) fn post_ops<P: ProtoEnd>(
    conn: &mut dyn Connection,
    proto: &mut P,
    scratch: &mut Scratch,
) -> Result<bool, Fatal> {
    // Most rounds have nothing to post (6 of 8 per call in a 32 B echo over mem): answered
    // without entering the loop, which would find `next_op` empty and no SEND to flush.
    if !proto.has_ops() && scratch.sends.is_empty() {
        return Ok(false);
    }
    post_ops_slow(conn, proto, scratch)
}

/// [`post_ops`] when the state machine may have operations.
fn post_ops_slow<P: ProtoEnd>(
    conn: &mut dyn Connection,
    proto: &mut P,
    scratch: &mut Scratch,
) -> Result<bool, Fatal> {
    let mut making = false;
    let Scratch { sends, sent, destinations, .. } = scratch;
    loop {
        // SENDs go straight into `sends`; the other operations come back here, in order.
        while let Some(op) = proto.next_op_into(sends) {
            match op {
                // Only SENDs an earlier `next_op` queued (the driver never calls it before
                // closing): kept in order all the same.
                Op::Send { wr_id, frame } => sends.push((wr_id, frame)),
                Op::Register { call_id, data } => {
                    let result = conn.register(data).map_err(Detail::from_error);
                    proto.handle_registered(call_id, result);
                }
                Op::Deregister { region } => {
                    if !sends.is_empty() {
                        post_sends(conn, proto, sends, sent)?;
                    }
                    if let Err(e) = conn.deregister(region) {
                        tracing::warn!(?region, error = %e, "revoking a region failed");
                    }
                }
                Op::Read { wr_id, remote } => {
                    // The destination comes from the connection's pool: registered once, reused.
                    let len = remote.len as usize;
                    let pool = conn.pool();
                    // Without registration (mem, tcp) making memory is only a heap allocation.
                    let ready =
                        pool.alloc_idle(len).or_else(|| (!pool.registers()).then(|| pool.alloc_or_heap(len)));
                    match ready {
                        Some(dst) => conn.post_read(wr_id, remote, dst).map_err(Fatal::Transport)?,
                        None => {
                            // Registering new memory (a new chunk, or a one-off beyond the pool's
                            // limits) can take milliseconds for a large buffer: it is done on a
                            // blocking thread, and the READ is posted when the buffer is ready; the
                            // connection's other calls go on meanwhile.
                            let pool = pool.clone();
                            let alloc = move || (wr_id, remote, pool.alloc_or_heap(len));
                            destinations.push(tokio::task::spawn_blocking(alloc));
                            making = true;
                        }
                    }
                }
            }
        }
        if sends.is_empty() {
            return Ok(making);
        }
        post_sends(conn, proto, sends, sent)?;
        // A SEND handled at once may have let the state machine send more (its send window).
        if !proto.has_ops() {
            return Ok(making);
        }
    }
}

/// Posts `sends` and hands the state machine the SENDs that completed as they were posted
/// (most small ones: see `Connection::post_send_batch_reporting`), so that no further poll of
/// the transport is needed for them.
fn post_sends<P: ProtoEnd>(
    conn: &mut dyn Connection,
    proto: &mut P,
    sends: &mut Vec<(WrId, SendBuf)>,
    sent: &mut Vec<(WrId, Result<(), TransportError>)>,
) -> Result<(), Fatal> {
    conn.post_send_batch_reporting(sends, sent).map_err(Fatal::Transport)?;
    rpc_transport::take_each(sent, |(wr_id, result)| send_completed(proto, wr_id, result))
}

/// Hands the state machine a SEND's completion. A SEND that failed is the transport's failure
/// (the peer went away, the device reported an error), not a protocol violation by the peer:
/// the connection ends with the transport's error, kept as it is (and logged as a transport
/// error: a peer that closes with a SEND of ours in flight is no warning).
fn send_completed<P: ProtoEnd>(
    proto: &mut P,
    wr_id: WrId,
    result: Result<(), TransportError>,
) -> Result<(), Fatal> {
    match result {
        Ok(()) => proto.handle_send(wr_id, Ok(())).map_err(Fatal::Protocol),
        Err(e) => {
            // The state machine counts the SEND as done (and would end the connection too).
            let _ = proto.handle_send(wr_id, Err(e.to_string()));
            Err(Fatal::Transport(e))
        }
    }
}

/// After the connection closed: carries out the revocations the state machine still asks for
/// (its regions go with the connection); everything else it asks for is moot.
pub(crate) fn revoke_after_close<P: ProtoEnd>(conn: &mut dyn Connection, proto: &mut P) {
    while let Some(op) = proto.next_op() {
        if let Op::Deregister { region } = op {
            if let Err(e) = conn.deregister(region) {
                tracing::debug!(?region, error = %e, "revoking a region after close failed");
            }
        }
    }
}

/// A driver's one timer, re-armed lazily: only when the state machine's next timeout comes
/// earlier than the one armed. A timeout that moved later (the keepalive, pushed back by every
/// frame received) lets the armed timer fire early once, and it is re-armed then: timer-wheel
/// work and the Sleep's poll happen about once per timeout, not once per call.
///
/// The state machine is asked for its next timeout only when it may have come earlier than the
/// timer: a timeout added earlier than the one armed ([`ProtoEnd::take_added_timeout`]: a call's
/// deadline, a READ's, a done report's), the timer fired, or the driver says so
/// ([`Timer::stale`], at shutdown). Nothing else makes it earlier: a call that ends removes a
/// deadline, a frame received pushes the keepalive back. So the rounds of a busy connection (a
/// call started every round, each with the same timeout, later than the one armed) and every
/// round that found nothing to do (every spin of a busy-polling driver) skip the asking, a look
/// through the deadlines and a table lookup.
///
/// The timer waits on the process's timer thread (`timer_thread.rs`), or in the tokio runtime's
/// timer wheel when the configuration asks for it (`timer_thread: false`) or the thread could
/// not be started: a timer in the wheel makes the runtime park with a timeout, which costs every
/// wake-up of the runtime, not just this connection's.
#[derive(Debug)]
pub(crate) struct Timer {
    wait: Wait,
    /// When the timer is set to fire (its waker registered); `None`: not armed.
    armed: Option<tokio::time::Instant>,
    /// The state machine has not changed since its next timeout was last taken and armed for
    /// (and the timer has not fired since).
    current: bool,
}

/// Where a [`Timer`] waits.
#[derive(Debug)]
enum Wait {
    Thread(Alarm),
    Runtime(Pin<Box<Sleep>>),
}

impl Timer {
    /// A timer on the timer thread if `on_thread` (and the thread runs), else in the runtime's
    /// timer wheel.
    pub(crate) fn new(on_thread: bool) -> Self {
        let wait = match on_thread.then(Alarm::new).flatten() {
            Some(alarm) => Wait::Thread(alarm),
            None => Wait::Runtime(Box::pin(tokio::time::sleep(std::time::Duration::ZERO))),
        };
        Timer { wait, armed: None, current: false }
    }

    /// Whether the armed timer fired.
    fn fired(&self) -> bool {
        match &self.wait {
            Wait::Thread(alarm) => alarm.fired(),
            Wait::Runtime(sleep) => sleep.is_elapsed(),
        }
    }

    /// Arms the timer for `at`, to wake `cx`'s waker; `Ready` (nothing armed) if `at` has
    /// passed.
    fn arm(&mut self, at: tokio::time::Instant, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.wait {
            Wait::Thread(alarm) => alarm.arm(at.into_std(), cx.waker()),
            Wait::Runtime(sleep) => {
                sleep.as_mut().reset(at);
                sleep.as_mut().poll(cx)
            }
        }
    }

    /// The state machine may have changed: its next timeout is taken again at the next
    /// [`drive_timers`].
    #[inline]
    pub(crate) fn stale(&mut self) {
        self.current = false;
    }
}

/// Whether a driver may end a poll after the round that did its work ([`settle`]): where arming
/// the transport is a look at a queue in memory (tcp, mem: [`ConnInfo::idle_poll_is_costly`] is
/// `false`). Over verbs [`Connection::arm`] never arms (its arming is the empty poll), so the
/// looks are not made at all (they cost a verbs server ~150 instructions a call for nothing,
/// BENCHMARKS.md, session 61); its drivers run the confirming round, or a caller's pass stops
/// short at its result.
pub(crate) fn settles(info: &ConnInfo) -> bool {
    !info.idle_poll_is_costly
}

/// After a round that did work, where the driver [`settles`] and its own queues hold nothing:
/// whether the next round would find nothing, so that the poll may end without it, armed as
/// that round would leave it. It would when the state machine has no event and nothing to post,
/// `scratch` holds no SEND and no READ destination, and the transport has no completion queued:
/// it is then armed with `cx`'s waker ([`Connection::arm`], what that round's poll would do).
/// The timers are driven here, as that round would drive them (a deadline the round added arms
/// them): if one is due, it runs and the round runs after all (`Ok(false)`). A fatal timeout
/// is the driver's end, as a round's would be.
pub(crate) fn settle<P: ProtoEnd>(
    cx: &mut Context<'_>,
    conn: &mut dyn Connection,
    proto: &mut P,
    timer: &mut Timer,
    scratch: &mut Scratch,
) -> Result<bool, Fatal> {
    if proto.has_events() || proto.has_ops() || !scratch.is_idle() || !conn.arm(cx.waker()) {
        return Ok(false);
    }
    let fired = drive_timers(cx, proto, timer, &mut scratch.clock)?;
    Ok(!fired)
}

/// Runs expired timers (call deadlines, keepalive, READ and done timeouts) and arms the timer
/// for the next one. Returns whether anything expired; a fatal timeout (a silent peer, an
/// overdue READ or done report) is an error.
pub(crate) fn drive_timers<P: ProtoEnd>(
    cx: &mut Context<'_>,
    proto: &mut P,
    timer: &mut Timer,
    clock: &mut Clock,
) -> Result<bool, Fatal> {
    let mut fired = false;
    if let Some(added) = proto.take_added_timeout() {
        if timer.armed.is_none_or(|armed| armed > tokio::time::Instant::from_std(added)) {
            // Earlier than the timer (or the timer is not armed): asked below.
            timer.current = false;
        }
    }
    if timer.armed.is_some() && timer.fired() {
        // It fired: whatever the state machine wants next is armed below.
        timer.armed = None;
        timer.current = false;
    }
    if timer.current {
        // Nothing changed since the timer was armed for the next timeout (or found none).
        return Ok(false);
    }
    loop {
        let Some(at) = proto.timeout() else {
            timer.current = true;
            return Ok(fired);
        };
        let at = tokio::time::Instant::from_std(at);
        if timer.armed.is_some_and(|armed| armed <= at) {
            // Armed no later than needed and not fired yet, so nothing is due: it wakes us in
            // time (perhaps early). The common case; it needs no reading of the clock.
            timer.current = true;
            return Ok(fired);
        }
        let now = clock.now();
        if at <= now {
            proto.expire(now.into_std()).map_err(Fatal::Protocol)?;
            fired = true;
            continue;
        }
        if timer.arm(at, cx).is_pending() {
            timer.armed = Some(at);
            timer.current = true;
            return Ok(fired);
        }
        // Already due (time moved on since the clock was read): run it.
        timer.armed = None;
        clock.advance_to(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_wakers::CountWakes;
    use std::time::Duration;

    /// A state machine with one timeout, counting how often it is asked for it.
    #[derive(Default)]
    struct OneTimeout {
        at: Option<Instant>,
        /// A timeout added since the last look (as the real ones report their deadlines).
        added: Option<Instant>,
        asked: u32,
        expired: u32,
        /// Its expiry is fatal (a silent peer).
        fatal: bool,
        /// It has an event or an operation for its driver.
        events: bool,
        ops: bool,
    }

    impl OneTimeout {
        /// A timeout added at `at`: the next one if it is earlier.
        fn add(&mut self, at: tokio::time::Instant) {
            let at = at.into_std();
            self.at = Some(self.at.map_or(at, |t| t.min(at)));
            self.added = Some(self.added.map_or(at, |t| t.min(at)));
        }
    }

    impl ProtoEnd for OneTimeout {
        fn handle_frame(&mut self, _: Received, _: Instant) -> Result<(), ProtoError> {
            Ok(())
        }
        fn handle_send(&mut self, _: WrId, _: Result<(), String>) -> Result<(), ProtoError> {
            Ok(())
        }
        fn handle_read(&mut self, _: WrId, _: Result<Bytes, ReadError>) {}
        fn handle_registered(&mut self, _: u64, _: Result<RegionDesc, Detail>) {}
        fn next_op(&mut self) -> Option<Op> {
            None
        }
        fn next_op_into(&mut self, _: &mut Vec<(WrId, SendBuf)>) -> Option<Op> {
            None
        }
        fn has_ops(&self) -> bool {
            self.ops
        }
        fn has_events(&self) -> bool {
            self.events
        }
        fn timeout(&mut self) -> Option<Instant> {
            self.asked += 1;
            self.at
        }
        fn take_added_timeout(&mut self) -> Option<Instant> {
            self.added.take()
        }
        fn expire(&mut self, now: Instant) -> Result<(), ProtoError> {
            if self.at.is_some_and(|at| at <= now) {
                self.at = None;
                self.expired += 1;
                if self.fatal {
                    return Err(ProtoError::PeerSilent { idle: Duration::from_secs(30) });
                }
            }
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_timeout_is_taken_again_only_after_an_earlier_one_or_a_firing() {
        lazily_armed_timer(false).await;
    }

    #[tokio::test]
    async fn the_same_on_the_timer_thread_by_the_system_clock() {
        lazily_armed_timer(true).await;
    }

    /// A timer in the runtime's wheel (under the paused clock) or on the timer thread (by the
    /// system clock) is armed only when an earlier timeout comes or it fires.
    async fn lazily_armed_timer(on_thread: bool) {
        let start = tokio::time::Instant::now();
        let mut proto =
            OneTimeout { at: Some((start + Duration::from_secs(60)).into_std()), ..Default::default() };
        let (wakes, waker) = CountWakes::waker();
        let mut cx = Context::from_waker(&waker);
        let (mut timer, mut clock) = (Timer::new(on_thread), Clock::default());
        assert_eq!(matches!(timer.wait, Wait::Thread(_)), on_thread, "the timer waits where asked");
        let mut drive = |proto: &mut OneTimeout, timer: &mut Timer, clock: &mut Clock| {
            drive_timers(&mut cx, proto, timer, clock).expect("no fatal timeout")
        };

        // Armed for the deadline a minute away: the state machine was asked once.
        assert!(!drive(&mut proto, &mut timer, &mut clock));
        assert_eq!((proto.asked, timer.armed), (1, Some(start + Duration::from_secs(60))));
        // Nothing changed: the rounds of a spinning driver do not ask again.
        for _ in 0..10 {
            assert!(!drive(&mut proto, &mut timer, &mut clock));
        }
        assert_eq!(proto.asked, 1);

        // Calls with later deadlines started (the same timeout, a bit later each): the armed
        // timer is early enough, nobody asks.
        for s in 61..70 {
            proto.add(start + Duration::from_secs(s));
            assert!(!drive(&mut proto, &mut timer, &mut clock));
        }
        assert_eq!((proto.asked, timer.armed), (1, Some(start + Duration::from_secs(60))));

        // A call with an earlier deadline started: asked, re-armed. (By the system clock, far
        // enough ahead that a loaded machine arms it before it passes.)
        let lead = Duration::from_millis(if on_thread { 1000 } else { 30 });
        let earlier = tokio::time::Instant::now() + lead;
        proto.add(earlier);
        assert!(!drive(&mut proto, &mut timer, &mut clock));
        assert_eq!((proto.asked, timer.armed), (2, Some(earlier)));
        // The driver can still say so itself (at shutdown): asked again.
        timer.stale();
        assert!(!drive(&mut proto, &mut timer, &mut clock));
        assert_eq!(proto.asked, 3);

        // The deadline passes with nothing changed: the timer fires, wakes the driver, and the
        // next look runs the expiry although nobody called `stale`.
        if on_thread {
            wakes.wait_for(1);
        } else {
            tokio::time::advance(lead + Duration::from_millis(1)).await;
        }
        assert_eq!(wakes.count(), 1, "the armed timer woke the driver");
        assert!(tokio::time::Instant::now() >= earlier, "not before its deadline");
        clock.reset();
        assert!(drive(&mut proto, &mut timer, &mut clock), "the expiry ran");
        assert_eq!((proto.expired, timer.armed), (1, None));
        // Nothing is left to time: no more asking until the next change.
        let asked = proto.asked;
        assert!(!drive(&mut proto, &mut timer, &mut clock));
        assert_eq!(proto.asked, asked);
    }

    /// `settle` over an in-process connection: it arms the connection only when nothing is left
    /// (a state machine's event or operation, a queued completion), takes nothing, runs a due
    /// timeout (the round then runs after all) and ends the driver on a fatal one.
    #[tokio::test(start_paused = true)]
    async fn settle_arms_only_when_nothing_is_left_and_ends_on_a_fatal_timeout() {
        let fabric = rpc_transport::mem::MemFabric::new();
        let params = rpc_transport::ConnParams::default;
        let mut listener = fabric.listen("settle", params()).expect("listen");
        let mut conn = fabric.connect("settle", params()).await.expect("connect");
        let mut peer = listener.accept().await.expect("accept");
        let send = |peer: &mut Box<dyn Connection>| {
            peer.post_send(1, SendBuf::from(Bytes::from_static(b"x"))).expect("send")
        };
        let mut proto = OneTimeout::default();
        let (mut timer, mut scratch) = (Timer::new(false), Scratch::new());
        let (wakes, waker) = CountWakes::waker();
        let mut cx = Context::from_waker(&waker);
        let mut settled = |proto: &mut OneTimeout, conn: &mut Box<dyn Connection>, scratch: &mut Scratch| {
            scratch.clock.reset();
            settle(&mut cx, conn.as_mut(), proto, &mut timer, scratch)
        };
        // Takes whatever the connection has queued, leaving it armed with a waker that counts
        // nothing.
        let drain = |conn: &mut Box<dyn Connection>| {
            let mut out = Vec::new();
            let mut cx = Context::from_waker(std::task::Waker::noop());
            while let Poll::Ready(polled) = conn.poll_completions(&mut cx, &mut out, COMPLETION_BATCH) {
                polled.expect("poll");
                if out.is_empty() {
                    break;
                }
                for completion in out.drain(..) {
                    if let Completion::Recv { buf, .. } = completion {
                        conn.post_recv(buf).expect("repost");
                    }
                }
            }
        };

        // Nothing left: armed with this waker, which the next delivery wakes.
        assert!(settled(&mut proto, &mut conn, &mut scratch).expect("not fatal"));
        assert_eq!(wakes.count(), 0);
        send(&mut peer);
        assert_eq!(wakes.count(), 1, "the delivery woke the settled driver");

        // A completion queued: the round runs, and finds it (`settle` took nothing).
        assert!(!settled(&mut proto, &mut conn, &mut scratch).expect("not fatal"));
        let mut out = Vec::new();
        let polled = conn.poll_completions(&mut Context::from_waker(&waker), &mut out, COMPLETION_BATCH);
        assert!(matches!(polled, Poll::Ready(Ok(()))) && out.len() == 1, "the completion is still queued");
        if let Some(Completion::Recv { buf, .. }) = out.pop() {
            conn.post_recv(buf).expect("repost");
        }
        drain(&mut conn);

        // An event or an operation left: the round runs, and the connection is not armed with
        // this waker (the delivery that follows wakes only the drain's).
        for (events, ops) in [(true, false), (false, true)] {
            proto.events = events;
            proto.ops = ops;
            assert!(!settled(&mut proto, &mut conn, &mut scratch).expect("not fatal"));
            send(&mut peer);
            drain(&mut conn);
        }
        assert_eq!(wakes.count(), 1, "not armed while the state machine had work");
        proto.events = false;
        proto.ops = false;

        // A timeout due: it runs, and so does the round.
        proto.add(tokio::time::Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!settled(&mut proto, &mut conn, &mut scratch).expect("not fatal"));
        assert_eq!(proto.expired, 1);

        // A fatal one due (a silent peer): the driver's end, as a round's would be.
        proto.fatal = true;
        proto.add(tokio::time::Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
        let ended = settled(&mut proto, &mut conn, &mut scratch);
        assert!(matches!(ended, Err(Fatal::Protocol(ProtoError::PeerSilent { .. }))), "{ended:?}");
        assert_eq!(proto.expired, 2);
    }
}

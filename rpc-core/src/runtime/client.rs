//! The client: a cloneable handle to one connection, driven by its own task; optionally
//! reconnecting (with backoff) when the connection is lost.

use parking_lot::{Mutex, MutexGuard, RwLock};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use rpc_transport::{Address, Connection, Detail, MemPool, TransportError};
use std::collections::VecDeque;

use tokio::sync::oneshot;
use tracing::field::Empty;
use tracing::Instrument;

mod call;
mod in_flight;

use super::call_slots::{CallResult, CallSlots};
use super::commands;
use super::config::{CallOptions, ClientConfig, Reconnect};
use super::driver::{self, ConnStats, Fatal, ROUNDS_PER_WAKE};
use super::handshake;
use super::observe::{self, MethodName};
use super::wake_route::Route;
use crate::context::{self, MetadataError, TRACE_ID_KEY};
use crate::error::{CallError, ConnectError, RemoteError};
use crate::proto::{CallFailure, CallInfo, ClientEvent, ClientProto, MethodId, Payload, StartError};

enum Command {
    /// Start call `call_id`, whose slot the caller has taken.
    Call {
        call_id: u64,
        method: MethodId,
        payload: Payload,
        metadata: Bytes,
        /// When the call was made (the stubs: before encoding the arguments).
        started: tokio::time::Instant,
        /// Its deadline, counted from `started`. The caller does not read the clock to send a
        /// call: the driver measures the time left as it starts the call, with its own reading
        /// (one per pass), and does not send a call whose deadline has passed.
        deadline: Option<Duration>,
    },
    Cancel {
        call_id: u64,
    },
    Stats {
        reply: oneshot::Sender<ConnStats>,
    },
}

/// One connection: the queue to its driver, the slots of its calls and its in-flight bound.
struct Conn {
    commands: commands::Sender<Command>,
    /// Shared with the driver, which delivers each result into its call's slot.
    slots: Arc<CallSlots>,
    in_flight: in_flight::InFlight,
    /// The connection's registered memory (payloads are encoded there).
    pool: MemPool,
    /// Largest payload the server takes inline.
    eager_limit: usize,
    /// The bound of `in_flight`: a call holding the only permit taken is alone.
    max_in_flight: usize,
    /// The driver's state, for a call that drives the connection itself (gone with the driver
    /// task). `None`: [`ClientConfig::caller_drives`] is off.
    engine: Option<Weak<Engine>>,
    /// Where the connection's wake-ups go.
    route: Arc<Route>,
}

impl Conn {
    /// Starts call command `cmd` in the calling task when the connection has no other call in
    /// flight and no other task holds its state; gives `cmd` back otherwise (it then goes
    /// through the queue). The caller then drives the connection until its call ends.
    ///
    /// Returns whether the connection is armed for the call: the last pass ended armed (in a
    /// round that found nothing to do, or after one that did its work with nothing left:
    /// [`ClientDriver::settled`]; the transport, the timer and the command queue hold the
    /// route's waker), and starting the call changed nothing a pass would have to arm again (the timer
    /// is armed here for the call's deadline, as a pass would). The caller's first poll then
    /// needs no pass unless a wake-up came meanwhile ([`Route::caller_arm`]).
    fn start_here(&self, cmd: Command) -> Result<bool, Command> {
        // Another call holds a permit: it is in flight (a look at the semaphore, not the lock).
        if self.in_flight.available() + 1 < self.max_in_flight {
            return Err(cmd);
        }
        let Some(engine) = self.engine.as_ref().and_then(Weak::upgrade) else { return Err(cmd) };
        let Some(mut state) = engine.try_state() else { return Err(cmd) };
        // The last pass ended several calls at once: their callers are likely to start as many
        // again in this run of their tasks, and through the queue they leave together (one
        // system call, one wake-up of the peer). Started here, this one would leave alone, ahead
        // of the rest, and the peer would answer it alone too: the calls would go on travelling
        // in two groups, twice the system calls and wake-ups per round on both sides.
        if state.finished || state.closing || state.proto.calls_in_flight() > 0 || state.ended_together > 1 {
            return Err(cmd);
        }
        let was_armed = std::mem::take(&mut state.idle_armed);
        // Its reading of the clock is from its last pass: this call is measured afresh (and
        // the timer armed below takes the same reading).
        state.scratch.clock.reset();
        state.run_command(cmd);
        // The request is posted now, before this task's first pass over the connection.
        let armed = state.post_ready().is_pending() && was_armed && state.arm_timer(&engine.waker);
        if state.finished {
            drop(state);
            // The connection failed: the driver task ends at its next poll.
            self.route.wake_task();
        }
        Ok(armed)
    }

    /// One pass over the connection (the driver's work) by the caller of call `call_id`, which
    /// drives it: what the pass posts, receives and arms wakes this task through the route.
    /// Returns the call's result if the pass ended it (handed over here, not through its slot).
    fn drive(&self, call_id: u64, cx: &mut Context<'_>) -> Option<(CallResult, tokio::time::Instant)> {
        let engine = self.engine.as_ref().and_then(Weak::upgrade)?;
        let mut state = engine.try_lock()?;
        self.route.caller_pass(call_id, cx.waker());
        state.quiet = Some(call_id);
        state.caller_passes += 1;
        let ended = {
            let _in_conn = engine.span.enter();
            state.pass(&mut Context::from_waker(&engine.waker))
        };
        state.quiet = None;
        let answer = state.quiet_answer.take();
        let cut_short = state.cut_short();
        drop(state);
        if cut_short || ended.is_ready() {
            // The pass stopped at this call's result, before the rounds that would have found
            // nothing more and armed the connection; or the connection ended. Either way the
            // driver task runs a pass once this caller stops driving (the rounds, unless
            // another caller drives by then; or its own end).
            self.route.unfinished();
        }
        if ended.is_ready() {
            // The driver task ends at its next poll.
            self.route.wake_task();
        }
        self.route.released();
        answer
    }

    /// The caller's poll of call `call_id`: a pass over the connection first when it drives,
    /// unless the call's start left the connection `armed` ([`Conn::start_here`]) and no
    /// wake-up came since (the first poll only). A pass that ends the call hands its result
    /// over.
    fn poll_call(
        &self,
        call_id: u64,
        driving: bool,
        armed: bool,
        cx: &mut Context<'_>,
    ) -> Poll<(CallResult, tokio::time::Instant)> {
        if driving && !(armed && self.route.caller_arm(call_id, cx.waker())) {
            if let Some(answer) = self.drive(call_id, cx) {
                return Poll::Ready(answer);
            }
        }
        self.slots.poll_result(call_id, cx)
    }
}

/// A connection's driver state, shared by its driver task and, while a call is alone in flight,
/// the task that made it ([`ClientConfig::caller_drives`]). The driver task holds the only
/// strong reference (a caller's pass holds another while it runs): the connection goes when
/// the task ends.
struct Engine {
    state: Mutex<ClientDriver>,
    /// The route's waker: every pass polls the connection, timer and queue with it.
    waker: Waker,
    /// The connection's span, entered by a caller's pass (the driver task runs inside it).
    span: tracing::Span,
    route: Arc<Route>,
}

impl Engine {
    /// The state if no other task holds it now.
    fn try_state(&self) -> Option<MutexGuard<'_, ClientDriver>> {
        self.state.try_lock()
    }

    /// The state for a pass if no other task holds it; `None` (and the holder, at its release,
    /// wakes the route again) if one does.
    fn try_lock(&self) -> Option<MutexGuard<'_, ClientDriver>> {
        self.try_state().or_else(|| {
            // Noted before the second look: a holder that releases after it sees the note.
            self.route.missed();
            self.try_state()
        })
    }
}

/// The connection's driver task: passes over the connection whenever the route wakes it.
struct DriverTask(Arc<Engine>);

impl Future for DriverTask {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let engine = &*self.0;
        if !engine.route.task_pass(cx.waker()) {
            // A caller drives the connection.
            return Poll::Pending;
        }
        // A caller's pass holds the lock for one pass at most, never across an await.
        let mut state = engine.state.lock();
        let ended = state.pass(&mut Context::from_waker(&engine.waker));
        drop(state);
        if ended.is_ready() {
            engine.route.clear();
            return Poll::Ready(());
        }
        engine.route.released();
        Poll::Pending
    }
}

/// Where a client's connection is: fixed for its life, or replaced by the reconnect task.
enum Slot {
    Fixed(Arc<Conn>),
    Reconnecting(Arc<RwLock<Arc<Conn>>>),
}

/// The connection a call goes over: borrowed when it is fixed (no lock, no reference count).
enum ConnRef<'a> {
    Fixed(&'a Conn),
    Current(Arc<Conn>),
}

impl std::ops::Deref for ConnRef<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        match self {
            ConnRef::Fixed(c) => c,
            ConnRef::Current(c) => c,
        }
    }
}

struct Shared {
    /// The connection calls go over.
    slot: Slot,
    default_deadline: Option<Duration>,
    peer: String,
    reconnecting: bool,
    /// Dropped with the last handle: stops the reconnect task.
    _stop_reconnecting: Option<oneshot::Sender<()>>,
}

/// A handle to one client connection. Cheap to clone, `Send + Sync`; all clones share the
/// connection. The connection closes when the last clone is dropped.
///
/// With [`ClientConfig::reconnect`] set, a lost connection is replaced in the background
/// (exponential backoff, each attempt bounded by [`ClientConfig::connect_timeout`]); meanwhile
/// calls fail at once with [`CallError::NotConnected`]. **No call is ever retried**: a call in
/// progress when the connection is lost fails with [`CallError::Disconnected`], which means it
/// may or may not have run at the server; retry it yourself if the method is idempotent.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("peer", &self.shared.peer).finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to `addr` (`tcp://127.0.0.1:7000`, `mem://name`, `rdma://10.0.2.15:7471`) and
    /// spawns the connection's driver on the current tokio runtime. Connecting is bounded by
    /// [`ClientConfig::connect_timeout`]. With [`ClientConfig::reconnect`] set, a reconnect task
    /// is spawned too (this first connection must succeed, though).
    pub async fn connect(addr: &str, config: ClientConfig) -> Result<Client, ConnectError> {
        let addr: Address = addr.parse()?;
        let (conn, done, peer) = open(&addr, &config).await?;
        let (slot, stop) = match config.reconnect {
            None => (Slot::Fixed(conn), None),
            Some(policy) => {
                let current = Arc::new(RwLock::new(conn));
                let (stop, stopped) = oneshot::channel();
                let task = reconnect(addr, config.clone(), policy, current.clone(), done, stopped);
                tokio::spawn(task.instrument(tracing::info_span!("reconnect", peer = %peer)));
                (Slot::Reconnecting(current), Some(stop))
            }
        };
        let shared = Shared {
            slot,
            default_deadline: config.default_deadline,
            peer,
            reconnecting: config.reconnect.is_some(),
            _stop_reconnecting: stop,
        };
        Ok(Client { shared: Arc::new(shared) })
    }

    fn conn(&self) -> ConnRef<'_> {
        match &self.shared.slot {
            Slot::Fixed(conn) => ConnRef::Fixed(conn),
            Slot::Reconnecting(current) => ConnRef::Current(current.read().clone()),
        }
    }

    /// The current connection's registered memory: encode payloads here
    /// ([`crate::codec::encode_in`]) and the transport sends or advertises them as they are.
    pub fn pool(&self) -> MemPool {
        self.conn().pool.clone()
    }

    /// Where the generated stubs encode a request: the current connection's pool, and the
    /// largest payload it sends inline.
    pub(crate) fn request_memory(&self) -> (MemPool, usize) {
        let conn = self.conn();
        (conn.pool.clone(), conn.eager_limit)
    }

    /// Whether the connection is up (a reconnecting client may be between connections).
    pub fn is_connected(&self) -> bool {
        !self.conn().commands.is_closed()
    }

    /// Calls `method` with an encoded payload; returns the encoded response. Generated stubs
    /// call this; use it directly for dynamic calls.
    ///
    /// A response of more than 1 KiB is handed on where it landed (its receive buffer or READ
    /// destination, held until the `Bytes` drops); a smaller one is the copy made as its message
    /// arrived, in a small block shared by such copies (its receive buffer was posted again at
    /// once; as with [`SharedBytes`](crate::codec::SharedBytes)).
    pub async fn call(
        &self,
        method: MethodId,
        payload: Bytes,
        opts: &CallOptions,
    ) -> Result<Bytes, CallError> {
        self.call_with_info(method, payload, opts).await.map(|(bytes, _)| bytes)
    }

    /// Like [`Client::call`], and tells which path (eager or rendezvous) each direction took.
    /// The deadline counts from this call.
    pub async fn call_with_info(
        &self,
        method: MethodId,
        payload: Bytes,
        opts: &CallOptions,
    ) -> Result<(Bytes, CallInfo), CallError> {
        let name = MethodName::Id(method);
        self.call_since(tokio::time::Instant::now(), method, name, Payload::Bytes(payload), opts)
            .await
            .map(|(response, info)| (crate::codec::received_bytes(response), info))
    }

    /// The error of a call that found the connection closed (and was not sent).
    fn not_connected(&self) -> CallError {
        if self.shared.reconnecting {
            CallError::NotConnected(format!("connection to {} lost; reconnecting", self.shared.peer).into())
        } else {
            CallError::Disconnected("connection closed".into())
        }
    }

    /// Counters of this connection (of the current one, for a reconnecting client).
    pub async fn stats(&self) -> Result<ConnStats, CallError> {
        let (reply, rx) = oneshot::channel();
        let closed = || CallError::Disconnected("connection closed".into());
        self.conn().commands.send(Command::Stats { reply }).map_err(|_| closed())?;
        rx.await.map_err(|_| closed())
    }

    /// The peer, for logs.
    pub fn peer(&self) -> &str {
        &self.shared.peer
    }
}

/// The call's metadata, encoded, with a trace id added when the call is traced (its span is
/// enabled) or made inside a handler whose call carried one; the caller's own is kept.
fn metadata_with_trace(opts: &CallOptions, span: &tracing::Span) -> Result<Bytes, CallError> {
    if let Some(trace) = opts.metadata.get(TRACE_ID_KEY) {
        span.record("trace_id", tracing::field::display(trace));
        return Ok(opts.metadata.encode());
    }
    let inherited = context::current().and_then(|ctx| ctx.trace_id().map(str::to_owned));
    let trace = match inherited {
        Some(t) => t,
        None if is_recorded(span) => context::new_trace_id(),
        None => return Ok(opts.metadata.encode()),
    };
    let mut metadata = opts.metadata.clone();
    match metadata.insert(TRACE_ID_KEY, trace.as_str()) {
        Ok(()) => {
            span.record("trace_id", tracing::field::display(&trace));
            Ok(metadata.encode())
        }
        // No room left for the trace id: the caller's metadata goes as it is.
        Err(MetadataError::TooManyEntries { .. } | MetadataError::TooLarge { .. }) => {
            Ok(opts.metadata.encode())
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether a subscriber records `span` (not merely a callsite another thread's subscriber
/// enabled).
fn is_recorded(span: &tracing::Span) -> bool {
    let enabled = |meta| tracing::dispatcher::get_default(|d| d.enabled(meta));
    !span.is_disabled() && span.metadata().is_some_and(enabled)
}

/// Connects once (bounded by the connect timeout) and starts the connection's driver. Returns
/// the connection, a receiver that resolves when the driver stops, and the peer's address.
async fn open(
    addr: &Address,
    config: &ClientConfig,
) -> Result<(Arc<Conn>, oneshot::Receiver<()>, String), ConnectError> {
    let connecting =
        rpc_transport::connect(addr, handshake::conn_params(&config.proto, &config.rdma, &config.tcp));
    let conn = tokio::time::timeout(config.connect_timeout, connecting)
        .await
        .map_err(|_| ConnectError::Timeout(config.connect_timeout))??;
    let peer = handshake::peer_limits(conn.as_ref())?;
    let info = conn.info().clone();
    let pool = conn.pool().clone();
    let span = tracing::info_span!("conn", role = "client", peer = %info.peer, backend = info.backend);
    let (commands, rx) = commands::queue();
    let slots = Arc::new(CallSlots::default());
    let proto = ClientProto::new(&config.proto, &peer, driver::now())
        .with_pool(pool.clone())
        .with_copied_sends(info.copied_sends);
    let eager_limit = proto.eager_limit();
    let route = Arc::new(Route::default());
    let driver = ClientDriver {
        proto,
        conn,
        commands: rx,
        taken: VecDeque::with_capacity(driver::COMPLETION_BATCH),
        commands_armed: false,
        slots: slots.clone(),
        wakers: Vec::new(),
        scratch: driver::Scratch::new(),
        sleep: driver::Timer::new(config.timer_thread),
        closing: false,
        finished: false,
        quiet: None,
        quiet_answer: None,
        idle_armed: false,
        settles: driver::settles(&info),
        route: route.clone(),
        caller_passes: 0,
        ended_together: 0,
        ended_in_pass: false,
        answered_quiet: false,
        held_sends: false,
    };
    let engine = Arc::new(Engine {
        state: Mutex::new(driver),
        waker: route.waker(),
        span: span.clone(),
        route: route.clone(),
    });
    let weak = config.caller_drives.then(|| Arc::downgrade(&engine));
    let (done_tx, done) = oneshot::channel::<()>();
    let task = async move {
        DriverTask(engine).await;
        drop(done_tx);
    };
    tokio::spawn(task.instrument(span));
    let max_in_flight = config.proto.max_in_flight as usize;
    let in_flight = in_flight::InFlight::new(max_in_flight);
    let conn = Conn { commands, slots, in_flight, pool, eager_limit, max_in_flight, engine: weak, route };
    Ok((Arc::new(conn), done, info.peer))
}

/// Replaces the connection in `current` each time its driver stops, trying again with
/// exponential backoff; ends when `stop` resolves (the last client handle was dropped).
async fn reconnect(
    addr: Address,
    config: ClientConfig,
    policy: Reconnect,
    current: Arc<RwLock<Arc<Conn>>>,
    mut done: oneshot::Receiver<()>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = &mut done => {}
        }
        tracing::info!("connection lost; reconnecting");
        let mut backoff = policy.initial_backoff;
        loop {
            tokio::select! {
                _ = &mut stop => return,
                opened = open(&addr, &config) => match opened {
                    Ok((conn, next_done, _)) => {
                        *current.write() = conn;
                        done = next_done;
                        tracing::info!("reconnected");
                        break;
                    }
                    Err(e) => tracing::debug!(error = %e, retry_in = ?backoff, "reconnect failed"),
                },
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = backoff.saturating_mul(2).min(policy.max_backoff.max(policy.initial_backoff));
        }
    }
}

/// A client connection and its state machine: what its driver task (or a caller driving it)
/// works on.
struct ClientDriver {
    proto: ClientProto,
    conn: Box<dyn Connection>,
    commands: commands::Receiver<Command>,
    /// Commands taken from the queue in one look, run in order.
    taken: VecDeque<Command>,
    /// The command queue's last look found it empty and left the route's waker with it, and
    /// nothing was taken since: a command sent since sets its flag (and wakes the route), so a
    /// look at the flag is enough. Kept from one pass to the next, whichever task runs it: every
    /// pass polls the queue with the route's waker ([`Engine::waker`]), so the waker the queue
    /// holds is always the one a pass would leave.
    commands_armed: bool,
    /// Where results go: the slot of each call (the proto knows which calls are in progress).
    slots: Arc<CallSlots>,
    /// The callers a batch of results wakes (kept from one batch to the next).
    wakers: Vec<Waker>,
    scratch: driver::Scratch,
    sleep: driver::Timer,
    closing: bool,
    /// The driver has ended (failed or closed): every further pass returns at once.
    finished: bool,
    /// The call whose caller runs this pass: its result is delivered without waking it (it
    /// takes it from `quiet_answer` after the pass).
    quiet: Option<u64>,
    /// The result of the `quiet` call, if this pass ended it.
    quiet_answer: Option<(CallResult, tokio::time::Instant)>,
    /// The last pass ended armed, in a round that found nothing to do or after one that left
    /// nothing to do ([`ClientDriver::settled`]): the transport, the timer and the command
    /// queue hold the route's waker, and nothing ran on this state since (cleared
    /// when a pass begins and by [`Conn::start_here`], which takes it).
    idle_armed: bool,
    /// Whether a pass may end after the round that did its work ([`driver::settles`],
    /// [`ClientDriver::settled`]: tcp, mem), the caller arming the connection itself at the end
    /// of the round that took its answer (a look at a queue in memory), which spares the driver
    /// task a wake-up and a pass per call. Where it may not (verbs, whose confirming rounds cost
    /// a system call), a caller's pass stops short at its result instead
    /// ([`ClientDriver::cut_short`]).
    settles: bool,
    /// The connection's wake-up route (it counts the driver task's polls, for [`ConnStats`]).
    route: Arc<Route>,
    /// Passes run by callers driving the connection (for [`ConnStats`]).
    caller_passes: u64,
    /// Calls ended (their results delivered) by the latest pass that ended any. More than one:
    /// the next call goes through the queue even if it is alone in flight ([`Conn::start_here`]).
    ended_together: usize,
    /// The current pass has ended a call: `ended_together` counts this pass's.
    ended_in_pass: bool,
    /// The current pass, a caller's, has delivered that caller's result: the receive the answer
    /// came in waits until the caller's next request is out (see [`ClientDriver::poll_round`]).
    answered_quiet: bool,
    /// The last round held its SENDs back for the callers it woke (see [`ClientDriver::poll_round`]):
    /// the pass ends there and the task comes back. The next round posts whatever it has.
    held_sends: bool,
}

impl ClientDriver {
    /// Takes commands from the handles (a batch at a time, in one lock) and runs them. Returns
    /// whether any was taken. While the queue is armed ([`ClientDriver::commands_armed`]: an
    /// earlier look, in this pass or an earlier one, found it empty and left the route's waker
    /// with it), a look at its flag is enough.
    fn poll_commands(&mut self, cx: &mut Context<'_>) -> bool {
        match self.commands.poll_take(cx, driver::COMPLETION_BATCH, &mut self.taken, self.commands_armed) {
            Poll::Ready(true) => {
                self.commands_armed = false;
                while let Some(cmd) = self.taken.pop_front() {
                    self.run_command(cmd);
                }
                true
            }
            Poll::Ready(false) => {
                self.closing = true;
                false
            }
            Poll::Pending => {
                self.commands_armed = true;
                false
            }
        }
    }

    fn run_command(&mut self, cmd: Command) {
        // A call started adds a deadline, which the timer hears of (see `Timer`).
        match cmd {
            Command::Call { call_id, method, payload, metadata, started, deadline } => {
                // A deadline is measured with this pass's reading of the clock: the time the call
                // took to encode and to get here counts against it. A call without one needs no
                // reading: it starts when it was made.
                let (timeout, now) = match deadline {
                    None => (None, started),
                    Some(deadline) => {
                        let now = self.scratch.clock.now();
                        match deadline.checked_sub(now.saturating_duration_since(started)) {
                            Some(left) if !left.is_zero() => (Some(left), now),
                            _ => {
                                // Passed before it was sent: it is not sent.
                                self.slots.complete(call_id, Err(CallError::DeadlineExceeded), now);
                                return;
                            }
                        }
                    }
                };
                if let Err(e) = self.proto.start(call_id, method, payload, metadata, timeout, now.into_std())
                {
                    self.slots.complete(call_id, Err(start_error(e)), now);
                }
            }
            Command::Cancel { call_id } => {
                if self.proto.cancel(call_id) {
                    tracing::debug!(call_id, "call cancelled by the caller");
                }
            }
            Command::Stats { reply } => {
                let _ = reply.send(ConnStats {
                    proto: self.proto.stats(),
                    transport: self.conn.counters(),
                    calls_in_flight: self.proto.calls_in_flight(),
                    driver_polls: self.route.task_polls(),
                    caller_passes: self.caller_passes,
                    handlers_inline: 0,
                    handlers_spawned: 0,
                    inline_stalls: 0,
                    handler_boxes: 0,
                });
            }
        }
    }

    fn deliver_events(&mut self) {
        let Some(mut event) = self.proto.poll_event() else { return };
        // The batch's results go into their slots under one lock; their callers are woken
        // when it is released.
        let mut wakers = std::mem::take(&mut self.wakers);
        let mut slots = self.slots.completer(&mut wakers);
        loop {
            let ClientEvent::Completed { call_id, result, info } = event;
            // This wake-up's reading (taken already to handle the response that ended the call).
            let at = self.scratch.clock.now();
            // A caller that has gone (its cancel not yet taken) gets nothing; the one running
            // this pass gets its result handed over when the pass ends (its slot is freed here:
            // no second look at it).
            let result = result.map(|b| (b, info)).map_err(call_error);
            if self.quiet == Some(call_id) {
                self.answered_quiet = true;
                if slots.take(call_id) {
                    self.quiet_answer = Some((result, at));
                }
            } else {
                slots.complete(call_id, result, at);
            }
            if !std::mem::replace(&mut self.ended_in_pass, true) {
                self.ended_together = 0;
            }
            self.ended_together += 1;
            match self.proto.poll_event() {
                Some(next) => event = next,
                None => break,
            }
        }
        drop(slots);
        self.wakers = wakers;
    }

    fn fail(&mut self, fatal: Fatal) {
        // The server closing an idle connection (its graceful shutdown does that) is no failure.
        let calls = self.proto.calls_in_flight();
        if matches!(fatal, Fatal::Transport(TransportError::Disconnected(_))) && calls == 0 {
            tracing::debug!(reason = %fatal, "connection closed by the peer");
        } else {
            tracing::warn!(error = %fatal, calls, "connection failed");
        }
        self.conn.close();
        let reason = fatal.into_detail();
        self.proto.fail_all(reason.clone());
        driver::revoke_after_close(self.conn.as_mut(), &mut self.proto);
        self.deliver_events();
        // Calls whose command was not taken yet fail the same way.
        self.slots.close(reason);
    }

    /// One round of work. Timers are driven when nothing else progressed (the round before the
    /// driver waits), when `last` (before it yields) or when the round holds its SENDs (the
    /// pass then ends: see [`ClientDriver::hold_sends`]), so that they are armed whenever it
    /// stops, but not looked at in every busy round.
    fn poll_round(&mut self, cx: &mut Context<'_>, last: bool) -> Result<bool, Fatal> {
        let took = self.poll_commands(cx);
        let mut progressed = took;
        progressed |= driver::poll_completions(cx, self.conn.as_mut(), &mut self.proto, &mut self.scratch)?;
        // A round that holds its SENDs ends the pass: timers are armed before it stops.
        let hold = self.hold_sends(took);
        if !progressed || last || hold {
            progressed |=
                driver::drive_timers(cx, &mut self.proto, &mut self.sleep, &mut self.scratch.clock)?;
        }
        if hold {
            // Calls ended in this round and their callers, woken now, are likely to start more
            // at once (a pipelining caller keeps its calls in flight): what this round would
            // send without having taken a command (requests that waited for credits the
            // answers brought, a credit frame) waits for them, once. The pass ends here and the
            // task comes back after the callers, whose requests then leave in the same batch
            // (one system call, one wake-up of the peer) instead of just behind it. The cost: a
            // held SEND waits for one turn of the tasks this round woke (over tcp at 64 calls in
            // flight: half the write system calls, +19% calls/s; see BENCHMARKS.md).
            self.deliver_events();
            self.held_sends = true;
            driver::flush_repost(self.conn.as_mut(), &mut self.scratch)?;
            return Ok(true);
        }
        self.held_sends = false;
        progressed |= driver::post_ops(self.conn.as_mut(), &mut self.proto, &mut self.scratch)?;
        self.deliver_events();
        if !self.answered_quiet {
            // A caller whose answer came in this pass gets it first: the receive it came in is
            // replaced after its next request is out (`post_ready`), or by the next pass
            // (whichever task runs it) that handles a message or posts. Until then the spare
            // receive stands in for it (`proto::SPARE_RECEIVES`), so a SEND still never meets an
            // empty receive queue. Where the caller arms the connection itself at the end of
            // the pass (tcp, mem), that keeps the re-post off the way from the answer to the
            // next request as well: work a side does after its message is out overlaps the
            // peer's.
            driver::flush_repost(self.conn.as_mut(), &mut self.scratch)?;
        }
        Ok(progressed)
    }
}

impl ClientDriver {
    /// Whether the current (or just ended) pass stops once the result of the `quiet` call is
    /// delivered (its caller waits for nothing else), without the rounds that would confirm
    /// there is nothing more: where the pass does not settle instead ([`ClientDriver::settles`]).
    fn cut_short(&self) -> bool {
        self.answered_quiet && !self.settles
    }

    /// After a round that did work: whether the next would find nothing, so that the pass may
    /// end without it, armed as that round would leave it ([`driver::settle`], where the
    /// connection [`driver::settles`]). Besides what that checks, the command queue is armed and
    /// nothing was sent on it since. Not while closing (each round checks for the end). Over tcp
    /// and mem, a caller's pass spared that round: ~0.5% of a 32 B call's instructions, on the
    /// way from the answer to the next request (BENCHMARKS.md).
    fn settled(&mut self, cx: &mut Context<'_>) -> Result<bool, Fatal> {
        if !self.settles || self.closing || !self.commands_armed || self.commands.may_have_news() {
            return Ok(false);
        }
        driver::settle(cx, self.conn.as_mut(), &mut self.proto, &mut self.sleep, &mut self.scratch)
    }

    /// Whether this round holds its SENDs back ([`ClientDriver::poll_round`]): it took no
    /// command, it has SENDs and results for callers other than the one running the pass (the
    /// driver task's pass only), and the round before did not hold already.
    fn hold_sends(&self, took_commands: bool) -> bool {
        !took_commands
            && !self.held_sends
            && self.quiet.is_none()
            && !self.closing
            && self.proto.has_events()
            && self.proto.has_ops()
    }
}

impl Drop for ClientDriver {
    /// However the driver ends (failed, closed, or dropped with its runtime), a call still
    /// waiting fails rather than waits forever, and no call starts on this connection any more.
    fn drop(&mut self) {
        self.slots.close("connection driver stopped".into());
    }
}

impl ClientDriver {
    /// One pass: rounds of work until nothing progresses (`Pending`; `cx`'s waker, the route's,
    /// is registered wherever the driver waits) or the driver ends (`Ready`: failed, or closed
    /// after the last handle went).
    fn pass(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.finished {
            return Poll::Ready(());
        }
        self.scratch.clock.reset();
        self.idle_armed = false;
        self.ended_in_pass = false;
        self.answered_quiet = false;
        for round in 1..=ROUNDS_PER_WAKE {
            match self.poll_round(cx, round == ROUNDS_PER_WAKE) {
                Err(fatal) => return self.end(fatal),
                // The last handle is gone: close once the cancels and done reports are out and
                // the server has reported our regions READ (bounded by the done timeout).
                Ok(_) if self.closing && self.proto.is_idle() => {
                    tracing::debug!("last client handle dropped; closing");
                    self.conn.close();
                    self.finished = true;
                    return Poll::Ready(());
                }
                // The caller running this pass has its result: it need not wait for the rest.
                Ok(true) if self.cut_short() => return Poll::Pending,
                // SENDs held for the callers just woken: come back after them.
                Ok(true) if self.held_sends => {
                    wake_after_others(cx);
                    return Poll::Pending;
                }
                Ok(true) => match self.settled(cx) {
                    // The next round would find nothing: the pass ends armed, as after it.
                    Ok(true) => {
                        self.idle_armed = true;
                        return Poll::Pending;
                    }
                    Ok(false) => continue,
                    Err(fatal) => return self.end(fatal),
                },
                Ok(false) => {
                    self.idle_armed = true;
                    return Poll::Pending;
                }
            }
        }
        // Work remains: yield to other tasks, then come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl ClientDriver {
    /// Posts what the state machine has ready (the request of a call just started in its
    /// caller's task: it leaves before the connection is looked at, whose arming is a system
    /// call on rdma). `Ready`: the driver has ended.
    fn post_ready(&mut self) -> Poll<()> {
        if self.finished {
            return Poll::Ready(());
        }
        let posted = driver::post_ops(self.conn.as_mut(), &mut self.proto, &mut self.scratch)
            .and_then(|_| driver::flush_repost(self.conn.as_mut(), &mut self.scratch));
        match posted {
            Ok(()) => Poll::Pending,
            Err(fatal) => self.end(fatal),
        }
    }

    /// Arms the timer for the state machine's next timeout (a call just started), polled with
    /// the route's `waker` as a pass polls it, with the clock reading the call was started
    /// with. Returns whether that was all: `false` when a timeout was already due (its events
    /// wait for a pass) or fatal (the driver has ended).
    fn arm_timer(&mut self, waker: &Waker) -> bool {
        let cx = &mut Context::from_waker(waker);
        match driver::drive_timers(cx, &mut self.proto, &mut self.sleep, &mut self.scratch.clock) {
            Ok(fired) => !fired,
            Err(fatal) => {
                let _ = self.end(fatal);
                false
            }
        }
    }

    /// The driver ends on `fatal`: every call fails with it.
    fn end(&mut self, fatal: Fatal) -> Poll<()> {
        self.fail(fatal);
        self.finished = true;
        Poll::Ready(())
    }
}

/// Wakes `cx`'s task once the tasks woken so far have run, and the future a runtime's
/// `block_on` drives too: tokio defers the wake-up of a task that yields until then, where a
/// plain wake-up would run the task before that future (tokio's current-thread scheduler polls
/// it once per batch of tasks).
fn wake_after_others(cx: &mut Context<'_>) {
    let mut yielding = std::pin::pin!(tokio::task::yield_now());
    // Its first poll defers the wake-up and is pending; dropping it then cancels nothing.
    let _ = yielding.as_mut().poll(cx);
}

fn start_error(e: StartError) -> CallError {
    match e {
        StartError::TooLarge { len, max } => CallError::PayloadTooLarge { len, max },
        StartError::MetadataTooLarge { len, max } => {
            CallError::Metadata(crate::context::MetadataError::TooLarge { bytes: len, max })
        }
        other => CallError::Protocol(Detail::from_error(other)),
    }
}

fn call_error(f: CallFailure) -> CallError {
    match f {
        CallFailure::Remote(w) => RemoteError::from(w).into(),
        CallFailure::DeadlineExceeded => CallError::DeadlineExceeded,
        CallFailure::ReadFailed(e) => CallError::Transfer(Detail::caused_by("reading the response", e)),
        CallFailure::TooLarge { len, max } => CallError::PayloadTooLarge { len, max },
        CallFailure::RegisterFailed(e) => CallError::Transfer(e.context("registering the request")),
        CallFailure::Disconnected(r) => CallError::Disconnected(r),
    }
}

//! The server: accepts connections, runs one driver task per connection, runs handlers
//! concurrently (bounded), and shuts down gracefully.

use parking_lot::Mutex;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use rpc_transport::{Address, Connection, Listener, Received};
use tokio::sync::{mpsc, watch, AcquireError, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::config::{InlineHandlers, ServerConfig};
use super::driver::{self, ConnStats, Fatal, ROUNDS_PER_WAKE};
use super::handler_tasks::{HandlerTask, HandlerTasks, Job};
use super::handshake;
use super::observe::{self, ServerMethod, ServerOutcome};
use crate::context::{self, Metadata};
use crate::error::ConnectError;
use crate::future_slot::{Caught, HandlerBoxes, ServiceFuture};
use crate::proto::{
    CancelReason, MethodId, Path, ServerEvent, ServerProto, SharedBudget, WireError, WireErrorCode,
};
use crate::service::Service;

/// A running server. Dropping it stops accepting and aborts its connections; call
/// [`Server::shutdown`] to drain calls in progress first.
pub struct Server {
    local_addr: Address,
    board: Arc<StatsBoard>,
    resources: Arc<Resources>,
    shutdown: watch::Sender<bool>,
    accept_task: Option<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

impl Server {
    /// Binds `addr` and serves `service` on every connection accepted there.
    pub async fn bind<S: Service>(
        addr: &str,
        config: ServerConfig,
        service: S,
    ) -> Result<Server, ConnectError> {
        let addr: Address = addr.parse()?;
        let listener = rpc_transport::listen(&addr, handshake::listen_params(&config)).await?;
        Ok(Server::serve(listener, config, service))
    }

    /// Serves `service` on the connections `listener` accepts (set up with this crate's
    /// parameters, e.g. by [`Server::bind`]).
    pub fn serve<S: Service>(listener: Box<dyn Listener>, config: ServerConfig, service: S) -> Server {
        let local_addr = listener.local_addr();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let span = tracing::info_span!("server", service = service.name(), addr = %local_addr);
        let board = Arc::new(StatsBoard::default());
        let resources = Arc::new(Resources {
            budget: SharedBudget::new(config.max_rendezvous_bytes),
            ..Resources::default()
        });
        // Whether a method's handlers are polled first in the driver is settled here, once.
        let inline = |marked| match config.inline_handlers {
            InlineHandlers::Never => false,
            InlineHandlers::Marked => marked,
            InlineHandlers::Always => true,
        };
        let mut methods: Vec<_> = service
            .methods()
            .iter()
            .map(|m| (m.id, ServerMethod::new(m.full_name, inline(m.inline))))
            .collect();
        methods.sort_unstable_by_key(|(id, _)| *id);
        let unknown = ServerMethod::new("unknown", inline(false));
        let names = Arc::new(MethodTable { methods, unknown });
        let acceptor = Acceptor {
            listener,
            board: board.clone(),
            resources: resources.clone(),
            names,
            service: Arc::new(service),
            handler_slots: Arc::new(Semaphore::new(config.max_concurrent_handlers)),
            config,
            shutdown: shutdown_rx,
        };
        let accept_task = tokio::spawn(acceptor.run().instrument(span));
        Server { local_addr, board, resources, shutdown, accept_task: Some(accept_task) }
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> &Address {
        &self.local_addr
    }

    /// Counters of every connection this server has had (open and closed), summed.
    pub fn stats(&self) -> ConnStats {
        self.board.total()
    }

    /// What the server holds now against its limits.
    pub fn resources(&self) -> ServerResources {
        let r = &self.resources;
        ServerResources {
            open_connections: r.open_connections.load(Ordering::Relaxed),
            handlers_running: r.handlers_running.load(Ordering::Relaxed),
            requests_waiting: r.requests_waiting.load(Ordering::Relaxed) as usize,
            rendezvous_bytes_held: r.budget.held(),
            rendezvous_bytes_peak: r.budget.peak(),
        }
    }

    /// Stops accepting, lets calls in progress finish (new calls on open connections are
    /// answered `ShuttingDown`), closes every connection, and returns when all is done or
    /// `shutdown_timeout` has passed (then what remains is aborted).
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.accept_task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = self.accept_task.take() {
            task.abort();
        }
    }
}

/// What a server holds now against its limits ([`Server::resources`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerResources {
    /// Connections open (at most `max_connections`).
    pub open_connections: usize,
    /// Handlers running in tasks (at most `max_concurrent_handlers`). A handler that finishes in
    /// its first poll, inline in its connection's driver ([`ServerConfig::inline_handlers`]),
    /// never becomes a task and is not counted.
    pub handlers_running: usize,
    /// Requests received and waiting for a handler slot or for rendezvous budget (updated once
    /// per round of each connection's driver).
    pub requests_waiting: usize,
    /// Rendezvous bytes held over all connections (bounded by `max_rendezvous_bytes`, plus
    /// one payload that proceeds alone).
    pub rendezvous_bytes_held: u64,
    /// The most rendezvous bytes held at once since the server started.
    pub rendezvous_bytes_peak: u64,
}

/// The server-wide resources every connection draws on.
#[derive(Debug)]
struct Resources {
    budget: Arc<SharedBudget>,
    open_connections: AtomicUsize,
    handlers_running: AtomicUsize,
    requests_waiting: AtomicU64,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            budget: SharedBudget::new(u64::MAX),
            open_connections: AtomicUsize::new(0),
            handlers_running: AtomicUsize::new(0),
            requests_waiting: AtomicU64::new(0),
        }
    }
}

/// Counts one open connection while it lives.
struct OpenConnection(Arc<Resources>);

impl OpenConnection {
    fn new(resources: Arc<Resources>) -> Self {
        resources.open_connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(resources)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A running handler's server-wide slot; given back when its handler ends or is aborted.
pub(super) struct HandlerSlot {
    _permit: OwnedSemaphorePermit,
    resources: Arc<Resources>,
}

#[cfg(test)]
impl HandlerSlot {
    /// A slot of `slots`, counted in a server's resources of its own (for tests of the tasks
    /// handlers run in).
    pub(super) fn for_test(slots: &Arc<Semaphore>) -> HandlerSlot {
        let resources = Arc::new(Resources::default());
        resources.handlers_running.fetch_add(1, Ordering::Relaxed);
        let permit = slots.clone().try_acquire_owned().expect("a free slot");
        HandlerSlot { _permit: permit, resources }
    }
}

impl Drop for HandlerSlot {
    fn drop(&mut self) {
        self.resources.handlers_running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The name and metric handles of each method id the service has, registered at start.
#[derive(Debug)]
struct MethodTable {
    /// Sorted by id (a binary search: no hashing per call).
    methods: Vec<(MethodId, Arc<ServerMethod>)>,
    /// For ids the service does not have.
    unknown: Arc<ServerMethod>,
}

/// Where a method's name and metric handles are in its server's [`MethodTable`]: a call keeps
/// this rather than a reference count on them (no atomic update per call).
#[derive(Debug, Clone, Copy)]
struct MethodIx(Option<u32>);

impl MethodTable {
    fn index(&self, id: MethodId) -> MethodIx {
        MethodIx(self.methods.binary_search_by_key(&id, |(m, _)| *m).ok().and_then(|i| u32::try_from(i).ok()))
    }

    fn get(&self, ix: MethodIx) -> &ServerMethod {
        match ix.0.and_then(|i| self.methods.get(i as usize)) {
            Some((_, m)) => m,
            None => &self.unknown,
        }
    }
}

type MethodNames = Arc<MethodTable>;

struct Acceptor {
    listener: Box<dyn Listener>,
    board: Arc<StatsBoard>,
    resources: Arc<Resources>,
    names: MethodNames,
    service: Arc<dyn Service>,
    handler_slots: Arc<Semaphore>,
    config: ServerConfig,
    shutdown: watch::Receiver<bool>,
}

impl Acceptor {
    async fn run(mut self) {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = self.shutdown.changed() => break,
                // At the connection limit nothing is accepted: new peers wait in the
                // transport's backlog until a connection closes.
                accepted = self.listener.accept(), if connections.len() < self.config.max_connections => match accepted {
                    Ok(conn) => self.start_connection(conn, &mut connections),
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(self.listener);
        let drained = tokio::time::timeout(self.config.shutdown_timeout, async {
            while connections.join_next().await.is_some() {}
        });
        if drained.await.is_err() {
            tracing::warn!(left = connections.len(), "shutdown timeout: aborting connections");
            connections.shutdown().await;
        }
    }

    fn start_connection(&self, conn: Box<dyn Connection>, connections: &mut JoinSet<()>) {
        let info = conn.info().clone();
        let span = tracing::info_span!("conn", role = "server", peer = %info.peer, backend = info.backend);
        let peer = match handshake::peer_limits(conn.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(parent: &span, error = %e, "rejected connection");
                return; // dropping the connection closes it
            }
        };
        let (results_tx, results) = mpsc::unbounded_channel();
        let proto = ServerProto::new(&self.config.proto, &peer, driver::now())
            .with_pool(conn.pool().clone())
            .with_copied_sends(info.copied_sends)
            .with_shared_budget(self.resources.budget.clone())
            .with_default_deadline(self.config.default_deadline);
        let driver = ServerDriver {
            proto,
            conn,
            peer: info.peer.as_str().into(),
            names: self.names.clone(),
            service: self.service.clone(),
            handler_slots: self.handler_slots.clone(),
            slot_wait: None,
            spare_slot: None,
            max_handlers: self.config.max_handlers_per_connection,
            handlers_inline: 0,
            handlers_spawned: 0,
            stalls: InlineStalls::new(self.config.inline_stall, self.names.methods.len()),
            waiting: VecDeque::new(),
            waiting_published: 0,
            resources: self.resources.clone(),
            _open: OpenConnection::new(self.resources.clone()),
            handlers: HashMap::new(),
            tasks: HandlerTasks::new(results_tx),
            estimates: ResponseEstimates::new(self.service.methods()),
            results,
            scratch: driver::Scratch::new(),
            sleep: driver::Timer::new(self.config.timer_thread),
            shutdown: shutdown_signal(self.shutdown.clone()),
            shutdown_flag: self.shutdown.clone(),
            shutdown_waker: None,
            draining: false,
            post_failed: None,
            stats_slot: self.board.slot(),
            polls: 0,
            boxes: HandlerBoxes::default(),
            settles: driver::settles(&info),
        };
        connections.spawn(driver.instrument(span));
    }
}

/// A handler task's call id, its spawn number ([`Running::spawn`]), its answer and its box
/// (empty, for the connection to reuse).
pub(super) type HandlerResult = (u64, u64, Result<Bytes, WireError>, ServiceFuture);

/// A finished handler's answer, as it goes on the wire.
pub(super) fn handler_answer(caught: Caught) -> Result<Bytes, WireError> {
    match caught {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(e.to_wire()),
        Err(_) => Err(WireError::new(WireErrorCode::Handler, "handler panicked")),
    }
}
type SlotFuture = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// The response size expected of each of the service's methods on one connection: the largest
/// seen lately (it decays towards smaller ones), at first the bound its answer's type gives
/// ([`MethodDesc::max_response`](crate::MethodDesc::max_response)). A method not seen yet and
/// of no such bound is unknown (its first handler on a connection takes the whole rendezvous
/// budget: see `ServerProto::try_start_handler`); an id the service does not have answers with
/// a small error. One entry per method of the service: a peer cannot grow it.
struct ResponseEstimates {
    by_method: Vec<(MethodId, Option<u64>)>,
}

impl ResponseEstimates {
    fn new(methods: &[crate::service::MethodDesc]) -> Self {
        ResponseEstimates { by_method: methods.iter().map(|m| (m.id, m.max_response)).collect() }
    }

    /// The expected response size; `u64::MAX` when unknown.
    fn estimate(&self, method: MethodId) -> u64 {
        match self.by_method.iter().find(|(id, _)| *id == method) {
            Some((_, Some(len))) => *len,
            Some((_, None)) => u64::MAX,
            None => 0,
        }
    }

    fn observe(&mut self, method: MethodId, len: u64) {
        if let Some((_, est)) = self.by_method.iter_mut().find(|(id, _)| *id == method) {
            *est = Some(match *est {
                Some(old) if len < old => old - (old - len) / 4,
                _ => len,
            });
        }
    }
}

/// What a call's report says of its answer: the response's size and path (none for an error),
/// and the outcome.
type Answered = (Option<(usize, Path)>, ServerOutcome);

/// A request waiting for its handler to start.
struct Waiting {
    call_id: u64,
    method: MethodId,
    payload: Received,
    path: Path,
    metadata: Bytes,
    /// When the request arrived: its deadline and its duration count from here.
    arrived: tokio::time::Instant,
    timeout: Option<Duration>,
}

/// A running handler.
struct Running {
    /// The task it runs in (aborted if it is cancelled; else idle again once its result is
    /// taken).
    task: HandlerTask,
    call: CallReport,
    /// Which spawn this is (`handlers_spawned` then): a late answer of a cancelled handler
    /// whose call id the peer used again is not taken for the new call's.
    spawn: u64,
}

/// The check on handlers polled in the driver ([`ServerConfig::inline_stall`]): how many held
/// it too long, which method's did last, and when the last warning was logged.
struct InlineStalls {
    after: Option<Duration>,
    count: u64,
    warned: Option<tokio::time::Instant>,
    /// Per method, by its place in the server's [`MethodTable`] (the last for ids it does not
    /// have): one entry per method of the service, made with the connection (none when the check
    /// is off).
    methods: Vec<MethodStalls>,
}

/// One method's handlers polled in a connection's driver, for telling a handler that holds the
/// driver from one whose thread the kernel took off its CPU (see [`InlineStalls::RECUR_WITHIN`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct MethodStalls {
    /// Its handlers polled in the driver so far.
    runs: u64,
    /// Which of them (by `runs`) held it too long last; 0: none yet.
    last_stall: u64,
}

impl InlineStalls {
    /// At most one warning per connection this often (each with the count so far).
    const WARN_EVERY: Duration = Duration::from_secs(10);
    /// A stall is a warning only when its method stalled before within this many of its runs on
    /// the connection; the first is a `debug` event. A handler that holds the driver does so
    /// again: one that always does is warned at its second run. A descheduled one is rare and
    /// random: with client and server on one vCPU, at most about one run in 300,000 held it past
    /// 1 ms that way (BENCHMARKS.md, session 58), so two within 1,000 runs come about once in
    /// 300 such stalls.
    const RECUR_WITHIN: u64 = 1_000;

    /// `methods`: how many the service has.
    fn new(after: Option<Duration>, methods: usize) -> Self {
        let methods = match after {
            Some(_) => vec![MethodStalls::default(); methods + 1],
            None => Vec::new(),
        };
        InlineStalls { after, count: 0, warned: None, methods }
    }

    /// The entry of method `ix` (on, there is one per method and one for unknown ids).
    fn method(&mut self, ix: MethodIx) -> &mut MethodStalls {
        let unknown = self.methods.len() - 1;
        let i = ix.0.map_or(unknown, |i| (i as usize).min(unknown));
        &mut self.methods[i]
    }

    /// When a handler of method `ix` about to be polled in the driver starts holding it: the
    /// reading this wake-up's events were stamped with, or the one taken after the last
    /// handler. `None` when the check is off, which reads no clock and counts nothing.
    fn start(&mut self, ix: MethodIx, clock: &mut driver::Clock) -> Option<tokio::time::Instant> {
        self.after?;
        self.method(ix).runs += 1;
        Some(clock.now())
    }

    /// A handler polled in the driver from `started` on ([`InlineStalls::start`]) has given it
    /// back: reads the clock (user code ran: `clock`'s reading is stale; it takes this one) and
    /// reports a stall if the handler held the driver too long: counted, and a warning if its
    /// method's stalls recur ([`InlineStalls::RECUR_WITHIN`]). Off, only forgets `clock`'s
    /// reading.
    fn check(
        &mut self,
        started: Option<tokio::time::Instant>,
        clock: &mut driver::Clock,
        call: &CallReport,
        names: &MethodTable,
    ) {
        let (Some(after), Some(started)) = (self.after, started) else {
            clock.reset();
            return;
        };
        let now = tokio::time::Instant::now();
        clock.set(now);
        let held = now.saturating_duration_since(started);
        if held < after {
            return;
        }
        self.count += 1;
        let method = names.get(call.name);
        method.inline_stalled();
        let m = self.method(call.name);
        let runs_since = m.runs - m.last_stall;
        let recurs = m.last_stall != 0 && runs_since <= Self::RECUR_WITHIN;
        m.last_stall = m.runs;
        let held_us = u64::try_from(held.as_micros()).unwrap_or(u64::MAX);
        if !recurs {
            tracing::debug!(
                parent: &call.span,
                held_us,
                stalls = self.count,
                "a handler of {} polled in the connection's driver held it for {held:?} (limit \
                 {after:?}; wall clock, time off the CPU included); a warning if this recurs within {} \
                 of its runs",
                method.name,
                Self::RECUR_WITHIN,
            );
            return;
        }
        if self.warned.is_some_and(|at| now.saturating_duration_since(at) < Self::WARN_EVERY) {
            return;
        }
        self.warned = Some(now);
        tracing::warn!(
            parent: &call.span,
            held_us,
            stalls = self.count,
            runs_since,
            "a handler of {} polled in the connection's driver held it for {held:?} (limit {after:?}; \
             wall clock, time off the CPU included), again {runs_since} run(s) after the last time: \
             the connection's other calls waited; do not mark it `#[rpc(inline)]`, or run the \
             server with `InlineHandlers::Never`",
            method.name,
        );
    }
}

/// What a call's end reports (its `call` span, event and metrics).
struct CallReport {
    method: MethodId,
    name: MethodIx,
    span: tracing::Span,
    arrived: tokio::time::Instant,
    request_bytes: usize,
}

impl CallReport {
    /// Reports the call's end at `ended` (read once per batch of events by the caller), or as
    /// the report is made (`None`: the clock is read only if something records the duration).
    fn done(
        &self,
        names: &MethodTable,
        ended: Option<tokio::time::Instant>,
        response: Option<(usize, Path)>,
        outcome: ServerOutcome,
    ) {
        let name = names.get(self.name);
        let elapsed = observe::Elapsed::between(self.arrived, ended);
        observe::server_call_done(&self.span, name, self.request_bytes, response, elapsed, outcome);
    }
}

/// The task that owns one server connection and its state machine.
struct ServerDriver {
    proto: ServerProto,
    conn: Box<dyn Connection>,
    /// The client's address, for spans and handler contexts.
    peer: Arc<str>,
    names: MethodNames,
    service: Arc<dyn Service>,
    /// The server-wide handler slots (FIFO: each connection waits for at most one at a time,
    /// so no connection starves another).
    handler_slots: Arc<Semaphore>,
    slot_wait: Option<SlotFuture>,
    /// The slot of a handler that finished inline in this poll, kept for the next handler of
    /// the same poll while other slots are free (with many requests in one batch, one trip
    /// through the semaphore per poll instead of one per call); given back when the poll ends.
    spare_slot: Option<OwnedSemaphorePermit>,
    /// This connection's share of the handler slots.
    max_handlers: usize,
    /// Handlers answered in their first poll here, and handlers run in tasks (published in
    /// [`ConnStats`]).
    handlers_inline: u64,
    handlers_spawned: u64,
    /// Handlers whose first poll here held the driver too long.
    stalls: InlineStalls,
    /// Requests waiting for a slot or for rendezvous budget, in arrival order (bounded by the
    /// protocol's calls in flight).
    waiting: VecDeque<Waiting>,
    /// How many of `waiting` the server-wide count has (see `publish_waiting`).
    waiting_published: u64,
    resources: Arc<Resources>,
    _open: OpenConnection,
    /// Running handlers: their method (to learn its response size), task and span.
    handlers: HashMap<u64, Running>,
    /// The tasks handlers run in when they do not finish in the driver, kept for the next ones.
    tasks: HandlerTasks,
    /// Response sizes seen per method, to reserve budget before a handler starts.
    estimates: ResponseEstimates,
    results: mpsc::UnboundedReceiver<HandlerResult>,
    scratch: driver::Scratch,
    sleep: driver::Timer,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The same signal, looked at without polling `shutdown`: whether it may have come.
    shutdown_flag: watch::Receiver<bool>,
    /// The waker `shutdown` was last polled with (it stays registered there).
    shutdown_waker: Option<std::task::Waker>,
    draining: bool,
    /// Posting the answers of a round from inside it failed ([`ServerDriver::post_answers`]):
    /// the round ends the connection.
    post_failed: Option<Fatal>,
    /// This connection's own slot of the server's board: publishing never contends with
    /// other connections.
    stats_slot: StatsSlot,
    /// Times this driver was polled (for [`ConnStats`]).
    polls: u64,
    /// The boxes of finished handlers, emptied, for the next ones' futures, and the contexts
    /// and pool they ran with, for the next ones' (a context is reused if its handler kept no
    /// clone of it).
    boxes: HandlerBoxes,
    /// Whether a poll may end after the round that did its work ([`driver::settles`],
    /// [`ServerDriver::settled`]).
    settles: bool,
}

/// Resolves once the server's shutdown flag is set.
fn shutdown_signal(mut rx: watch::Receiver<bool>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let _ = rx.wait_for(|stop| *stop).await;
    })
}

impl ServerDriver {
    /// Starts waiting handlers while this connection's share, the server's slots and the
    /// rendezvous budgets allow. A slot is taken before the handler is first polled. Returns
    /// whether any started.
    fn start_handlers(&mut self, cx: &mut Context<'_>) -> bool {
        let mut started = false;
        while let Some(next) = self.waiting.front() {
            let Some((permit, answer)) = self.admit(next.call_id, next.method, cx) else { break };
            let Some(req) = self.waiting.pop_front() else { break };
            self.start_handler(req, permit, answer);
            started = true;
        }
        if self.waiting.is_empty() {
            // Nothing waits any more (cancelled): give up our place in the server-wide queue, or
            // a slot handed to it would sit unused while other connections wait.
            self.slot_wait = None;
        }
        started
    }

    /// The handler slot for the request `call_id` if its handler may start now: this
    /// connection's share, its rendezvous budget (released by the client's done reports, frames
    /// that wake this driver, and by finishing handlers) and a server-wide slot allow it. With
    /// it, the answer expected of its method ([`ResponseEstimates::estimate`]).
    fn admit(
        &mut self,
        call_id: u64,
        method: MethodId,
        cx: &mut Context<'_>,
    ) -> Option<(OwnedSemaphorePermit, u64)> {
        if self.handlers.len() >= self.max_handlers {
            return None;
        }
        let answer = self.estimates.estimate(method);
        if !self.proto.try_start_handler(call_id, answer) {
            return None;
        }
        Some((self.take_slot(cx)?, answer))
    }

    /// A server-wide handler slot, at once or when this connection's turn comes.
    fn take_slot(&mut self, cx: &mut Context<'_>) -> Option<OwnedSemaphorePermit> {
        if let Some(permit) = self.spare_slot.take() {
            // Reused only while the server has slots free (so no connection waits for one);
            // at the limit it goes back, to whichever connection waits longest, and this one
            // queues as before.
            if self.handler_slots.available_permits() > 0 {
                return Some(permit);
            }
        }
        if self.slot_wait.is_none() {
            match self.handler_slots.clone().try_acquire_owned() {
                Ok(permit) => return Some(permit),
                Err(TryAcquireError::Closed) => return None,
                Err(TryAcquireError::NoPermits) => {
                    self.slot_wait = Some(Box::pin(self.handler_slots.clone().acquire_owned()));
                }
            }
        }
        let wait = self.slot_wait.as_mut()?;
        match wait.as_mut().poll(cx) {
            Poll::Ready(result) => {
                self.slot_wait = None;
                result.ok()
            }
            Poll::Pending => None,
        }
    }

    /// Starts one handler: polled once here when [`ServerConfig::inline_handlers`] says so for
    /// its method (answered at once if it finishes), else (or if it waits) handed to one of the
    /// connection's handler tasks, which sends its result back (`handler_tasks`).
    fn start_handler(&mut self, req: Waiting, permit: OwnedSemaphorePermit, answer: u64) {
        let Waiting { call_id, method, payload, path, metadata, arrived, timeout } = req;
        let name = self.names.index(method);
        // Its name, and whether its handler is polled here first: `ServerConfig::inline_handlers`
        // says so for its method, and the call is small (`runs_here`).
        let (method_name, here) = {
            let m = self.names.get(name);
            (m.name, m.inline && self.runs_here(path, answer))
        };
        let span = tracing::debug_span!(
            "call",
            method = %method_name,
            call_id,
            peer = %self.peer,
            %path,
            trace_id = tracing::field::Empty,
        );
        let request_bytes = payload.len();
        let call = CallReport { method, name, span, arrived, request_bytes };
        let metadata = match Metadata::decode(&metadata) {
            Ok(m) => m,
            Err(e) => {
                // Answered at once, without a handler (the slot goes back when `permit` drops).
                let err = WireError::new(WireErrorCode::BadRequest, format!("metadata: {e}"));
                call.done(&self.names, Some(arrived), None, ServerOutcome::Failed(err.code));
                self.proto.respond(call_id, Err(err));
                return;
            }
        };
        if let Some(trace) = metadata.get(context::TRACE_ID_KEY) {
            call.span.record("trace_id", tracing::field::display(trace));
        }
        let deadline = timeout.and_then(|t| arrived.checked_add(t));
        let (spare_ctx, pool) = match self.boxes.take_context() {
            Some((ctx, pool)) => (Some(ctx), pool),
            None => (None, self.conn.pool().clone()),
        };
        let ctx =
            context::Context::new_in(spare_ctx, method_name, method, call_id, &self.peer, deadline, metadata);
        // The future goes in a box of the connection's (see `future_slot`), with the call's
        // context and the connection's pool (the response is encoded into its registered memory:
        // see `codec::encode`). Building it runs the service's code too (decoding the
        // arguments): a panic there is answered like one in the handler.
        let (service, boxes) = (&self.service, &mut self.boxes);
        let built = call.span.in_scope(|| {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                service.call_in(method, payload, boxes.slot(ctx, pool))
            }))
        });
        let mut fut = match built {
            Ok(fut) => fut,
            Err(panic) => {
                self.ended_here(permit);
                self.handlers_inline += 1;
                self.finish_now(call_id, &call, handler_answer(Err(panic)));
                return;
            }
        };
        if here {
            // When it started holding the driver, for the stall check.
            let started = self.stalls.start(name, &mut self.scratch.clock);
            // The first poll, here, under the call's span (the context and pool are set by the
            // future itself). A waker that does nothing: if the handler waits, the task it moves
            // to polls it again at once and registers its own waker.
            let mut noop = Context::from_waker(futures::task::noop_waker_ref());
            let polled = call.span.in_scope(|| fut.poll(&mut noop));
            if let Poll::Ready(caught) = polled {
                self.ended_here(permit);
                self.handlers_inline += 1;
                let answered = self.answer(call_id, handler_answer(caught));
                // The handler held the driver until here, its answer made. User code ran: the
                // driver's reading of the clock is stale, and the stall check reads it again.
                // Not after the post below: a send that wakes the peer on this CPU may hand the
                // CPU over until the peer is done (over tcp on one vCPU, about one call in a
                // thousand was held 100 us or more that way), which is not the handler's doing.
                self.stalls.check(started, &mut self.scratch.clock, &call, &self.names);
                // The last answer of the round goes out now, with the round's others (see
                // `post_answers`); what is left of the call is done after it, off the way from
                // the request to its answer: its end is the time of its report, once the answer
                // is handed to the transport (or queued behind others of the round).
                self.post_answers();
                // The box, context and pool are kept for the next handler (the box holds
                // nothing of this one any more).
                self.boxes.give_back(fut);
                self.close(&call, None, answered);
                return;
            }
            self.stalls.check(started, &mut self.scratch.clock, &call, &self.names);
        }
        // Counted as running from here: a handler that finished inline above started and
        // ended within this poll.
        self.resources.handlers_running.fetch_add(1, Ordering::Relaxed);
        let slot = HandlerSlot { _permit: permit, resources: self.resources.clone() };
        self.handlers_spawned += 1;
        let spawn = self.handlers_spawned;
        let task = self.tasks.run(Job { call_id, spawn, fut, slot, span: call.span.clone() });
        self.handlers.insert(call_id, Running { task, call, spawn });
    }

    /// Whether a call of a method whose handlers may be polled here is small enough to be: its
    /// `request` came eagerly, and its method's answers lately did too (`answer`, the method's
    /// estimate; `u64::MAX` if it has had none on this connection yet). A large request or answer is copied in the handler's poll (decoded from
    /// the region its bytes were read into, encoded into registered memory): a 16 MiB echo held
    /// the driver ~3.8 ms (`rpc-bench compare`), its other calls waiting. Such a call runs in a
    /// task, where its copies hold up no one; a task's start costs microseconds, the copies of a
    /// payload over the eager limit more. The estimate decays by a quarter of its gap per
    /// smaller answer (under the default 8 KiB eager limit, eight answers of a few bytes after
    /// one of 64 KiB).
    fn runs_here(&self, request: Path, answer: u64) -> bool {
        request == Path::Eager && (answer == u64::MAX || answer <= self.proto.eager_limit() as u64)
    }

    /// A handler that ran here, in the driver, ended: its slot is kept for the next handler of
    /// this poll ([`ServerDriver::spare_slot`]).
    fn ended_here(&mut self, permit: OwnedSemaphorePermit) {
        self.spare_slot = Some(permit);
    }

    /// Answers a call whose handler ran here, in the driver: its end is the time of its report
    /// (user code ran: the driver's reading of the clock is stale).
    fn finish_now(&mut self, call_id: u64, call: &CallReport, result: Result<Bytes, WireError>) {
        self.scratch.clock.reset();
        self.finish(call_id, call, result, None);
    }

    /// Answers a call whose handler finished, and reports its end (see [`CallReport::done`]).
    fn finish(
        &mut self,
        call_id: u64,
        call: &CallReport,
        result: Result<Bytes, WireError>,
        ended: Option<tokio::time::Instant>,
    ) {
        let answered = self.answer(call_id, result);
        self.close(call, ended, answered);
    }

    /// Answers a call whose handler finished; returns what [`ServerDriver::close`] reports of
    /// the answer.
    fn answer(&mut self, call_id: u64, result: Result<Bytes, WireError>) -> Answered {
        let answered = match &result {
            Ok(bytes) => {
                let path =
                    if bytes.len() <= self.proto.eager_limit() { Path::Eager } else { Path::Rendezvous };
                (Some((bytes.len(), path)), ServerOutcome::Ok)
            }
            Err(e) => (None, ServerOutcome::Failed(e.code)),
        };
        self.proto.respond(call_id, result);
        answered
    }

    /// What is left of an answered call: its response size goes into the method's estimate,
    /// and its end is reported (see [`CallReport::done`]).
    fn close(
        &mut self,
        call: &CallReport,
        ended: Option<tokio::time::Instant>,
        (response, outcome): Answered,
    ) {
        if let Some((len, _)) = response {
            self.estimates.observe(call.method, len as u64);
        }
        call.done(&self.names, ended, response, outcome);
    }

    /// The failure of a post from inside the round ([`ServerDriver::post_answers`]), once.
    #[inline]
    fn post_outcome(&mut self) -> Result<(), Fatal> {
        // A look before the move: most rounds have nothing here.
        if self.post_failed.is_some() {
            if let Some(fatal) = self.post_failed.take() {
                return Err(fatal);
            }
        }
        Ok(())
    }

    /// Posts the answers made so far when the one just made is the round's last: no request
    /// of the round is left to answer (the round's completions were all taken before its
    /// events), none waits for a slot, and no spawned handler runs (whose result this round
    /// may still take). They go out as one batch, as the round's own post would send them, and
    /// the round's post then finds nothing; the work that remains of the call (giving its box
    /// back, its report) is done after its answer has left. A failure to post ends the
    /// connection in this round ([`ServerDriver::poll_round`]).
    fn post_answers(&mut self) {
        if self.proto.has_events()
            || !self.waiting.is_empty()
            || !self.handlers.is_empty()
            || self.post_failed.is_some()
        {
            return;
        }
        if let Err(fatal) = driver::post_ops(self.conn.as_mut(), &mut self.proto, &mut self.scratch) {
            self.post_failed = Some(fatal);
        }
    }

    /// Takes the state machine's events: a request's handler starts at once if none waits
    /// before it and it may ([`ServerDriver::admit`]), else the request waits its turn. Returns
    /// whether a handler started.
    fn run_events(&mut self, cx: &mut Context<'_>) -> bool {
        let mut started = false;
        while let Some(event) = self.proto.poll_event() {
            match event {
                ServerEvent::Request { call_id, method, payload, path, metadata, timeout } => {
                    let arrived = self.scratch.clock.now();
                    let req = Waiting { call_id, method, payload, path, metadata, arrived, timeout };
                    // Not through the queue when it is empty (a move of the request in and
                    // out of it).
                    if self.waiting.is_empty() {
                        if let Some((permit, answer)) = self.admit(call_id, method, cx) {
                            self.start_handler(req, permit, answer);
                            started = true;
                            continue;
                        }
                    }
                    self.waiting.push_back(req);
                }
                ServerEvent::Cancel { call_id, reason } => {
                    if let Some(running) = self.handlers.remove(&call_id) {
                        running.task.abort();
                        let outcome = match reason {
                            CancelReason::Cancelled => ServerOutcome::Cancelled,
                            CancelReason::DeadlineExceeded => ServerOutcome::DeadlineExceeded,
                        };
                        running.call.done(&self.names, Some(self.scratch.clock.now()), None, outcome);
                    } else if let Some(i) = self.waiting.iter().position(|w| w.call_id == call_id) {
                        tracing::debug!(call_id, ?reason, "dropping a request that waited for a handler");
                        self.waiting.remove(i);
                    }
                }
            }
        }
        started
    }

    fn poll_results(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        for _ in 0..driver::COMPLETION_BATCH {
            let Poll::Ready(Some((call_id, spawn, result, fut))) = self.results.poll_recv(cx) else { break };
            progressed = true;
            self.boxes.give_back(fut);
            // One lookup: the entry is taken only if it is this spawn's.
            if let Entry::Occupied(entry) = self.handlers.entry(call_id) {
                if entry.get().spawn == spawn {
                    let running = entry.remove();
                    // One reading of the clock for all the results of this wake-up.
                    let now = self.scratch.clock.now();
                    self.finish(call_id, &running.call, result, Some(now));
                    self.tasks.idle_again(running.task);
                }
            }
        }
        progressed
    }

    /// Polls the shutdown signal when it may have come (or the server is gone), or when this
    /// task's waker is not the one the signal holds; otherwise a look at the flag is enough.
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) {
        if self.draining {
            return;
        }
        let signalled = !matches!(self.shutdown_flag.has_changed(), Ok(false));
        let registered = self.shutdown_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if !signalled && registered {
            return;
        }
        if self.shutdown.as_mut().poll(cx).is_ready() {
            tracing::debug!(calls = self.proto.calls_in_flight(), "draining for shutdown");
            self.draining = true;
            self.proto.begin_shutdown();
            self.sleep.stale();
        } else if !registered {
            self.shutdown_waker = Some(cx.waker().clone());
        }
    }

    /// One round of work. Timers are driven when nothing else progressed (the round before the
    /// driver waits) or when `last` (before it yields), so that they are armed whenever it
    /// stops, but not looked at in every busy round.
    fn poll_round(&mut self, cx: &mut Context<'_>, last: bool) -> Result<bool, Fatal> {
        let mut progressed =
            driver::poll_completions(cx, self.conn.as_mut(), &mut self.proto, &mut self.scratch)?;
        progressed |= self.run_events(cx);
        self.post_outcome()?;
        // Results come only from spawned handlers (a spawned handler's entry stays until its
        // result is taken or it is cancelled; a cancelled one's late result waits in the
        // channel, at most one per handler, until the next look, which tells it apart by its
        // spawn number).
        if !self.handlers.is_empty() {
            progressed |= self.poll_results(cx);
        }
        if !progressed || last {
            progressed |=
                driver::drive_timers(cx, &mut self.proto, &mut self.sleep, &mut self.scratch.clock)?;
            // Expired deadlines are events too.
            progressed |= self.run_events(cx);
        }
        progressed |= self.start_handlers(cx);
        progressed |= driver::post_ops(self.conn.as_mut(), &mut self.proto, &mut self.scratch)?;
        if let Some(budget) = self.proto.blocked_on_shared_budget() {
            // A READ waits for the server-wide budget: be woken by a release, then retry.
            budget.register_waker(cx.waker());
            progressed |= driver::post_ops(self.conn.as_mut(), &mut self.proto, &mut self.scratch)?;
        }
        // The answers are out: now the receive their requests came in is replaced.
        driver::flush_repost(self.conn.as_mut(), &mut self.scratch)?;
        self.publish_waiting();
        // An answer posted by a later look at the events (after the timers) that failed.
        self.post_outcome()?;
        Ok(progressed)
    }

    /// After a round that did work: whether the next would find nothing, so that the poll may
    /// end without it ([`driver::settle`], where the connection [`driver::settles`]). Besides
    /// what that checks, no request waits for a handler, none runs in a task (whose result would
    /// come through the channel), no failed post waits to be reported and no READ waits for the
    /// server-wide budget. Over tcp and mem, a 32 B call's server spared that round: ~0.5% of a
    /// call's instructions (BENCHMARKS.md).
    fn settled(&mut self, cx: &mut Context<'_>) -> Result<bool, Fatal> {
        if !self.settles
            || !self.waiting.is_empty()
            || !self.handlers.is_empty()
            || self.post_failed.is_some()
            || self.proto.blocked_on_shared_budget().is_some()
        {
            return Ok(false);
        }
        driver::settle(cx, self.conn.as_mut(), &mut self.proto, &mut self.sleep, &mut self.scratch)
    }

    /// Brings the connection's slot of the board up to date, field by field in place (no
    /// `ConnStats` built and copied in: it runs after every poll that did work).
    fn publish_stats(&self) {
        // The transport's counters are read under its own lock, before the slot's is taken.
        let transport = self.conn.counters();
        let mut slot = self.stats_slot.stats.lock();
        // Every field named (no `..`): one added to `ConnStats` must be published here too.
        let ConnStats {
            proto,
            transport: slot_transport,
            calls_in_flight,
            driver_polls,
            caller_passes: _, // a client's; 0 on a server, as the slot started
            handlers_inline,
            handlers_spawned,
            inline_stalls,
            handler_boxes,
        } = &mut *slot;
        *proto = self.proto.stats();
        *slot_transport = transport;
        *calls_in_flight = self.proto.calls_in_flight();
        *driver_polls = self.polls;
        *handlers_inline = self.handlers_inline;
        *handlers_spawned = self.handlers_spawned;
        *inline_stalls = self.stalls.count;
        *handler_boxes = self.boxes.made();
    }

    fn stop(&mut self) {
        self.spare_slot = None;
        self.publish_stats();
        for (_, running) in self.handlers.drain() {
            running.task.abort();
            running.call.done(&self.names, None, None, ServerOutcome::Disconnected);
        }
        self.drop_waiting();
        self.proto.fail_all();
        self.conn.close();
        driver::revoke_after_close(self.conn.as_mut(), &mut self.proto);
        self.publish_stats();
    }
}

impl Future for ServerDriver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.polls += 1;
        this.scratch.clock.reset();
        // Once per wake-up: its waker stays registered for the rounds below (the signal is
        // polled by this task only).
        this.poll_shutdown(cx);
        let mut worked = false;
        for round in 1..=ROUNDS_PER_WAKE {
            let outcome = match this.poll_round(cx, round == ROUNDS_PER_WAKE) {
                Ok(true) => {
                    worked = true;
                    // Work is left only if the next round would find some.
                    this.settled(cx).map(|settled| !settled)
                }
                other => other,
            };
            match outcome {
                Err(Fatal::Transport(e)) => {
                    tracing::debug!(error = %e, "connection closed");
                    this.stop();
                    return Poll::Ready(());
                }
                Err(fatal) => {
                    tracing::warn!(error = %fatal, "closing connection");
                    this.stop();
                    return Poll::Ready(());
                }
                Ok(_)
                    if this.draining
                        && this.proto.is_idle()
                        && this.handlers.is_empty()
                        && this.waiting.is_empty() =>
                {
                    tracing::debug!("drained; closing");
                    this.stop();
                    return Poll::Ready(());
                }
                Ok(true) => continue,
                Ok(false) => {
                    // A poll that found nothing changed little (a busy-polling driver spins
                    // through many): its counters go out with the next that did, or every
                    // `STATS_EVERY` polls.
                    if worked || this.polls % STATS_EVERY == 0 {
                        this.publish_stats();
                    }
                    this.spare_slot = None;
                    return Poll::Pending;
                }
            }
        }
        this.publish_stats();
        this.spare_slot = None;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A server driver's polls that found nothing to do publish its counters once in this many.
const STATS_EVERY: u64 = 64;

/// The latest counters of each open connection, one slot per connection, and the folded
/// totals of closed ones (a closed connection keeps no slot).
#[derive(Debug, Default)]
struct StatsBoard {
    open: Mutex<HashMap<u64, Arc<Mutex<ConnStats>>>>,
    closed: Mutex<ConnStats>,
    next_id: AtomicU64,
}

/// One connection's slot of the board; folded into the closed totals when dropped.
struct StatsSlot {
    id: u64,
    stats: Arc<Mutex<ConnStats>>,
    board: Arc<StatsBoard>,
}

impl StatsBoard {
    fn slot(self: &Arc<Self>) -> StatsSlot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stats = Arc::new(Mutex::new(ConnStats::default()));
        self.open.lock().insert(id, stats.clone());
        StatsSlot { id, stats, board: self.clone() }
    }

    fn total(&self) -> ConnStats {
        let open = self.open.lock();
        let closed = *self.closed.lock();
        open.values().fold(closed, |acc, s| acc.sum(&s.lock()))
    }
}

impl Drop for StatsSlot {
    fn drop(&mut self) {
        self.board.open.lock().remove(&self.id);
        let mut last = *self.stats.lock();
        // Nothing is in progress or held on a closed connection.
        last.calls_in_flight = 0;
        last.proto.rendezvous_bytes_held = 0;
        let mut closed = self.board.closed.lock();
        *closed = closed.sum(&last);
    }
}

impl ServerDriver {
    fn drop_waiting(&mut self) {
        self.waiting.clear();
        self.publish_waiting();
    }

    /// Brings the server-wide count of waiting requests up to date with this connection's
    /// queue: once per round, not per request (a request that arrives and starts in the same
    /// round never shows there, nor costs an atomic update).
    fn publish_waiting(&mut self) {
        let now = self.waiting.len() as u64;
        let was = std::mem::replace(&mut self.waiting_published, now);
        if now > was {
            self.resources.requests_waiting.fetch_add(now - was, Ordering::Relaxed);
        } else if now < was {
            self.resources.requests_waiting.fetch_sub(was - now, Ordering::Relaxed);
        }
    }
}

impl Drop for ServerDriver {
    fn drop(&mut self) {
        for (_, running) in self.handlers.drain() {
            running.task.abort();
        }
        self.drop_waiting();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> MethodTable {
        let methods = vec![(1, ServerMethod::new("a", true)), (2, ServerMethod::new("b", true))];
        MethodTable { methods, unknown: ServerMethod::new("unknown", false) }
    }

    const A: MethodIx = MethodIx(Some(0));
    const B: MethodIx = MethodIx(Some(1));

    fn call(name: MethodIx, arrived: tokio::time::Instant) -> CallReport {
        CallReport { method: 0, name, span: tracing::Span::none(), arrived, request_bytes: 0 }
    }

    /// One handler of method `ix` polled in the driver, holding it for `hold`.
    async fn run(stalls: &mut InlineStalls, names: &MethodTable, ix: MethodIx, hold: Duration) {
        let mut clock = driver::Clock::default();
        let started = stalls.start(ix, &mut clock);
        assert_eq!(started, Some(tokio::time::Instant::now()), "on, the start is stamped");
        tokio::time::advance(hold).await;
        stalls.check(started, &mut clock, &call(ix, tokio::time::Instant::now()), names);
        assert_eq!(clock.now(), tokio::time::Instant::now(), "the check's reading is kept");
    }

    /// Paused time: the clock moves only when the test says, so "holding the driver" is a
    /// `tokio::time::advance` between the start and the check.
    #[tokio::test(start_paused = true)]
    async fn a_stall_counts_and_is_warned_when_its_method_stalls_again_soon_at_most_every_10_s() {
        let names = table();
        let mut stalls = InlineStalls::new(Some(Duration::from_millis(1)), 2);
        let (quick, slow) = (Duration::from_micros(999), Duration::from_millis(1));

        // Under the limit: not a stall.
        run(&mut stalls, &names, A, quick).await;
        assert_eq!((stalls.count, stalls.warned), (0, None));

        // At the limit: a stall, counted; the method's first, so not warned.
        run(&mut stalls, &names, A, slow).await;
        assert_eq!((stalls.count, stalls.warned), (1, None));
        assert_eq!(stalls.methods[0], MethodStalls { runs: 2, last_stall: 2 });

        // The same method again, three runs later: it recurs, warned.
        run(&mut stalls, &names, A, quick).await;
        run(&mut stalls, &names, A, quick).await;
        run(&mut stalls, &names, A, slow).await;
        let first_warning = tokio::time::Instant::now();
        assert_eq!((stalls.count, stalls.warned), (2, Some(first_warning)));

        // Again within 10 s: counted, not warned again.
        tokio::time::advance(Duration::from_secs(5)).await;
        run(&mut stalls, &names, A, slow).await;
        assert_eq!((stalls.count, stalls.warned), (3, Some(first_warning)));

        // 10 s after the last warning: warned again.
        tokio::time::advance(Duration::from_secs(5)).await;
        run(&mut stalls, &names, A, Duration::from_millis(2)).await;
        let second_warning = tokio::time::Instant::now();
        assert_eq!((stalls.count, stalls.warned), (4, Some(second_warning)));

        // Another method's first stall, well after that: counted, not warned (A's do not count
        // for it, nor an unknown method's for either).
        tokio::time::advance(Duration::from_secs(20)).await;
        run(&mut stalls, &names, MethodIx(None), slow).await;
        run(&mut stalls, &names, B, slow).await;
        assert_eq!((stalls.count, stalls.warned), (6, Some(second_warning)));

        // A's next stall more than `RECUR_WITHIN` of its runs after its last: a first again.
        for _ in 0..InlineStalls::RECUR_WITHIN {
            run(&mut stalls, &names, A, quick).await;
        }
        run(&mut stalls, &names, A, slow).await;
        assert_eq!((stalls.count, stalls.warned), (7, Some(second_warning)));
        // And its next one, at the edge of the window, recurs.
        for _ in 0..InlineStalls::RECUR_WITHIN - 1 {
            run(&mut stalls, &names, A, quick).await;
        }
        run(&mut stalls, &names, A, slow).await;
        assert_eq!((stalls.count, stalls.warned), (8, Some(tokio::time::Instant::now())));
        let first = MethodStalls { runs: 1, last_stall: 1 };
        assert_eq!(stalls.methods, [MethodStalls { runs: 2_008, last_stall: 2_008 }, first, first]);
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_check_off_nothing_counts_and_the_clock_reading_is_forgotten() {
        let (names, mut clock) = (table(), driver::Clock::default());
        let mut stalls = InlineStalls::new(None, 2);
        let stale = clock.now();
        let started = stalls.start(A, &mut clock);
        assert_eq!(started, None, "off, the start is not stamped");
        tokio::time::advance(Duration::from_secs(1)).await;
        stalls.check(started, &mut clock, &call(A, stale), &names);
        assert_eq!((stalls.count, stalls.warned), (0, None));
        assert!(stalls.methods.is_empty(), "off, nothing is kept per method");
        assert_eq!(clock.now(), tokio::time::Instant::now(), "a fresh reading, not the stale one");
    }
}

//! The server: accepts connections, runs one driver task per connection, runs handlers
//! concurrently (bounded), and shuts down gracefully.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use rpc_transport::{Address, Completion, Connection, Listener};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Sleep;
use tracing::Instrument;

use super::config::ServerConfig;
use super::driver::{self, ConnStats, Fatal, ROUNDS_PER_WAKE};
use super::handshake;
use crate::error::ConnectError;
use crate::proto::{MethodId, Path, ServerEvent, ServerProto, WireError, WireErrorCode};
use crate::service::Service;

/// A running server. Dropping it stops accepting and aborts its connections; call
/// [`Server::shutdown`] to drain calls in progress first.
pub struct Server {
    local_addr: Address,
    board: Arc<StatsBoard>,
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
        let listener = rpc_transport::listen(&addr, handshake::conn_params(&config.proto)).await?;
        Ok(Server::serve(listener, config, service))
    }

    /// Serves `service` on the connections `listener` accepts (set up with this crate's
    /// parameters, e.g. by [`Server::bind`]).
    pub fn serve<S: Service>(listener: Box<dyn Listener>, config: ServerConfig, service: S) -> Server {
        let local_addr = listener.local_addr();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let span = tracing::info_span!("server", service = service.name(), addr = %local_addr);
        let board = Arc::new(StatsBoard::default());
        let acceptor = Acceptor {
            listener,
            board: board.clone(),
            service: Arc::new(service),
            handler_slots: Arc::new(Semaphore::new(config.max_concurrent_handlers)),
            config,
            shutdown: shutdown_rx,
        };
        let accept_task = tokio::spawn(acceptor.run().instrument(span));
        Server { local_addr, board, shutdown, accept_task: Some(accept_task) }
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> &Address {
        &self.local_addr
    }

    /// Counters of every connection this server has had (open and closed), summed.
    pub fn stats(&self) -> ConnStats {
        self.board.total()
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

struct Acceptor {
    listener: Box<dyn Listener>,
    board: Arc<StatsBoard>,
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
                accepted = self.listener.accept() => match accepted {
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
        let driver = ServerDriver {
            proto: ServerProto::new(&self.config.proto, &peer),
            conn,
            service: self.service.clone(),
            handler_slots: self.handler_slots.clone(),
            handlers: HashMap::new(),
            results_tx,
            results,
            scratch: Vec::with_capacity(driver::COMPLETION_BATCH),
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            shutdown: shutdown_signal(self.shutdown.clone()),
            draining: false,
            stats_slot: self.board.slot(),
        };
        connections.spawn(driver.instrument(span));
    }
}

type HandlerResult = (u64, Result<Bytes, WireError>);

/// The task that owns one server connection and its state machine.
struct ServerDriver {
    proto: ServerProto,
    conn: Box<dyn Connection>,
    service: Arc<dyn Service>,
    handler_slots: Arc<Semaphore>,
    handlers: HashMap<u64, AbortHandle>,
    results_tx: mpsc::UnboundedSender<HandlerResult>,
    results: mpsc::UnboundedReceiver<HandlerResult>,
    scratch: Vec<Completion>,
    sleep: Pin<Box<Sleep>>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    draining: bool,
    /// This connection's own slot of the server's board: publishing never contends with
    /// other connections.
    stats_slot: Arc<Mutex<ConnStats>>,
}

/// Resolves once the server's shutdown flag is set.
fn shutdown_signal(mut rx: watch::Receiver<bool>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let _ = rx.wait_for(|stop| *stop).await;
    })
}

impl ServerDriver {
    fn start_handler(&mut self, call_id: u64, method: MethodId, payload: Bytes, path: Path) {
        let span = tracing::debug_span!("call", call_id, method = format_args!("{method:#010x}"), %path);
        let fut = self.service.call(method, payload);
        let slots = self.handler_slots.clone();
        let results = self.results_tx.clone();
        let task = async move {
            let Ok(_slot) = slots.acquire_owned().await else { return };
            let outcome = AssertUnwindSafe(fut).catch_unwind().await;
            let result = match outcome {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(e)) => Err(e.to_wire()),
                Err(_) => Err(WireError::new(WireErrorCode::Handler, "handler panicked")),
            };
            let _ = results.send((call_id, result));
        };
        let handle = tokio::spawn(task.instrument(span));
        self.handlers.insert(call_id, handle.abort_handle());
    }

    fn run_events(&mut self) {
        while let Some(event) = self.proto.poll_event() {
            match event {
                ServerEvent::Request { call_id, method, payload, path, .. } => {
                    self.start_handler(call_id, method, payload, path)
                }
                ServerEvent::Cancel { call_id, reason } => {
                    if let Some(h) = self.handlers.remove(&call_id) {
                        tracing::debug!(call_id, ?reason, "aborting handler");
                        h.abort();
                    }
                }
            }
        }
    }

    fn poll_results(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        for _ in 0..driver::COMPLETION_BATCH {
            let Poll::Ready(Some((call_id, result))) = self.results.poll_recv(cx) else { break };
            progressed = true;
            if self.handlers.remove(&call_id).is_some() {
                self.proto.respond(call_id, result);
            }
        }
        progressed
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) {
        if !self.draining && self.shutdown.as_mut().poll(cx).is_ready() {
            tracing::debug!(calls = self.proto.calls_in_flight(), "draining for shutdown");
            self.draining = true;
            self.proto.begin_shutdown();
        }
    }

    fn poll_round(&mut self, cx: &mut Context<'_>) -> Result<bool, Fatal> {
        self.poll_shutdown(cx);
        let mut progressed =
            driver::poll_completions(cx, self.conn.as_mut(), &mut self.proto, &mut self.scratch)?;
        self.run_events();
        progressed |= self.poll_results(cx);
        progressed |= driver::drive_timers(cx, &mut self.proto, &mut self.sleep);
        self.run_events();
        driver::post_ops(self.conn.as_mut(), &mut self.proto)?;
        Ok(progressed)
    }

    fn publish_stats(&self) {
        let stats = ConnStats {
            proto: self.proto.stats(),
            transport: self.conn.counters(),
            calls_in_flight: self.proto.calls_in_flight(),
        };
        *self.stats_slot.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }

    fn stop(&mut self) {
        self.publish_stats();
        for (_, h) in self.handlers.drain() {
            h.abort();
        }
        self.proto.fail_all();
        self.conn.close();
    }
}

impl Future for ServerDriver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        for _ in 0..ROUNDS_PER_WAKE {
            match this.poll_round(cx) {
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
                Ok(_) if this.draining && this.proto.is_idle() && this.handlers.is_empty() => {
                    tracing::debug!("drained; closing");
                    this.stop();
                    return Poll::Ready(());
                }
                Ok(true) => continue,
                Ok(false) => {
                    this.publish_stats();
                    return Poll::Pending;
                }
            }
        }
        this.publish_stats();
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The latest counters of each connection a server has had, one slot per connection.
#[derive(Debug, Default)]
struct StatsBoard {
    slots: Mutex<Vec<Arc<Mutex<ConnStats>>>>,
}

impl StatsBoard {
    fn slot(&self) -> Arc<Mutex<ConnStats>> {
        let slot = Arc::new(Mutex::new(ConnStats::default()));
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).push(slot.clone());
        slot
    }

    fn total(&self) -> ConnStats {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .fold(ConnStats::default(), |acc, s| acc.sum(&s.lock().unwrap_or_else(|e| e.into_inner())))
    }
}

impl Drop for ServerDriver {
    fn drop(&mut self) {
        for (_, h) in self.handlers.drain() {
            h.abort();
        }
    }
}

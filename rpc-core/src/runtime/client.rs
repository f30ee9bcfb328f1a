//! The client: a cloneable handle to one connection, driven by its own task.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use rpc_transport::{Address, Completion, Connection, MemPool};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Sleep;
use tracing::Instrument;

use super::config::{CallOptions, ClientConfig};
use super::driver::{self, ConnStats, Fatal, ROUNDS_PER_WAKE};
use super::handshake;
use crate::error::{CallError, ConnectError, RemoteError};
use crate::proto::{CallFailure, CallInfo, ClientEvent, ClientProto, MethodId, StartError};

type Reply = oneshot::Sender<Result<(Bytes, CallInfo), CallError>>;

enum Command {
    Call { call_id: u64, method: MethodId, payload: Bytes, timeout: Option<Duration>, reply: Reply },
    Cancel { call_id: u64 },
    Stats { reply: oneshot::Sender<ConnStats> },
}

struct Shared {
    commands: mpsc::UnboundedSender<Command>,
    next_call_id: AtomicU64,
    in_flight: Semaphore,
    default_deadline: Option<Duration>,
    peer: String,
    pool: MemPool,
}

/// A handle to one client connection. Cheap to clone, `Send + Sync`; all clones share the
/// connection. The connection closes when the last clone is dropped.
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
    /// spawns the connection's driver on the current tokio runtime.
    pub async fn connect(addr: &str, config: ClientConfig) -> Result<Client, ConnectError> {
        let addr: Address = addr.parse()?;
        let conn = rpc_transport::connect(&addr, handshake::conn_params(&config.proto)).await?;
        Client::start(conn, config)
    }

    /// Wraps a connection that was set up with this crate's parameters.
    fn start(conn: Box<dyn Connection>, config: ClientConfig) -> Result<Client, ConnectError> {
        let peer = handshake::peer_limits(conn.as_ref())?;
        let info = conn.info().clone();
        let conn_pool = conn.pool().clone();
        let span = tracing::info_span!("conn", role = "client", peer = %info.peer, backend = info.backend);
        let (commands, rx) = mpsc::unbounded_channel();
        let driver = ClientDriver {
            proto: ClientProto::new(&config.proto, &peer, driver::now()).with_pool(conn_pool.clone()),
            conn,
            commands: rx,
            pending: HashMap::new(),
            scratch: Vec::with_capacity(driver::COMPLETION_BATCH),
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            closing: false,
        };
        tokio::spawn(driver.instrument(span));
        let shared = Shared {
            commands,
            next_call_id: AtomicU64::new(1),
            in_flight: Semaphore::new(config.proto.max_in_flight as usize),
            default_deadline: config.default_deadline,
            peer: info.peer,
            pool: conn_pool,
        };
        Ok(Client { shared: Arc::new(shared) })
    }

    /// The connection's registered memory: encode payloads here
    /// ([`crate::codec::encode_in`]) and the transport sends or advertises them as they are.
    pub fn pool(&self) -> &MemPool {
        &self.shared.pool
    }

    /// Calls `method` with an encoded payload; returns the encoded response. Generated stubs
    /// call this; use it directly for dynamic calls.
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
        self.call_since(tokio::time::Instant::now(), method, payload, opts).await
    }

    /// Calls `method`, the deadline counting from `started` (the generated stubs pass the moment
    /// they were called, so encoding the arguments counts). A call whose deadline has passed
    /// before it is sent is not sent.
    pub(crate) async fn call_since(
        &self,
        started: tokio::time::Instant,
        method: MethodId,
        payload: Bytes,
        opts: &CallOptions,
    ) -> Result<(Bytes, CallInfo), CallError> {
        let timeout = opts.deadline.or(self.shared.default_deadline);
        let remaining = || timeout.map(|t| t.saturating_sub(started.elapsed()));
        let permit = match remaining() {
            Some(Duration::ZERO) => return Err(CallError::DeadlineExceeded),
            Some(t) => tokio::time::timeout(t, self.shared.in_flight.acquire()).await,
            None => Ok(self.shared.in_flight.acquire().await),
        };
        let _permit = match permit {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(CallError::Disconnected("client closed".into())),
            Err(_) => return Err(CallError::DeadlineExceeded),
        };
        let remaining = remaining();
        if remaining == Some(Duration::ZERO) {
            return Err(CallError::DeadlineExceeded);
        }
        let call_id = self.shared.next_call_id.fetch_add(1, Ordering::Relaxed);
        let span = tracing::debug_span!(
            "call",
            call_id,
            method = format_args!("{method:#010x}"),
            len = payload.len()
        );
        let (reply, response) = oneshot::channel();
        let command = Command::Call { call_id, method, payload, timeout: remaining, reply };
        if self.shared.commands.send(command).is_err() {
            return Err(CallError::Disconnected("connection closed".into()));
        }
        let guard = CancelOnDrop { call_id, commands: &self.shared.commands, armed: true };
        let result = response.instrument(span).await;
        guard.disarm();
        result.unwrap_or_else(|_| Err(CallError::Disconnected("connection driver stopped".into())))
    }

    /// Counters of this connection.
    pub async fn stats(&self) -> Result<ConnStats, CallError> {
        let (reply, rx) = oneshot::channel();
        let closed = || CallError::Disconnected("connection closed".into());
        self.shared.commands.send(Command::Stats { reply }).map_err(|_| closed())?;
        rx.await.map_err(|_| closed())
    }

    /// The peer, for logs.
    pub fn peer(&self) -> &str {
        &self.shared.peer
    }
}

/// Sends a cancel for a call whose future is dropped before its response arrives. Sending on an
/// unbounded channel never blocks and spawns nothing.
struct CancelOnDrop<'a> {
    call_id: u64,
    commands: &'a mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl CancelOnDrop<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.commands.send(Command::Cancel { call_id: self.call_id });
        }
    }
}

/// The task that owns a client connection and its state machine.
struct ClientDriver {
    proto: ClientProto,
    conn: Box<dyn Connection>,
    commands: mpsc::UnboundedReceiver<Command>,
    pending: HashMap<u64, Reply>,
    scratch: Vec<Completion>,
    sleep: Pin<Box<Sleep>>,
    closing: bool,
}

impl ClientDriver {
    /// Takes commands from the handles. Returns whether any was taken.
    fn poll_commands(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        for _ in 0..driver::COMPLETION_BATCH {
            match self.commands.poll_recv(cx) {
                Poll::Ready(Some(cmd)) => {
                    progressed = true;
                    self.run_command(cmd);
                }
                Poll::Ready(None) => {
                    self.closing = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        progressed
    }

    fn run_command(&mut self, cmd: Command) {
        match cmd {
            Command::Call { call_id, method, payload, timeout, reply } => {
                match self.proto.start_call(call_id, method, payload, timeout, driver::now()) {
                    Ok(()) => {
                        self.pending.insert(call_id, reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(start_error(e)));
                    }
                }
            }
            Command::Cancel { call_id } => {
                if self.pending.remove(&call_id).is_some() {
                    self.proto.cancel(call_id);
                    tracing::debug!(call_id, "call cancelled by the caller");
                }
            }
            Command::Stats { reply } => {
                let _ = reply.send(ConnStats {
                    proto: self.proto.stats(),
                    transport: self.conn.counters(),
                    calls_in_flight: self.proto.calls_in_flight(),
                });
            }
        }
    }

    fn deliver_events(&mut self) {
        while let Some(ClientEvent::Completed { call_id, result, info }) = self.proto.poll_event() {
            if let Some(reply) = self.pending.remove(&call_id) {
                tracing::debug!(call_id, request = %info.request, response = %info.response, ok = result.is_ok(), "call done");
                let _ = reply.send(result.map(|b| (b, info)).map_err(call_error));
            }
        }
    }

    fn fail(&mut self, fatal: &Fatal) {
        tracing::warn!(error = %fatal, calls = self.pending.len(), "connection failed");
        self.conn.close();
        self.proto.fail_all(&fatal.to_string());
        driver::revoke_after_close(self.conn.as_mut(), &mut self.proto);
        self.deliver_events();
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(CallError::Disconnected(fatal.to_string())));
        }
    }

    fn poll_round(&mut self, cx: &mut Context<'_>) -> Result<bool, Fatal> {
        let mut progressed = self.poll_commands(cx);
        progressed |= driver::poll_completions(cx, self.conn.as_mut(), &mut self.proto, &mut self.scratch)?;
        progressed |= driver::drive_timers(cx, &mut self.proto, &mut self.sleep)?;
        driver::post_ops(self.conn.as_mut(), &mut self.proto)?;
        self.deliver_events();
        Ok(progressed)
    }
}

impl Future for ClientDriver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        for _ in 0..ROUNDS_PER_WAKE {
            match this.poll_round(cx) {
                Err(fatal) => {
                    this.fail(&fatal);
                    return Poll::Ready(());
                }
                // The last handle is gone: close once the cancels and done reports are out and
                // the server has reported our regions READ (bounded by the done timeout).
                Ok(_) if this.closing && this.pending.is_empty() && this.proto.is_idle() => {
                    tracing::debug!("last client handle dropped; closing");
                    this.conn.close();
                    return Poll::Ready(());
                }
                Ok(true) => continue,
                Ok(false) => return Poll::Pending,
            }
        }
        // Work remains: yield to other tasks, then come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

fn start_error(e: StartError) -> CallError {
    match e {
        StartError::TooLarge { len, max } => CallError::PayloadTooLarge { len, max },
        other => CallError::Protocol(other.to_string()),
    }
}

fn call_error(f: CallFailure) -> CallError {
    match f {
        CallFailure::Remote(w) => RemoteError::from(w).into(),
        CallFailure::DeadlineExceeded => CallError::DeadlineExceeded,
        CallFailure::ReadFailed(e) => CallError::Transfer(format!("reading the response: {e}")),
        CallFailure::TooLarge { len, max } => CallError::PayloadTooLarge { len, max },
        CallFailure::RegisterFailed(e) => CallError::Transfer(format!("registering the request: {e}")),
        CallFailure::Disconnected(r) => CallError::Disconnected(r),
    }
}

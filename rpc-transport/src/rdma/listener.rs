//! The rdma listener: a background task takes connect requests from the listening rdma_cm
//! identifier and sets each one up in its own task, so that a slow or silent peer never holds
//! up the others (the setup itself is in `setup.rs`).
//!
//! Bounds, from the listener's [`ConnParams`]:
//!
//! * at most `max_pending_handshakes` setups run at once (each holds a queue pair, a CQ and
//!   `recv_depth * recv_size` bytes of registered receives); up to as many further connect
//!   requests wait for a slot (an rdma_cm identifier each, nothing allocated), and requests
//!   beyond that are refused (the identifier is destroyed, so the peer sees a reject);
//! * each setup must finish within `handshake_timeout` (rdma_cm exchange and the peer's hello),
//!   or it is abandoned and everything it allocated is freed;
//! * a slot is held until the connection is handed to [`Listener::accept`]'s queue, so a server
//!   that stops accepting also stops setting up connections.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use sideway::rdmacm::communication_manager::Identifier;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::cm::{CmChannel, CmEvent, CmSink};
use super::config::RdmaConfig;
use super::conn::RdmaConnection;
use super::device;
use super::error::{chain, RdmaError};
use super::setup::{check_params, passive_setup};
use crate::{Address, BoxFuture, ConnParams, Connection, Listener, TransportError};

/// Set-up connections waiting for `accept` (besides those whose setup task holds a slot while
/// it waits for room here).
const ACCEPT_BACKLOG: usize = 64;
/// rdma_cm's listen backlog.
const CM_BACKLOG: i32 = 64;

/// Listens on `addr` with the configuration from the environment.
pub async fn listen(addr: SocketAddr, params: ConnParams) -> Result<Box<dyn Listener>, TransportError> {
    Ok(Box::new(listen_with(addr, params.clone(), RdmaConfig::from_settings(&params.rdma))?))
}

/// Listens on `addr` (port 0: a free port is picked) with an explicit configuration. Must be
/// called within a tokio runtime (it starts the rdma_cm event task and the accepting task).
pub fn listen_with(
    addr: SocketAddr,
    params: ConnParams,
    cfg: RdmaConfig,
) -> Result<RdmaListener, TransportError> {
    check_params(&params)?;
    device::check_devices(&cfg)?;
    let cm = Arc::new(CmChannel::open()?);
    let listen_err = |a: SocketAddr, e: io::Error| TransportError::Listen { addr: a.to_string(), source: e };
    let mut tries = if addr.port() == 0 { 32 } else { 1 };
    let (id, sink, local) = loop {
        let mut local = addr;
        if addr.port() == 0 {
            local.set_port(rand::Rng::gen_range(&mut rand::thread_rng(), 20000..60000));
        }
        let (id, sink) = cm.create_id()?;
        match id.bind_addr(local) {
            Ok(()) => break (id, sink, local),
            Err(e) => {
                let io = match e.source {
                    sideway::rdmacm::communication_manager::BindAddressErrorKind::Rdmacm(io) => io,
                    other => io::Error::other(other.to_string()),
                };
                tries -= 1;
                if tries == 0 || io.raw_os_error() != Some(libc::EADDRINUSE) {
                    return Err(listen_err(local, io));
                }
            }
        }
    };
    if let (Some(ctx), Some(wanted)) = (id.get_device_context(), cfg.device.as_ref()) {
        use sideway::ibverbs::device::DeviceInfo;
        if ctx.name() != *wanted {
            return Err(RdmaError::WrongDevice {
                addr: local.to_string(),
                chosen: ctx.name(),
                wanted: wanted.clone(),
            }
            .into());
        }
    }
    id.listen(CM_BACKLOG).map_err(|e| listen_err(local, io::Error::other(chain(&e))))?;
    let (ready_tx, ready) = mpsc::channel(ACCEPT_BACKLOG);
    let setup = Setup { params, cfg, cm: Arc::clone(&cm), local };
    let acceptor = tokio::spawn(accept_loop(sink, setup, ready_tx));
    Ok(RdmaListener { id: Some(id), cm, local, ready, acceptor })
}

/// An rdma_cm listening identifier, and the task that sets up its incoming connections.
pub struct RdmaListener {
    id: Option<Arc<Identifier>>,
    cm: Arc<CmChannel>,
    local: SocketAddr,
    ready: mpsc::Receiver<RdmaConnection>,
    acceptor: JoinHandle<()>,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener").field("local", &self.local).finish_non_exhaustive()
    }
}

impl RdmaListener {
    /// The next connection that completed its setup. Connections whose setup failed or timed
    /// out are logged and never returned.
    pub async fn accept_rdma(&mut self) -> Result<RdmaConnection, TransportError> {
        self.ready.recv().await.ok_or_else(|| TransportError::Disconnected("rdma listener stopped".into()))
    }
}

impl Listener for RdmaListener {
    fn accept(&mut self) -> BoxFuture<'_, Result<Box<dyn Connection>, TransportError>> {
        Box::pin(async move { Ok(Box::new(self.accept_rdma().await?) as Box<dyn Connection>) })
    }

    fn local_addr(&self) -> Address {
        Address::Rdma(self.local)
    }
}

impl Drop for RdmaListener {
    fn drop(&mut self) {
        // Stops taking connect requests; setups under way finish (bounded by the handshake
        // timeout) and find nobody to take their connection, which then closes.
        self.acceptor.abort();
        self.id = None;
        self.cm.nudge();
    }
}

/// What each setup task needs.
#[derive(Clone)]
struct Setup {
    params: ConnParams,
    cfg: RdmaConfig,
    cm: Arc<CmChannel>,
    local: SocketAddr,
}

async fn accept_loop(sink: Arc<CmSink>, setup: Setup, ready: mpsc::Sender<RdmaConnection>) {
    let bound = setup.params.max_pending_handshakes;
    let slots = Arc::new(Semaphore::new(bound));
    // Connect requests waiting for a slot (an identifier each, nothing allocated yet).
    let mut waiting: VecDeque<Arc<Identifier>> = VecDeque::new();
    loop {
        tokio::select! {
            ev = sink.next() => match ev {
                CmEvent::ConnectRequest(id) => match Arc::clone(&slots).try_acquire_owned() {
                    Ok(slot) => start(id, slot, &setup, &ready),
                    Err(_) if waiting.len() < bound => waiting.push_back(id),
                    Err(_) => {
                        // Destroying the identifier rejects the request.
                        tracing::warn!(local = %setup.local, bound, "rdma listener: too many connect requests; refusing one");
                        drop(id);
                    }
                },
                other => tracing::debug!(event = ?other, "rdma_cm event on the listener"),
            },
            Ok(slot) = Arc::clone(&slots).acquire_owned(), if !waiting.is_empty() => {
                if let Some(id) = waiting.pop_front() {
                    start(id, slot, &setup, &ready);
                }
            }
        }
    }
}

/// Sets up one connection in its own task, within the handshake timeout.
fn start(
    id: Arc<Identifier>,
    slot: OwnedSemaphorePermit,
    setup: &Setup,
    ready: &mpsc::Sender<RdmaConnection>,
) {
    let (setup, ready) = (setup.clone(), ready.clone());
    tokio::spawn(async move {
        let limit = setup.params.handshake_timeout;
        let result = tokio::time::timeout(
            limit,
            passive_setup(id, &setup.params, &setup.cfg, Arc::clone(&setup.cm), setup.local),
        )
        .await;
        match result {
            Ok(Ok(conn)) => {
                if ready.send(conn).await.is_err() {
                    tracing::debug!(local = %setup.local, "rdma listener gone; dropping new connection");
                }
            }
            Ok(Err(e)) => tracing::warn!(local = %setup.local, error = %e, "rdma connection setup failed"),
            Err(_) => {
                tracing::warn!(local = %setup.local, "incoming rdma connection not set up within {limit:?}")
            }
        }
        drop(slot);
    });
}

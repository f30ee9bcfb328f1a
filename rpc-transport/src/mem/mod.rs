//! In-process fabric with fault injection, for tests and docs.
//!
//! A [`MemFabric`] is a namespace of listeners. [`MemFabric::listen`] binds a name;
//! [`MemFabric::connect`] creates both ends of a connection at once (each with its receives
//! already posted) and hands the server end to the listener's [`Listener::accept`]. SENDs are
//! copied into the peer's posted receive; READs are served from the peer's registered regions
//! with the same key and bounds checks as the `tcp` backend; a refused READ completes with its
//! error and then closes the connection on both ends, as on verbs.
//!
//! Each listener name has a [`FaultPlan`] (see [`faults`]) that injects failures into its
//! connections: kill them, delay completions, fail sends or READs, corrupt messages, make
//! them silently swallow everything (a black hole), or make every send block its thread.
//!
//! ```
//! # use rpc_transport::{mem::MemFabric, ConnParams, Connection, Completion};
//! # use bytes::Bytes;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let fabric = MemFabric::new();
//! let mut listener = fabric.listen("echo", ConnParams::default())?;
//! let mut client = fabric.connect("echo", ConnParams::default()).await?;
//! let mut server = listener.accept().await?;
//!
//! client.post_send(1, Bytes::from_static(b"ping").into())?;
//! let mut done = Vec::new();
//! futures::future::poll_fn(|cx| server.poll_completions(cx, &mut done, 8)).await?;
//! let Completion::Recv { buf } = done.remove(0) else { panic!("expected a message") };
//! assert_eq!(buf.bytes(), b"ping");
//! server.post_recv(buf)?; // give the buffer back to the receive queue
//! # Ok::<(), rpc_transport::TransportError>(())
//! # }).unwrap();
//! ```

mod conn;
mod delay;
mod faults;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::mpsc;

pub use faults::FaultPlan;

use crate::soft::validate_params;
use crate::{Address, BoxFuture, ConnParams, Connection, Listener, TransportError};

/// A process-local fabric: a namespace of listener names.
///
/// Cloning gives another handle to the same fabric.
#[derive(Debug, Clone, Default)]
pub struct MemFabric {
    inner: Arc<FabricInner>,
}

#[derive(Debug, Default)]
struct FabricInner {
    listeners: Mutex<HashMap<String, ListenerSlot>>,
    faults: Mutex<HashMap<String, Arc<FaultPlan>>>,
    next_listener_id: AtomicU64,
}

#[derive(Debug)]
struct ListenerSlot {
    id: u64,
    params: ConnParams,
    incoming: mpsc::Sender<Box<dyn Connection>>,
}

/// The fault plan of listener `name` on the process-wide fabric ([`MemFabric::global`]).
pub fn faults(name: &str) -> Arc<FaultPlan> {
    MemFabric::global().faults(name)
}

impl MemFabric {
    /// A new, empty fabric, independent of every other.
    pub fn new() -> MemFabric {
        MemFabric::default()
    }

    /// The process-wide fabric used by `mem://name` addresses.
    pub fn global() -> &'static MemFabric {
        static GLOBAL: OnceLock<MemFabric> = OnceLock::new();
        GLOBAL.get_or_init(MemFabric::new)
    }

    /// The fault plan shared by every connection made through listener `name` (created on
    /// first use; it exists before and after any listener of that name).
    pub fn faults(&self, name: &str) -> Arc<FaultPlan> {
        self.inner.faults.lock().entry(name.to_string()).or_default().clone()
    }

    /// Binds `name`. Fails if another live listener holds it; the name is free again once the
    /// returned listener is dropped.
    pub fn listen(&self, name: &str, params: ConnParams) -> Result<Box<dyn Listener>, TransportError> {
        validate_params(&params)?;
        let mut listeners = self.inner.listeners.lock();
        if listeners.contains_key(name) {
            return Err(TransportError::Listen {
                addr: format!("mem://{name}"),
                source: io::Error::new(io::ErrorKind::AddrInUse, "mem listener name already bound"),
            });
        }
        let id = self.inner.next_listener_id.fetch_add(1, Ordering::Relaxed);
        let (incoming, rx) = mpsc::channel(params.max_pending_handshakes);
        listeners.insert(name.to_string(), ListenerSlot { id, params, incoming });
        Ok(Box::new(MemListener { fabric: self.inner.clone(), name: name.to_string(), id, incoming: rx }))
    }

    /// Connects to listener `name`. Both ends have their receives posted before this returns;
    /// the server end waits in the listener's accept queue. No listener:
    /// `TransportError::Connect` with `io::ErrorKind::ConnectionRefused`.
    ///
    /// The accept queue holds the listener's `max_pending_handshakes` connections at most; when
    /// it is full, `connect` waits (nothing allocated) for the listener to accept one, up to the
    /// client's `handshake_timeout`, then fails with `TransportError::Handshake`.
    pub async fn connect(
        &self,
        name: &str,
        params: ConnParams,
    ) -> Result<Box<dyn Connection>, TransportError> {
        validate_params(&params)?;
        let refused = |why: &str| TransportError::Connect {
            addr: format!("mem://{name}"),
            source: io::Error::new(io::ErrorKind::ConnectionRefused, why.to_string()),
        };
        let (server_params, incoming) = {
            let listeners = self.inner.listeners.lock();
            let slot = listeners.get(name).ok_or_else(|| refused("no mem listener of that name"))?;
            (slot.params.clone(), slot.incoming.clone())
        };
        let slot = match incoming.try_reserve() {
            Ok(slot) => slot,
            Err(mpsc::error::TrySendError::Closed(())) => return Err(refused("mem listener closed")),
            Err(mpsc::error::TrySendError::Full(())) => {
                let limit = params.handshake_timeout;
                tokio::time::timeout(limit, incoming.reserve())
                    .await
                    .map_err(|_| {
                        TransportError::Handshake(format!(
                            "mem listener {name:?} accepted nothing within {limit:?}"
                        ))
                    })?
                    .map_err(|_| refused("mem listener closed"))?
            }
        };
        let (client, server) = conn::pair(name, &params, &server_params, self.faults(name));
        slot.send(Box::new(server));
        Ok(Box::new(client))
    }
}

/// A bound name on a [`MemFabric`].
#[derive(Debug)]
struct MemListener {
    fabric: Arc<FabricInner>,
    name: String,
    id: u64,
    incoming: mpsc::Receiver<Box<dyn Connection>>,
}

impl Listener for MemListener {
    fn accept(&mut self) -> BoxFuture<'_, Result<Box<dyn Connection>, TransportError>> {
        Box::pin(async move {
            self.incoming
                .recv()
                .await
                .ok_or_else(|| TransportError::Disconnected("mem listener closed".into()))
        })
    }

    fn local_addr(&self) -> Address {
        Address::Mem(self.name.clone())
    }
}

impl Drop for MemListener {
    fn drop(&mut self) {
        let mut listeners = self.fabric.listeners.lock();
        if listeners.get(&self.name).is_some_and(|slot| slot.id == self.id) {
            listeners.remove(&self.name);
        }
    }
}

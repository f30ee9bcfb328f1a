//! The tcp listener: accepts sockets in a background task and runs each handshake in its own
//! task, so that a slow or broken client never holds up the others.
//!
//! At most [`ConnParams::max_pending_handshakes`] connections are being set up at once (or wait,
//! set up, for [`Listener::accept`]'s queue, so a server that stops accepting also stops taking
//! new sockets). When all of them are taken and a new client arrives, the oldest one still
//! waiting for its hello is dropped to make room: a peer that opens silent sockets cannot keep
//! others out, since an honest client sends its hello within a round trip of connecting. When
//! every pending connection is past its hello, further clients wait in the kernel's listen
//! backlog, costing us nothing.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinHandle};

use super::accept_stream;
use super::push::PushPool;
use crate::soft::validate_params;
use crate::{Address, BoxFuture, ConnParams, Connection, Listener, TransportError};

/// Established connections waiting for `accept` (besides those whose handshake task holds a
/// permit while it waits for room here).
const ACCEPT_BACKLOG: usize = 64;

/// Binds `addr` (port 0 picks a free port; see [`Listener::local_addr`]) and starts accepting.
pub async fn listen(addr: SocketAddr, params: ConnParams) -> Result<Box<dyn Listener>, TransportError> {
    validate_params(&params)?;
    let listen_error = |source| TransportError::Listen { addr: addr.to_string(), source };
    let socket = TcpListener::bind(addr).await.map_err(listen_error)?;
    let local = socket.local_addr().map_err(listen_error)?;
    let (ready_tx, ready) = mpsc::channel(ACCEPT_BACKLOG);
    let acceptor = tokio::spawn(accept_loop(socket, params, ready_tx));
    Ok(Box::new(TcpListenerHandle { ready, local, acceptor }))
}

#[derive(Debug)]
struct TcpListenerHandle {
    ready: mpsc::Receiver<Box<dyn Connection>>,
    local: SocketAddr,
    acceptor: JoinHandle<()>,
}

impl Listener for TcpListenerHandle {
    fn accept(&mut self) -> BoxFuture<'_, Result<Box<dyn Connection>, TransportError>> {
        Box::pin(async move {
            self.ready.recv().await.ok_or_else(|| TransportError::Disconnected("tcp listener stopped".into()))
        })
    }

    fn local_addr(&self) -> Address {
        Address::Tcp(self.local)
    }
}

impl Drop for TcpListenerHandle {
    fn drop(&mut self) {
        // Closes the listening socket. Handshakes under way finish and find nobody to take
        // their connection, which then closes.
        self.acceptor.abort();
    }
}

/// Handshakes still waiting for the peer's hello, oldest first: the ones that may be evicted.
type AwaitingHello = Arc<Mutex<VecDeque<(u64, AbortHandle)>>>;

async fn accept_loop(socket: TcpListener, params: ConnParams, ready: mpsc::Sender<Box<dyn Connection>>) {
    let handshakes = Arc::new(Semaphore::new(params.max_pending_handshakes));
    let push_pool = PushPool::new(params.tcp.push_listener_total);
    let awaiting: AwaitingHello = Arc::default();
    let mut next_id = 0u64;
    loop {
        let mut permit = handshakes.clone().try_acquire_owned().ok();
        if permit.is_none() && awaiting.lock().is_empty() {
            // Every pending connection is past its hello: let new clients wait in the backlog.
            let Ok(p) = handshakes.clone().acquire_owned().await else { return };
            permit = Some(p);
        }
        match socket.accept().await {
            Ok((stream, peer)) => {
                let permit = match permit {
                    Some(p) => p,
                    None => {
                        evict_oldest(&awaiting);
                        let Ok(p) = handshakes.clone().acquire_owned().await else { return };
                        p
                    }
                };
                next_id += 1;
                let id = next_id;
                let task = handshake_one(
                    stream,
                    peer,
                    params.clone(),
                    push_pool.clone(),
                    ready.clone(),
                    permit,
                    (id, awaiting.clone()),
                );
                let handle = tokio::spawn(task).abort_handle();
                awaiting.lock().push_back((id, handle));
            }
            Err(e) => {
                drop(permit);
                // Typically out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "tcp accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Drops the oldest handshake still waiting for its hello (its permit is released as its task
/// is dropped).
fn evict_oldest(awaiting: &AwaitingHello) {
    let mut q = awaiting.lock();
    while let Some((_, handle)) = q.pop_front() {
        if !handle.is_finished() {
            tracing::debug!("all handshake slots taken: dropping the oldest peer still silent");
            handle.abort();
            return;
        }
    }
}

async fn handshake_one(
    stream: TcpStream,
    peer: SocketAddr,
    params: ConnParams,
    push_pool: Arc<PushPool>,
    ready: mpsc::Sender<Box<dyn Connection>>,
    permit: OwnedSemaphorePermit,
    (id, awaiting): (u64, AwaitingHello),
) {
    let setup = accept_stream(stream, &params, peer, push_pool).await;
    // Past the hello (or failed): no longer a candidate for eviction.
    awaiting.lock().retain(|(i, _)| *i != id);
    match setup {
        Ok(conn) => {
            if ready.send(Box::new(conn)).await.is_err() {
                tracing::debug!(%peer, "tcp listener gone; dropping new connection");
            }
        }
        Err(e) => tracing::warn!(%peer, error = %e, "tcp connection setup failed"),
    }
    drop(permit);
}

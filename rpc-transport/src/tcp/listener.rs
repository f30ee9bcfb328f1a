//! The tcp listener: accepts sockets in a background task and runs each handshake in its own
//! task, so that a slow or broken client never holds up the others.
//!
//! At most [`ConnParams::max_pending_handshakes`] handshakes run at once: a permit is taken
//! *before* `accept()`, so further clients wait in the kernel's listen backlog (costing us
//! nothing) rather than as accepted sockets. A permit is held until the connection is handed to
//! [`Listener::accept`]'s queue (or its setup failed), so a server that stops accepting also
//! stops taking new sockets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::accept_stream;
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

async fn accept_loop(socket: TcpListener, params: ConnParams, ready: mpsc::Sender<Box<dyn Connection>>) {
    let handshakes = Arc::new(Semaphore::new(params.max_pending_handshakes));
    loop {
        // The permit first: beyond the bound, clients wait in the kernel backlog, not accepted.
        let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
        match socket.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(handshake_one(stream, peer, params.clone(), ready.clone(), permit));
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

async fn handshake_one(
    stream: TcpStream,
    peer: SocketAddr,
    params: ConnParams,
    ready: mpsc::Sender<Box<dyn Connection>>,
    permit: OwnedSemaphorePermit,
) {
    match accept_stream(stream, &params, peer).await {
        Ok(conn) => {
            if ready.send(Box::new(conn)).await.is_err() {
                tracing::debug!(%peer, "tcp listener gone; dropping new connection");
            }
        }
        Err(e) => tracing::warn!(%peer, error = %e, "tcp connection setup failed"),
    }
    drop(permit);
}

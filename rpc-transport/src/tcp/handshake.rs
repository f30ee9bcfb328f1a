//! Connection setup over a fresh TCP stream: exchange and validate hellos.
//!
//! The two sides do not do the same thing, so that a peer cannot make us allocate before it has
//! proven it speaks our protocol with sane sizes:
//!
//! * the **connecting** side allocates its receive pool (posting its receives), sends its hello,
//!   then reads and validates the listener's;
//! * the **accepting** side first reads and validates the client's hello, only then allocates its
//!   receive pool, and sends its hello last.
//!
//! Either way our receives are posted before our hello leaves, so the peer may send as soon as it
//! has read it. Each side's whole setup is bounded by [`ConnParams::handshake_timeout`]: a client
//! that connects and stays silent costs the listener one socket for that long, nothing more.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::wire::{self, HELLO_FIXED};
use crate::soft::Soft;
use crate::{ConnParams, TransportError};

/// What the peer announced.
#[derive(Debug, Clone)]
pub(crate) struct PeerHello {
    pub(crate) recv_depth: u32,
    pub(crate) recv_size: u32,
    pub(crate) push_window: u64,
    pub(crate) private_data: Bytes,
}

/// The connecting side: allocates and posts our receives, sends our hello, reads the peer's.
pub(crate) async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ours: &ConnParams,
) -> Result<(Arc<Soft>, PeerHello), TransportError> {
    bounded(ours, async {
        let soft = Soft::new(ours);
        send_hello(stream, ours).await?;
        let theirs = read_hello(stream).await?;
        Ok((soft, theirs))
    })
    .await
}

/// The accepting side: reads and validates the client's hello, then allocates and posts our
/// receives, then sends our hello.
pub(crate) async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ours: &ConnParams,
) -> Result<(Arc<Soft>, PeerHello), TransportError> {
    bounded(ours, async {
        let theirs = read_hello(stream).await?;
        let soft = Soft::new(ours);
        send_hello(stream, ours).await?;
        Ok((soft, theirs))
    })
    .await
}

async fn bounded<T>(
    ours: &ConnParams,
    setup: impl std::future::Future<Output = Result<T, TransportError>>,
) -> Result<T, TransportError> {
    let limit = ours.handshake_timeout;
    tokio::time::timeout(limit, setup)
        .await
        .map_err(|_| TransportError::Handshake(format!("no hello within {limit:?}")))?
}

fn failed(what: &str, e: std::io::Error) -> TransportError {
    TransportError::Handshake(format!("{what}: {e}"))
}

async fn send_hello<S: AsyncWrite + Unpin>(stream: &mut S, ours: &ConnParams) -> Result<(), TransportError> {
    stream.write_all(&wire::encode_hello(ours)).await.map_err(|e| failed("sending hello", e))?;
    stream.flush().await.map_err(|e| failed("sending hello", e))
}

/// Reads the peer's hello; any bad value or early end of stream is a `Handshake` error. Nothing
/// larger than the fixed header plus 256 bytes of private data is ever allocated here.
async fn read_hello<S: AsyncRead + Unpin>(stream: &mut S) -> Result<PeerHello, TransportError> {
    let mut fixed = [0u8; HELLO_FIXED];
    stream.read_exact(&mut fixed).await.map_err(|e| failed("reading hello", e))?;
    let header = wire::decode_hello(&fixed).map_err(TransportError::Handshake)?;
    let mut private = vec![0u8; header.private_len];
    stream.read_exact(&mut private).await.map_err(|e| failed("reading private data", e))?;
    Ok(PeerHello {
        recv_depth: header.recv_depth,
        recv_size: header.recv_size,
        push_window: header.push_window,
        private_data: Bytes::from(private),
    })
}

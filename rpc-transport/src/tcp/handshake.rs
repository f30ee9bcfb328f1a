//! Connection setup over a fresh TCP stream: exchange and validate hellos.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::wire::{self, HELLO_FIXED};
use crate::{ConnParams, TransportError};

/// How long the peer has to complete its hello.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the peer announced.
#[derive(Debug, Clone)]
pub(crate) struct PeerHello {
    pub(crate) recv_depth: u32,
    pub(crate) recv_size: u32,
    pub(crate) private_data: Bytes,
}

/// Sends our hello and reads the peer's, within [`HANDSHAKE_TIMEOUT`]. Any bad value, early
/// end of stream or timeout is a `Handshake` error.
pub(crate) async fn exchange_hello<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ours: &ConnParams,
) -> Result<PeerHello, TransportError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange(stream, ours))
        .await
        .map_err(|_| TransportError::Handshake(format!("no hello within {HANDSHAKE_TIMEOUT:?}")))?
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ours: &ConnParams,
) -> Result<PeerHello, TransportError> {
    let failed = |what: &str, e: std::io::Error| TransportError::Handshake(format!("{what}: {e}"));
    stream.write_all(&wire::encode_hello(ours)).await.map_err(|e| failed("sending hello", e))?;
    stream.flush().await.map_err(|e| failed("sending hello", e))?;
    let mut fixed = [0u8; HELLO_FIXED];
    stream.read_exact(&mut fixed).await.map_err(|e| failed("reading hello", e))?;
    let header = wire::decode_hello(&fixed).map_err(TransportError::Handshake)?;
    let mut private = vec![0u8; header.private_len];
    stream.read_exact(&mut private).await.map_err(|e| failed("reading private data", e))?;
    Ok(PeerHello {
        recv_depth: header.recv_depth,
        recv_size: header.recv_size,
        private_data: Bytes::from(private),
    })
}

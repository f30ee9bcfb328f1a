//! A raw TCP ping-pong on tokio streams: the floor any RPC over TCP is measured against.
//!
//! Request: `[u32 request_len][u32 response_len][request bytes]`; response:
//! `[u32 len][bytes]` (little endian). One call at a time per connection (a client with more
//! outstanding calls queues them on the connection's lock).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use rpc_core::CallInfo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::counters::Counters;
use crate::target::{check, payload, Expect, ProtoSettings, Target};
use crate::workload::Workload;
use crate::BenchError;

/// Largest length either side accepts; a larger one closes the connection.
const MAX_LEN: u32 = 1 << 30;

/// Binds `addr` and echoes on every connection.
pub async fn serve(addr: SocketAddr) -> Result<(SocketAddr, JoinHandle<()>), BenchError> {
    let listener = TcpListener::bind(addr).await.map_err(|e| BenchError::connect(&addr.to_string(), e))?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                if let Err(e) = serve_connection(stream).await {
                    tracing::debug!(error = %e, "raw tcp connection ended");
                }
            });
        }
    });
    Ok((local, task))
}

async fn serve_connection(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = Vec::new();
    let mut fill = Vec::new();
    loop {
        let mut head = [0u8; 8];
        if stream.read_exact(&mut head).await.is_err() {
            return Ok(()); // the client closed
        }
        let req_len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let resp_len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if req_len > MAX_LEN || resp_len > MAX_LEN {
            return Err(std::io::Error::other("length over the limit"));
        }
        buf.resize(req_len as usize, 0);
        stream.read_exact(&mut buf).await?;
        let body: &[u8] = if resp_len == req_len {
            &buf
        } else {
            fill.resize(resp_len as usize, 0xa5);
            &fill[..resp_len as usize]
        };
        let len = resp_len.to_le_bytes();
        let mut out = Buf::chain(&len[..], body);
        stream.write_all_buf(&mut out).await?;
    }
}

/// A raw TCP client connection.
#[derive(Debug, Clone)]
pub struct RawTarget {
    conn: Arc<Mutex<(TcpStream, Vec<u8>)>>,
}

/// A prepared raw request.
#[derive(Debug, Clone)]
pub struct RawPrepared {
    head: [u8; 8],
    body: Bytes,
    response_len: usize,
}

impl Target for RawTarget {
    type Prepared = RawPrepared;

    async fn connect(addr: &str, _: &ProtoSettings) -> Result<Self, BenchError> {
        let stream =
            TcpStream::connect(super::tcp_socket(addr)?).await.map_err(|e| BenchError::connect(addr, e))?;
        stream.set_nodelay(true)?;
        Ok(RawTarget { conn: Arc::new(Mutex::new((stream, Vec::new()))) })
    }

    fn prepare(&self, workload: Workload, size: usize) -> Result<RawPrepared, BenchError> {
        let (req, resp) = workload.bytes(size);
        let too_big = |_| BenchError::Usage(format!("raw-tcp takes at most {MAX_LEN} bytes"));
        let (r, s) = (u32::try_from(req).map_err(too_big)?, u32::try_from(resp).map_err(too_big)?);
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&r.to_le_bytes());
        head[4..].copy_from_slice(&s.to_le_bytes());
        Ok(RawPrepared { head, body: payload(req), response_len: resp })
    }

    async fn call<'a>(&'a self, p: &'a RawPrepared) -> Result<CallInfo, BenchError> {
        let io = |e: std::io::Error| BenchError::Call(format!("raw tcp: {e}"));
        let mut guard = self.conn.lock().await;
        let (stream, buf) = &mut *guard;
        let mut out = Buf::chain(&p.head[..], &p.body[..]);
        stream.write_all_buf(&mut out).await.map_err(io)?;
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await.map_err(io)?;
        let len = u32::from_le_bytes(len);
        if len > MAX_LEN {
            return Err(BenchError::Call(format!("raw tcp: response length {len} over the limit")));
        }
        buf.resize(len as usize, 0);
        stream.read_exact(buf).await.map_err(io)?;
        check(Expect::Bytes(p.response_len), Some(buf.len()), None)?;
        Ok(CallInfo::default())
    }

    async fn counters(&self) -> Option<Counters> {
        None
    }
}

//! A hand-written ping-pong straight on this project's transport seam (rpc-transport's
//! [`Connection`], no rpc-core): the floor of the transport rpc-core runs on, over any address
//! (`mem://`, `tcp://`, `rdma://`). Next to perftest in the VM it tells how much of rpc-core's
//! round trip is the transport and tokio (this) and how much the RPC layers above (the rest).
//!
//! One SEND each way, one call at a time per connection (a client with more outstanding calls
//! queues them on the connection's lock): the request is `[u32 response_len][request bytes]`
//! (little endian), the response `response_len` bytes (the request's bytes for an echo). Both sides
//! use the transport's defaults (`ConnParams::default()`, so `RPC_RDMA_*` such as the busy-poll
//! window apply), send from buffers of the connection's pool, and post each receive buffer
//! again as soon as its message is read: a message is at most the peer's receive size (8 KiB +
//! 128 by default). No credits are needed: each side has at most one message in flight.

use std::future::poll_fn;
use std::sync::Arc;

use rpc_core::transport::{Address, Completion, ConnParams, Connection, SendBuf, TransportError};
use rpc_core::CallInfo;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::counters::Counters;
use crate::target::{check, Expect, ProtoSettings, Target};
use crate::workload::Workload;
use crate::BenchError;

/// Completions taken per poll.
const BATCH: usize = 16;
/// The request's prefix: the response length.
const PREFIX: usize = 4;

/// Binds `listen` and answers on every connection.
pub async fn serve(listen: &str) -> Result<(String, JoinHandle<()>), BenchError> {
    let addr: Address = listen.parse().map_err(|e| BenchError::connect(listen, e))?;
    let mut listener = rpc_core::transport::listen(&addr, ConnParams::default())
        .await
        .map_err(|e| BenchError::connect(listen, e))?;
    let local = listener.local_addr().to_string();
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok(conn) => {
                    tokio::spawn(async move {
                        if let Err(e) = serve_connection(conn).await {
                            tracing::debug!(error = %e, "raw transport connection ended");
                        }
                    });
                }
                Err(e) => {
                    // A failed setup is not returned here (the listener logs it); what is
                    // returned means the listener itself failed.
                    tracing::warn!(error = %e, "raw transport listener failed");
                    return;
                }
            }
        }
    });
    Ok((local, task))
}

/// Answers each request as it arrives, until the connection ends.
async fn serve_connection(mut conn: Box<dyn Connection>) -> Result<(), TransportError> {
    let mut out = Vec::with_capacity(BATCH);
    let mut next_wr = 0;
    loop {
        if poll_fn(|cx| conn.poll_completions(cx, &mut out, BATCH)).await.is_err() {
            return Ok(()); // the client closed (or the connection failed): nothing to answer
        }
        for completion in out.drain(..) {
            match completion {
                Completion::Recv { buf } => {
                    let msg = buf.bytes();
                    let Some((len, request)) = msg.split_first_chunk::<PREFIX>() else {
                        return Err(TransportError::Malformed("a raw request without its length".into()));
                    };
                    let len = u32::from_le_bytes(*len) as usize;
                    let mut response = conn.pool().alloc(len)?;
                    match len == request.len() {
                        true => response.copy_from_slice(request),
                        false => response.fill(0xa5),
                    }
                    conn.post_send(next_wr, SendBuf::Owned(response))?;
                    next_wr += 1;
                    conn.post_recv(buf.reuse())?;
                }
                Completion::Send { result, .. } => result?,
                // No READ is ever posted here.
                _ => return Err(TransportError::Malformed("a completion of no SEND or receive".into())),
            }
        }
    }
}

/// A raw transport client connection.
#[derive(Clone)]
pub struct RawTransportTarget {
    conn: Arc<Mutex<Client>>,
}

impl std::fmt::Debug for RawTransportTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawTransportTarget").finish_non_exhaustive()
    }
}

/// One connection and what its calls reuse.
struct Client {
    conn: Box<dyn Connection>,
    completions: Vec<Completion>,
    next_wr: u64,
}

/// A prepared raw request: its bytes (the length prefix and the payload) and the answer's size.
#[derive(Debug, Clone)]
pub struct RawTransportPrepared {
    request: Vec<u8>,
    response_len: usize,
}

impl Target for RawTransportTarget {
    type Prepared = RawTransportPrepared;

    async fn connect(addr: &str, _: &ProtoSettings) -> Result<Self, BenchError> {
        let parsed: Address = addr.parse().map_err(|e| BenchError::connect(addr, e))?;
        let conn = rpc_core::transport::connect(&parsed, ConnParams::default())
            .await
            .map_err(|e| BenchError::connect(addr, e))?;
        let client = Client { conn, completions: Vec::with_capacity(BATCH), next_wr: 0 };
        Ok(RawTransportTarget { conn: Arc::new(Mutex::new(client)) })
    }

    fn prepare(&self, workload: Workload, size: usize) -> Result<RawTransportPrepared, BenchError> {
        let (req, resp) = workload.bytes(size);
        let limit = ConnParams::default().recv_size as usize;
        if req + PREFIX > limit || resp > limit {
            return Err(BenchError::Usage(format!(
                "raw-transport sends one message each way: at most {} bytes out and {limit} back",
                limit - PREFIX
            )));
        }
        let mut request = Vec::with_capacity(PREFIX + req);
        request.extend_from_slice(&(resp as u32).to_le_bytes());
        request.extend_from_slice(&crate::target::payload(req));
        Ok(RawTransportPrepared { request, response_len: resp })
    }

    async fn call<'a>(&'a self, p: &'a RawTransportPrepared) -> Result<CallInfo, BenchError> {
        let failed = |e: TransportError| BenchError::Call(format!("raw transport: {e}"));
        let mut guard = self.conn.lock().await;
        let Client { conn, completions, next_wr } = &mut *guard;
        let mut request = conn.pool().alloc(p.request.len()).map_err(failed)?;
        request.copy_from_slice(&p.request);
        conn.post_send(*next_wr, SendBuf::Owned(request)).map_err(failed)?;
        *next_wr += 1;
        loop {
            poll_fn(|cx| conn.poll_completions(cx, completions, BATCH)).await.map_err(failed)?;
            let mut answer = None;
            for completion in completions.drain(..) {
                match completion {
                    Completion::Recv { buf } => {
                        answer = Some(buf.bytes().len());
                        conn.post_recv(buf.reuse()).map_err(failed)?;
                    }
                    Completion::Send { result, .. } => result.map_err(failed)?,
                    // No READ is ever posted here.
                    _ => {
                        return Err(BenchError::Call(
                            "raw transport: a completion of no SEND or receive".into(),
                        ))
                    }
                }
            }
            if let Some(len) = answer {
                check(Expect::Bytes(p.response_len), Some(len), None)?;
                return Ok(CallInfo::default());
            }
        }
    }

    async fn counters(&self) -> Option<Counters> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem_address(tag: &str) -> String {
        format!("mem://raw-transport-{tag}-{}", std::process::id())
    }

    #[tokio::test]
    async fn echoes_and_answers_the_length_asked_for() {
        let (addr, server) = serve(&mem_address("ok")).await.expect("bound");
        let target = RawTransportTarget::connect(&addr, &ProtoSettings::default()).await.expect("connected");
        for (workload, size) in [(Workload::Echo, 32), (Workload::Echo, 8192), (Workload::Download, 4096)] {
            let p = target.prepare(workload, size).expect("fits one message");
            for _ in 0..3 {
                target.call(&p).await.expect("answered with the size asked for");
            }
        }
        assert!(target.prepare(Workload::Echo, 64 << 10).is_err(), "one message each way: refused");
        server.abort();
    }

    /// A request too short to carry its length closes the connection (the server's end answers
    /// with a typed error, not a panic), and the server goes on serving other connections.
    #[tokio::test]
    async fn a_malformed_request_closes_its_connection_only() {
        let (addr, server) = serve(&mem_address("bad")).await.expect("bound");
        let parsed: Address = addr.parse().unwrap();
        let mut conn = rpc_core::transport::connect(&parsed, ConnParams::default()).await.expect("connected");
        conn.post_send(0, SendBuf::from(&b"ab"[..])).expect("posted");
        let mut out = Vec::new();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                if poll_fn(|cx| conn.poll_completions(cx, &mut out, BATCH)).await.is_err() {
                    return out.iter().filter(|c| matches!(c, Completion::Recv { .. })).count();
                }
            }
        })
        .await
        .expect("the server closed the connection");
        assert_eq!(ended, 0, "no answer to a malformed request");
        let target = RawTransportTarget::connect(&addr, &ProtoSettings::default()).await.expect("connected");
        target.call(&target.prepare(Workload::Echo, 32).unwrap()).await.expect("served");
        server.abort();
    }
}

//! A raw TCP ping-pong on tokio streams: the floor any RPC over TCP is measured against.
//!
//! Request: `[u32 request_len][u32 response_len][request bytes]`; response:
//! `[u32 len][bytes]` (little endian). One call at a time per connection (a client with more
//! outstanding calls queues them on the connection's lock).
//!
//! Each side reads into a buffer of its own whatever the socket has (`read_frame`): a small
//! message takes one `recv`, as in rpc-core's and tarpc's readers. (Until 2026-12-07 the header
//! and the body were read apart, two `recv`s a message: 5.2 `recvfrom` a call where one `recv` a
//! message makes 2.0, and a floor that was ~0.9 us too high on the host of BENCHMARKS.md's
//! session 65.)

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
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

/// Reads until `rx` starts with a whole frame: a header of `head` bytes whose first four are the
/// body's length (little endian), then the body. Returns the frame's length; `None` at the end
/// of the stream before a frame began. Each read takes whatever the socket has (one `recv` for a
/// small message), into room for the whole frame once its header is known.
async fn read_frame(
    stream: &mut TcpStream,
    rx: &mut BytesMut,
    head: usize,
) -> std::io::Result<Option<usize>> {
    loop {
        let want = match rx.get(..4) {
            Some(len) => {
                let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
                if len > MAX_LEN {
                    return Err(std::io::Error::other("length over the limit"));
                }
                head + len as usize
            }
            None => head,
        };
        // `want` is never below `head`: a whole frame lies in `rx`.
        if rx.len() >= want {
            return Ok(Some(want));
        }
        // Room for the rest of the frame, and at least 4 KiB (a first read of a small message
        // whose header is not known yet).
        rx.reserve(want.max(4096) - rx.len());
        if stream.read_buf(rx).await? == 0 {
            return match rx.is_empty() {
                true => Ok(None),
                false => Err(std::io::ErrorKind::UnexpectedEof.into()),
            };
        }
    }
}

async fn serve_connection(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut rx = BytesMut::new();
    let mut fill = Vec::new();
    while let Some(frame) = read_frame(&mut stream, &mut rx, 8).await? {
        let req_len = frame - 8;
        let resp_len = u32::from_le_bytes([rx[4], rx[5], rx[6], rx[7]]);
        if resp_len > MAX_LEN {
            return Err(std::io::Error::other("length over the limit"));
        }
        let body: &[u8] = if resp_len as usize == req_len {
            &rx[8..frame]
        } else {
            fill.resize(resp_len as usize, 0xa5);
            &fill[..resp_len as usize]
        };
        let len = resp_len.to_le_bytes();
        let mut out = Buf::chain(&len[..], body);
        stream.write_all_buf(&mut out).await?;
        rx.advance(frame);
    }
    Ok(()) // the client closed
}

/// A raw TCP client connection.
#[derive(Debug, Clone)]
pub struct RawTarget {
    conn: Arc<Mutex<(TcpStream, BytesMut)>>,
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
        Ok(RawTarget { conn: Arc::new(Mutex::new((stream, BytesMut::new()))) })
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
        let (stream, rx) = &mut *guard;
        let mut out = Buf::chain(&p.head[..], &p.body[..]);
        stream.write_all_buf(&mut out).await.map_err(io)?;
        let frame = read_frame(stream, rx, 4)
            .await
            .map_err(io)?
            .ok_or_else(|| BenchError::Call("raw tcp: the server closed the connection".into()))?;
        rx.advance(frame);
        check(Expect::Bytes(p.response_len), Some(frame - 4), None)?;
        Ok(CallInfo::default())
    }

    async fn counters(&self) -> Option<Counters> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair of loopback streams.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(listener.local_addr().unwrap()), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    fn frame(head: usize, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; head];
        f[..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
        f.extend_from_slice(body);
        f
    }

    #[tokio::test]
    async fn frames_are_read_whole_however_the_bytes_come() {
        let (mut tx, mut rx_stream) = pair().await;
        tx.set_nodelay(true).unwrap();
        let mut rx = BytesMut::new();
        // Two frames in one write: both come out, one at a time.
        let mut two = frame(8, b"first");
        two.extend(frame(8, b"second!"));
        tx.write_all(&two).await.unwrap();
        let f = read_frame(&mut rx_stream, &mut rx, 8).await.unwrap().unwrap();
        assert_eq!(&rx[8..f], b"first");
        rx.advance(f);
        let f = read_frame(&mut rx_stream, &mut rx, 8).await.unwrap().unwrap();
        assert_eq!(&rx[8..f], b"second!");
        rx.advance(f);
        // One frame (larger than the first read's room) in pieces: the header split too.
        let big = frame(4, &[7u8; 10_000]);
        let writer = tokio::spawn(async move {
            for piece in [&big[..2], &big[2..3000], &big[3000..]] {
                tx.write_all(piece).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            tx
        });
        let f = read_frame(&mut rx_stream, &mut rx, 4).await.unwrap().unwrap();
        assert_eq!(f, 4 + 10_000);
        assert!(rx[4..f].iter().all(|&b| b == 7));
        rx.advance(f);
        // The end of the stream between frames is no error; inside one it is.
        drop(writer.await.unwrap());
        assert!(read_frame(&mut rx_stream, &mut rx, 4).await.unwrap().is_none());
        let (mut tx, mut rx_stream) = pair().await;
        tx.write_all(&frame(4, b"cut short")[..6]).await.unwrap();
        drop(tx);
        let err = read_frame(&mut rx_stream, &mut BytesMut::new(), 4).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_length_over_the_limit_is_refused_before_room_is_made_for_it() {
        let (mut tx, mut rx_stream) = pair().await;
        tx.write_all(&(MAX_LEN + 1).to_le_bytes()).await.unwrap();
        let mut rx = BytesMut::new();
        let err = read_frame(&mut rx_stream, &mut rx, 4).await.unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
        assert!(rx.capacity() < 1 << 20, "no room made for the length read: {}", rx.capacity());
    }
}

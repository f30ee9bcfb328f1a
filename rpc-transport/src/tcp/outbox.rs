//! The way out to the socket: frames queued for the writer task, or a SEND written at once by
//! the caller (the connection's driver) when the writer is idle.
//!
//! The direct write saves the writer task's wake-up (and the driver's second one for the
//! completion) on every small call; the writer task keeps everything else: large payloads,
//! bursts (one vectored write for many frames), the rest of a partial write, and frames from the
//! reader task. Mutual exclusion is a flag under a mutex: whoever queues a frame sets `busy`, and
//! the writer clears it only when it finds its queue empty under the same lock, so the writer
//! writes only while `busy` and a direct write happens only while not: bytes never interleave.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

use super::wire;
use super::writer::Outgoing;
use crate::soft::OpId;
use crate::SendBuf;

/// Payloads up to this size may be written by the caller at once; larger ones go to the writer.
pub(crate) const DIRECT_MAX: usize = 64 * 1024;

/// The frames' way to the writer task, shared by the connection, the reader task and the writer.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::UnboundedSender<Outgoing>,
    /// The writer has frames queued or is writing.
    busy: Mutex<bool>,
    /// The socket, for direct writes and for the writer (`None` in tests without a socket).
    stream: Option<OwnedWriteHalf>,
}

/// What became of a SEND offered for a direct write.
#[derive(Debug)]
pub(crate) enum Direct {
    /// Written whole: complete it.
    Written,
    /// Handed to the writer (busy, would block, too large, or partly written).
    Queued,
}

impl Outbox {
    /// An outbox over the write half of a socket.
    pub(crate) fn new(tx: mpsc::UnboundedSender<Outgoing>, stream: Option<OwnedWriteHalf>) -> Self {
        Outbox { inner: Arc::new(Inner { tx, busy: Mutex::new(false), stream }) }
    }

    fn lock(&self) -> MutexGuard<'_, bool> {
        self.inner.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a frame for the writer. `Err` if the writer is gone (the endpoint is dead).
    pub(crate) fn queue(&self, frame: Outgoing) -> Result<(), mpsc::error::SendError<Outgoing>> {
        let mut busy = self.lock();
        *busy = true;
        self.inner.tx.send(frame)
    }

    /// Writes the SEND frame of `msg` at once if the writer is idle and the socket takes it all
    /// without blocking; otherwise queues it for the writer (what is left of it after a partial
    /// write).
    pub(crate) fn send_now(&self, op: OpId, msg: SendBuf) -> Direct {
        let mut busy = self.lock();
        let stream = match &self.inner.stream {
            Some(s) if !*busy && msg.len() <= DIRECT_MAX => s,
            _ => {
                *busy = true;
                let _ = self.inner.tx.send(Outgoing::Send { op, msg });
                return Direct::Queued;
            }
        };
        let header = wire::encode_send(msg.len() as u32);
        let total = header.len() + msg.len();
        // Would block, or failed: the writer takes it all (and meets the error, if any).
        let written = stream.try_write_vectored(&[IoSlice::new(&header), IoSlice::new(&msg)]).unwrap_or(0);
        if written == total {
            return Direct::Written;
        }
        *busy = true;
        if written == 0 {
            let _ = self.inner.tx.send(Outgoing::Send { op, msg });
            return Direct::Queued;
        }
        // The rest, for the writer: frozen (it may outlive this call in the writer's queue).
        let msg = msg.into_bytes();
        let frame = if written < header.len() {
            Outgoing::SendRest { op, head: Bytes::copy_from_slice(&header[written..]), body: msg }
        } else {
            Outgoing::SendRest { op, head: Bytes::new(), body: msg.slice(written - header.len()..) }
        };
        let _ = self.inner.tx.send(frame);
        Direct::Queued
    }

    /// The writer wrote what it had taken: marks it idle unless more frames are queued (then it
    /// takes them next; the connection keeps away from the socket meanwhile).
    pub(crate) fn idle_unless_queued(&self, rx: &mpsc::UnboundedReceiver<Outgoing>) {
        let mut busy = self.lock();
        if rx.is_empty() {
            *busy = false;
        }
    }

    /// The socket as an `AsyncWrite` for the writer task.
    pub(crate) fn writer(&self) -> SharedWrite {
        SharedWrite { outbox: self.clone() }
    }

    /// Shuts the socket down for writing (the peer sees EOF), when the writer stops.
    pub(crate) fn shutdown(&self) {
        if let Some(s) = &self.inner.stream {
            let _ = socket2::SockRef::from(s.as_ref()).shutdown(std::net::Shutdown::Write);
        }
    }
}

/// The shared write half as an `AsyncWrite` (readiness, then non-blocking writes).
#[derive(Debug)]
pub(crate) struct SharedWrite {
    outbox: Outbox,
}

impl SharedWrite {
    fn stream(&self) -> io::Result<&tokio::net::TcpStream> {
        match &self.outbox.inner.stream {
            Some(s) => Ok(s.as_ref()),
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "no socket")),
        }
    }
}

impl AsyncWrite for SharedWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let stream = self.stream()?;
        loop {
            ready!(stream.poll_write_ready(cx))?;
            match stream.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.outbox.shutdown();
        Poll::Ready(Ok(()))
    }
}

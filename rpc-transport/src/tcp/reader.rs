//! The reader side of a tcp connection: decodes frames and acts on them.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt};
use tokio::sync::Semaphore;

use super::outbox::Outbox;
use super::push::Push;
use super::wire::{self, Header};
use super::writer::Outgoing;
use crate::soft::{Death, Soft};
use crate::{Detail, ReadError};

/// What the reader needs: the local endpoint, the writer's queue (for READ responses), and the
/// largest SEND this side accepts.
#[derive(Debug)]
pub(crate) struct Reader {
    pub(crate) soft: Arc<Soft>,
    pub(crate) out: Outbox,
    pub(crate) recv_size: u32,
    /// Regions the peer pushed, and the window our pushes may use.
    pub(crate) push: Arc<Push>,
    /// Holds a message that arrived while no receive was posted.
    scratch: Vec<u8>,
    /// One permit per READ response queued and not yet written: a peer that floods READ
    /// requests without reading our responses stalls here instead of growing our memory.
    response_permits: Arc<Semaphore>,
    /// How long to wait for the writer after a refused READ ([`CLOSE_GRACE`]; zero in tests).
    pub(crate) close_grace: Duration,
}

/// How long a reader that refused a READ waits for the writer to send the refusal before it
/// closes the connection itself.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// READ responses that may wait for the writer at once (well above what a peer that respects
/// `max_reads_in_flight` can cause).
const MAX_QUEUED_RESPONSES: usize = 256;

fn malformed(what: impl Into<String>) -> Death {
    Death::Malformed(what.into())
}

/// Maps a read error inside a frame. EOF there is the peer closing (or dying) in the middle of
/// a write, as a peer that closes its connection while a long frame is going out does: a
/// disconnect, not a framing violation (verbs reports a peer's close the same whatever was in
/// flight).
fn inside_frame(e: io::Error) -> Death {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ended_inside_frame()
    } else {
        Death::Closed(Detail::caused_by("read failed", e))
    }
}

fn ended_inside_frame() -> Death {
    Death::Closed("peer closed the connection inside a frame".into())
}

impl Reader {
    pub(crate) fn new(soft: Arc<Soft>, out: Outbox, recv_size: u32, push: Arc<Push>) -> Reader {
        let response_permits = Arc::new(Semaphore::new(MAX_QUEUED_RESPONSES));
        Reader { soft, out, recv_size, push, scratch: Vec::new(), response_permits, close_grace: CLOSE_GRACE }
    }

    /// Reads and handles frames until the stream ends or the peer breaks the framing. Returns
    /// why the connection ended; never panics on any input.
    pub(crate) async fn run<R: AsyncBufRead + Unpin>(&mut self, r: &mut R) -> Death {
        loop {
            match self.buffered_sends(r).await {
                Ok(0) => {}
                Ok(_) => continue,
                Err(death) => return death,
            }
            let ty = match r.read_u8().await {
                Ok(ty) => ty,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Death::Closed("peer closed the connection".into())
                }
                Err(e) => return Death::Closed(Detail::caused_by("read failed", e)),
            };
            if let Err(death) = self.frame(ty, r).await {
                return death;
            }
        }
    }

    /// The fast path: the whole SEND frames at the head of the read buffer (several when the
    /// peer pipelines calls), each copied from the buffer into the next posted receive, with no
    /// await and no intermediate read per frame. Returns how many bytes it consumed; 0 when the
    /// buffer starts with anything else (another frame type, a frame not all there yet, a
    /// length over the limit), which the per-frame path then reads and judges.
    async fn buffered_sends<R: AsyncBufRead + Unpin>(&mut self, r: &mut R) -> Result<usize, Death> {
        let buf = r.fill_buf().await.map_err(|e| Death::Closed(Detail::caused_by("read failed", e)))?;
        let header = 1 + wire::SEND_HEADER;
        let recv_size = self.recv_size;
        let mut used = 0;
        // The whole run under one lock of the endpoint, with one wake of its poller.
        let delivered = self.soft.deliver_run(|| {
            let [wire::T_SEND, rest @ ..] = &buf[used..] else { return None };
            let Some(Header::Send { len }) =
                rest.get(..wire::SEND_HEADER).and_then(|h| wire::decode_header(wire::T_SEND, h))
            else {
                return None;
            };
            let end = used + header + len as usize;
            if len > recv_size || end > buf.len() {
                return None;
            }
            let msg = &buf[used + header..end];
            used = end;
            Some(msg)
        });
        r.consume(used);
        delivered.map(|()| used)
    }

    async fn frame<R: AsyncRead + Unpin>(&mut self, ty: u8, r: &mut R) -> Result<(), Death> {
        let len = wire::header_len(ty).ok_or_else(|| malformed(format!("unknown frame type {ty}")))?;
        let mut buf = [0u8; wire::MAX_HEADER];
        r.read_exact(&mut buf[..len]).await.map_err(inside_frame)?;
        match wire::decode_header(ty, &buf[..len]).ok_or_else(|| malformed("bad frame header"))? {
            Header::Send { len } => self.on_send(len, r).await,
            Header::ReadReq { id, addr, len, rkey } => self.on_read_req(id, addr, len, rkey).await,
            Header::ReadResp { id, status, len } => self.on_read_resp(id, status, len, r).await,
            Header::Push { rkey, addr, len } => self.on_push(rkey, addr, len, r).await,
            Header::Revoke { rkey } => {
                if let Some(len) = self.push.revoked(rkey) {
                    self.window_back(rkey, len);
                }
                Ok(())
            }
            Header::Window { rkey, len } => self.push.window_back(rkey, len).map_err(malformed),
        }
    }

    /// A region the peer pushed: must fit the window we have left; read straight into a buffer
    /// of its own, which a READ of the region will take.
    async fn on_push<R: AsyncRead + Unpin>(
        &mut self,
        rkey: u32,
        addr: u64,
        len: u64,
        r: &mut R,
    ) -> Result<(), Death> {
        let mut payload = (&mut *r).take(len);
        if !self.push.accept(rkey, len).map_err(malformed)? {
            // Not kept (see `Push::accept`): off the socket, and the window back at once.
            let n = tokio::io::copy(&mut payload, &mut tokio::io::sink()).await.map_err(inside_frame)?;
            if n < len {
                return Err(ended_inside_frame());
            }
            self.window_back(rkey, len);
            return Ok(());
        };
        // Accepted: within our window, memory we agreed to hold, so it fits in usize. Read
        // straight into a buffer of the connection's pool (a READ of the region takes it as is).
        let size = usize::try_from(len).map_err(|_| malformed("pushed region too large"))?;
        let mut data = self.soft.pool().alloc(size).map_err(|e| Death::Closed(Detail::from_error(e)))?;
        if let Err(e) = payload.read_exact(&mut data).await {
            return Err(inside_frame(e));
        }
        if let Some(len) = self.push.arrived(rkey, addr, data) {
            self.window_back(rkey, len);
        }
        Ok(())
    }

    /// Hands the peer's pushed region `rkey` (`len` bytes) back. If the writer is gone the
    /// endpoint is dead already and the window no longer matters.
    fn window_back(&self, rkey: u32, len: u64) {
        let _ = self.out.queue(Outgoing::Window { rkey, len });
    }

    /// A SEND: read straight into the next posted receive, or keep it until one is posted.
    async fn on_send<R: AsyncRead + Unpin>(&mut self, len: u32, r: &mut R) -> Result<(), Death> {
        if len > self.recv_size {
            return Err(malformed(format!("SEND of {len} bytes exceeds recv_size {}", self.recv_size)));
        }
        let len = len as usize;
        match self.soft.take_posted_recv() {
            Some(mut buf) => {
                if len > buf.capacity() {
                    return Err(malformed(format!(
                        "SEND of {len} bytes does not fit the posted receive buffer of {}",
                        buf.capacity()
                    )));
                }
                r.read_exact(&mut buf.buf_mut().storage_mut()[..len]).await.map_err(inside_frame)?;
                buf.set_len(len);
                self.soft.complete_recv(buf);
                Ok(())
            }
            None => {
                self.scratch.resize(len, 0);
                r.read_exact(&mut self.scratch).await.map_err(inside_frame)?;
                self.soft.deliver(&self.scratch)
            }
        }
    }

    /// A READ request from the peer: served from our regions (checked), answered by the writer.
    ///
    /// A refused READ (bad key, out of bounds, revoked, too large) closes the connection, as a
    /// verbs responder does: the refusal is queued, then a `Close` that makes the writer flush it
    /// and kill the endpoint. This reader reads nothing more meanwhile (no frame of the peer's
    /// after its bad READ is delivered), and kills the endpoint itself if the writer cannot get
    /// the refusal out within [`CLOSE_GRACE`] (a peer that does not read its socket).
    async fn on_read_req(&self, id: u64, addr: u64, len: u64, rkey: u32) -> Result<(), Death> {
        let permit = self.response_permits.clone().acquire_owned().await;
        let permit = permit.map_err(|_| Death::Closed("reader stopped".into()))?;
        let writer_gone = |_| Death::Closed("writer stopped".into());
        match self.soft.serve_read(addr, len, rkey) {
            Ok(data) => {
                self.out.queue(Outgoing::ReadResp { id, result: Ok(data), permit }).map_err(writer_gone)
            }
            // This endpoint has died (closed by this side): nothing is answered, as a queue pair
            // in error answers nothing; the peer's READ is flushed when it sees the close.
            Err(ReadError::Flushed) => Err(Death::Closed("closed while the peer's READ was served".into())),
            Err(refused) => {
                let why = format!("refused the peer's READ ({refused}): connection closed");
                let death = Death::Closed(Detail::new(why).with_cause(refused.clone()));
                let status = wire::status_of(&refused);
                self.out
                    .queue(Outgoing::ReadResp { id, result: Err(status), permit })
                    .map_err(writer_gone)?;
                self.out.queue(Outgoing::Close { death: death.clone() }).map_err(writer_gone)?;
                if !self.close_grace.is_zero() {
                    tokio::time::sleep(self.close_grace).await;
                }
                Err(death)
            }
        }
    }

    /// A READ response: must answer one of our pending READs with exactly its length.
    async fn on_read_resp<R: AsyncRead + Unpin>(
        &mut self,
        id: u64,
        status: u8,
        len: u64,
        r: &mut R,
    ) -> Result<(), Death> {
        let (remote, mut dst) =
            self.soft.take_read(id).ok_or_else(|| malformed(format!("READ response for unknown id {id}")))?;
        self.push.read_done(remote.rkey);
        if status != wire::STATUS_OK {
            let err = wire::error_of(status, &remote)
                .ok_or_else(|| malformed(format!("unknown READ status {status}")))?;
            if len != 0 {
                return Err(malformed("refused READ response carries data"));
            }
            // The READ completes with its typed error first, then the connection closes (the
            // peer closes its end too), as an RC QP that got a remote access error.
            let why = format!("READ refused by the peer ({err}): connection closed");
            let death = Death::Closed(Detail::new(why).with_cause(err.clone()));
            self.soft.complete_read(id, Err(err));
            return Err(death);
        }
        if len != remote.len {
            return Err(malformed(format!("READ response of {len} bytes for a READ of {}", remote.len)));
        }
        r.read_exact(&mut dst).await.map_err(inside_frame)?;
        self.soft.complete_read(id, Ok(dst));
        Ok(())
    }
}

#[cfg(test)]
mod tests;

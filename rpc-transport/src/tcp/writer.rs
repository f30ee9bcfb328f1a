//! The writer side of a tcp connection: writes queued frames in batches, each batch in one
//! vectored write where it can (headers and small payloads copied into one buffer, large
//! payloads written from their own `Bytes`), so that a pushed region, the SEND that advertises
//! it and whatever else is queued leave in one system call.

use std::io::IoSlice;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use super::outbox::OutboxRx;
use super::wire;
use crate::soft::{Death, OpId, Soft};
use crate::{RKey, RegionDesc, SendBuf};

/// A frame waiting for the writer.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// Our SEND; its completion is queued once the frame is written. A small one is copied
    /// into the batch and its buffer goes back to the pool at once (never frozen into `Bytes`).
    Send { op: OpId, msg: SendBuf },
    /// The rest of our SEND after a partial direct write: what is left of its header, then of its
    /// payload.
    SendRest { op: OpId, head: Bytes, body: Bytes },
    /// Our READ request (`id` is the pending READ's op id).
    ReadReq { id: OpId, addr: u64, len: u64, rkey: u32 },
    /// The answer to the peer's READ: the region's bytes, or a refusal status. The permit is
    /// released once the response is written.
    ReadResp { id: u64, result: Result<Bytes, u8>, permit: OwnedSemaphorePermit },
    /// A registered region's bytes, pushed to the peer ahead of its advertisement.
    Push { desc: RegionDesc, data: Bytes },
    /// A pushed region was revoked: the peer drops its bytes if unread.
    Revoke { rkey: RKey },
    /// A region the peer pushed is no longer held here (consumed or dropped): its window back.
    Window { rkey: RKey, len: u64 },
    /// Everything queued before this is written and flushed, then the endpoint dies with `death`
    /// (after a refused READ: its refusal reaches the peer before the connection closes).
    Close { death: Death },
}

/// Payloads from this size on are written from their own buffer; smaller ones are copied into
/// the batch's buffer with the headers.
const COPY_BELOW: usize = 16 * 1024;

/// Frames written per batch at most, so that completions of a long burst are not held back.
const MAX_BATCH: usize = 256;

/// Bytes copied into a batch's buffer at most before it is written out.
const MAX_COPIED: usize = 64 * 1024;

/// Pieces of a batch at most before it is written out (well under the kernel's `IOV_MAX`).
const MAX_PIECES: usize = 512;

/// Writes frames until the queue closes, a write fails or a [`Outgoing::Close`] is written;
/// returns why it stopped. Between batches, when its queue is empty, it tells the outbox it is
/// idle (the connection may then write a SEND itself).
pub(crate) async fn run<W: AsyncWrite + Unpin>(w: &mut W, rx: &mut OutboxRx, soft: &Arc<Soft>) -> Death {
    let mut batch = Batch::default();
    // The frames of one batch, taken from the queue together (one receive for all of them,
    // returning at once while any is queued). It grows with the largest batch taken (at most
    // MAX_BATCH frames), not before.
    let mut frames = Vec::new();
    loop {
        if rx.recv_many(&mut frames, MAX_BATCH).await == 0 {
            break;
        }
        let closing = match write_batch(w, frames.drain(..), &mut batch).await {
            Ok(closing) => closing,
            Err(e) => return Death::Closed(crate::Detail::caused_by("write failed", e)),
        };
        soft.complete_sends_ok(&batch.sends);
        batch.sends.clear();
        if let Some(death) = closing {
            return death;
        }
        rx.idle_unless_queued();
    }
    Death::Closed("connection dropped".into())
}

/// Frames being assembled for one write.
#[derive(Debug, Default)]
struct Batch {
    /// Headers and small payloads, back to back.
    copied: Vec<u8>,
    /// What to write, in order.
    pieces: Vec<Piece>,
    /// Our SENDs in this batch, completed once it is written.
    sends: Vec<OpId>,
    /// Permits of READ responses in this batch, released once it is written.
    permits: Vec<OwnedSemaphorePermit>,
}

#[derive(Debug)]
enum Piece {
    Copied(Range<usize>),
    Shared(Bytes),
}

impl Batch {
    fn copy(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let start = self.copied.len();
        self.copied.extend_from_slice(bytes);
        let end = self.copied.len();
        match self.pieces.last_mut() {
            Some(Piece::Copied(r)) if r.end == start => r.end = end,
            _ => self.pieces.push(Piece::Copied(start..end)),
        }
    }

    /// A payload: copied into the batch when small (a pool buffer then goes back at once),
    /// else written from its own memory.
    fn payload(&mut self, data: impl Into<SendBuf>) {
        let data = data.into();
        if data.len() < COPY_BELOW {
            for part in data.parts() {
                self.copy(part);
            }
            return;
        }
        match data {
            SendBuf::Headed { head, body } => {
                self.copy(head.as_slice());
                self.pieces.push(Piece::Shared(body));
            }
            whole => self.pieces.push(Piece::Shared(whole.into_bytes())),
        }
    }

    fn add(&mut self, frame: Outgoing) {
        match frame {
            Outgoing::Send { op, msg } => {
                // `post_send` checked the length against the peer's recv_size, a u32.
                self.copy(&wire::encode_send(msg.len() as u32));
                self.payload(msg);
                self.sends.push(op);
            }
            Outgoing::SendRest { op, head, body } => {
                self.copy(&head);
                self.payload(body);
                self.sends.push(op);
            }
            Outgoing::ReadReq { id, addr, len, rkey } => {
                self.copy(&wire::encode_read_req(id, addr, len, rkey))
            }
            Outgoing::ReadResp { id, result: Ok(data), permit } => {
                self.copy(&wire::encode_read_resp(id, wire::STATUS_OK, data.len() as u64));
                self.payload(data);
                self.permits.push(permit);
            }
            Outgoing::ReadResp { id, result: Err(status), permit } => {
                self.copy(&wire::encode_read_resp(id, status, 0));
                self.permits.push(permit);
            }
            Outgoing::Push { desc, data } => {
                self.copy(&wire::encode_push(desc.rkey, desc.addr, desc.len));
                self.payload(data);
            }
            Outgoing::Revoke { rkey } => self.copy(&wire::encode_revoke(rkey)),
            Outgoing::Window { rkey, len } => self.copy(&wire::encode_window(rkey, len)),
            // Handled by `write_batch`.
            Outgoing::Close { .. } => {}
        }
    }

    fn full(&self) -> bool {
        self.copied.len() >= MAX_COPIED || self.pieces.len() >= MAX_PIECES
    }

    /// Writes everything assembled so far (vectored, resuming after partial writes), then
    /// releases the permits of the READ responses written. The slices of a batch of a few pieces
    /// (the usual: small frames are copied back to back into one) are laid out on the stack.
    async fn write_out<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> std::io::Result<()> {
        const ON_STACK: usize = 8;
        fn slice_of<'a>(copied: &'a [u8], piece: &'a Piece) -> IoSlice<'a> {
            match piece {
                Piece::Copied(r) => IoSlice::new(&copied[r.clone()]),
                Piece::Shared(b) => IoSlice::new(b),
            }
        }
        let copied = &self.copied[..];
        if self.pieces.len() <= ON_STACK {
            let mut slices = [IoSlice::new(&[]); ON_STACK];
            for (slot, piece) in slices.iter_mut().zip(&self.pieces) {
                *slot = slice_of(copied, piece);
            }
            write_all_vectored(w, &mut slices[..self.pieces.len()]).await?;
        } else {
            let mut slices: Vec<IoSlice<'_>> = self.pieces.iter().map(|p| slice_of(copied, p)).collect();
            write_all_vectored(w, &mut slices).await?;
        }
        self.copied.clear();
        self.pieces.clear();
        self.permits.clear();
        Ok(())
    }
}

/// Writes all of `slices`, resuming after partial writes.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    let mut left = slices;
    while !left.is_empty() {
        let n = w.write_vectored(left).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
}

/// Writes `frames` (up to a `Close`, which ends the batch; frames after it are dropped) in as
/// few writes as the limits allow, then flushes. Returns the death of a `Close` it reached.
async fn write_batch<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: impl Iterator<Item = Outgoing>,
    batch: &mut Batch,
) -> std::io::Result<Option<Death>> {
    let mut closing = None;
    for frame in frames {
        if let Outgoing::Close { death } = frame {
            closing = Some(death);
            break;
        }
        batch.add(frame);
        if batch.full() {
            batch.write_out(w).await?;
        }
    }
    batch.write_out(w).await?;
    w.flush().await?;
    Ok(closing)
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A socket that takes at most `max` bytes per write: every batch is written in pieces.
    struct Trickle {
        max: usize,
        got: Vec<u8>,
        writes: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            this.writes += 1;
            let mut left = this.max;
            for b in bufs {
                let n = b.len().min(left);
                this.got.extend_from_slice(&b[..n]);
                left -= n;
            }
            Poll::Ready(Ok(this.max - left))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Writes SENDs of these sizes as one batch through a socket taking `max` bytes per write
    /// (every third one given as a head and a body, `SendBuf::Headed`); returns what the socket
    /// got, what it should have got, and the number of writes.
    fn write_sends(sizes: &[usize], max: usize) -> (Vec<u8>, Vec<u8>, usize) {
        let payloads: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect()).collect();
        let mut want = Vec::new();
        for p in &payloads {
            want.extend_from_slice(&wire::encode_send(p.len() as u32));
            want.extend_from_slice(p);
        }
        let frames = payloads.into_iter().enumerate().map(|(op, p)| {
            let msg = match op % 3 {
                2 => SendBuf::headed(&p[..p.len().min(5)], Bytes::copy_from_slice(&p[p.len().min(5)..])),
                _ => SendBuf::from(p),
            };
            Outgoing::Send { op: op as OpId, msg }
        });
        let mut w = Trickle { max, got: Vec::new(), writes: 0 };
        let mut batch = Batch::default();
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let closing = rt.block_on(write_batch(&mut w, frames, &mut batch)).expect("written");
        assert!(closing.is_none());
        assert_eq!(batch.sends.len(), sizes.len(), "every SEND is reported written");
        (w.got, want, w.writes)
    }

    #[test]
    fn a_batch_of_a_few_pieces_is_written_whole_across_partial_writes() {
        // Small frames are copied back to back: one piece; a large one is a piece of its own.
        let (got, want, writes) = write_sends(&[10, 0, 3, COPY_BELOW, 7], 1000);
        assert_eq!(got, want);
        assert!(writes > 1, "the socket took it in pieces");
    }

    #[test]
    fn a_batch_of_many_pieces_is_written_whole_across_partial_writes() {
        // Large and small alternate: 2 pieces per large frame, well over the 8 on the stack.
        let sizes: Vec<usize> = (0..24).map(|i| if i % 2 == 0 { COPY_BELOW + i } else { i }).collect();
        let (got, want, _) = write_sends(&sizes, 4093);
        assert_eq!(got, want);
    }
}

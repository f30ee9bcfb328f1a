//! The writer side of a tcp connection: writes queued frames in batches, one flush per batch.

use std::io::IoSlice;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::wire;
use crate::soft::{Death, OpId, Soft};
use crate::{RKey, RegionDesc};

/// A frame waiting for the writer.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// Our SEND; its completion is queued once the frame is written.
    Send { op: OpId, msg: Bytes },
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

/// Payloads from this size on are written with their header in one vectored write (smaller ones
/// are copied into the buffer).
const VECTORED_PAYLOAD: usize = 16 * 1024;

/// Frames written per batch at most, so that completions of a long burst are not held back.
const MAX_BATCH: usize = 256;

/// Writes frames until the queue closes, a write fails or a [`Outgoing::Close`] is written;
/// returns why it stopped.
pub(crate) async fn run<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    soft: &Arc<Soft>,
) -> Death {
    let mut written: Vec<OpId> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        let closing = match write_batch(w, first, rx, &mut written).await {
            Ok(closing) => closing,
            Err(e) => return Death::Closed(format!("write failed: {e}")),
        };
        soft.complete_sends_ok(&written);
        written.clear();
        if let Some(death) = closing {
            return death;
        }
    }
    Death::Closed("connection dropped".into())
}

/// Writes `first` and whatever else is queued (up to [`MAX_BATCH`], or up to a `Close`), then
/// flushes once. Returns the death of a `Close` it reached.
async fn write_batch<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    first: Outgoing,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    written: &mut Vec<OpId>,
) -> std::io::Result<Option<Death>> {
    let mut next = Some(first);
    let mut count = 0;
    let mut closing = None;
    while let Some(frame) = next.take() {
        if let Outgoing::Close { death } = frame {
            closing = Some(death);
            break;
        }
        write_frame(w, frame, written).await?;
        count += 1;
        if count < MAX_BATCH {
            next = rx.try_recv().ok();
        }
    }
    w.flush().await?;
    Ok(closing)
}

async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    frame: Outgoing,
    written: &mut Vec<OpId>,
) -> std::io::Result<()> {
    match frame {
        Outgoing::Send { op, msg } => {
            // `post_send` checked the length against the peer's recv_size, a u32.
            w.write_all(&wire::encode_send(msg.len() as u32)).await?;
            w.write_all(&msg).await?;
            written.push(op);
        }
        Outgoing::ReadReq { id, addr, len, rkey } => {
            w.write_all(&wire::encode_read_req(id, addr, len, rkey)).await?;
        }
        Outgoing::ReadResp { id, result: Ok(data), permit } => {
            write_with_payload(w, &wire::encode_read_resp(id, wire::STATUS_OK, data.len() as u64), &data)
                .await?;
            drop(permit);
        }
        Outgoing::ReadResp { id, result: Err(status), permit } => {
            w.write_all(&wire::encode_read_resp(id, status, 0)).await?;
            drop(permit);
        }
        Outgoing::Push { desc, data } => {
            write_with_payload(w, &wire::encode_push(desc.rkey, desc.addr, desc.len), &data).await?;
        }
        Outgoing::Revoke { rkey } => w.write_all(&wire::encode_revoke(rkey)).await?,
        Outgoing::Window { rkey, len } => w.write_all(&wire::encode_window(rkey, len)).await?,
        // Handled by `write_batch`.
        Outgoing::Close { .. } => {}
    }
    Ok(())
}

/// Writes a frame's header and its payload. A payload too large for the buffer goes out in one
/// vectored write with its header (after whatever is buffered), rather than the header in a
/// small write of its own and the payload in another.
async fn write_with_payload<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    header: &[u8],
    payload: &[u8],
) -> std::io::Result<()> {
    if payload.len() < VECTORED_PAYLOAD {
        w.write_all(header).await?;
        return w.write_all(payload).await;
    }
    let mut parts = [IoSlice::new(header), IoSlice::new(payload)];
    let mut left = &mut parts[..];
    while !left.is_empty() {
        let n = w.write_vectored(left).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
}

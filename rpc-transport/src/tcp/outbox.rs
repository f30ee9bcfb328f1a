//! The way out to the socket: frames queued for the writer task, or SENDs written at once by
//! the caller (the connection's driver) when the writer is idle: one, or a driver round's batch
//! in one vectored write.
//!
//! The direct write saves the writer task's wake-up (and the driver's second one for the
//! completion) on every small call, and with many calls in flight it puts a round's SENDs on the
//! wire together (one system call, one wake-up of the peer); the writer task keeps everything
//! else: large payloads and batches, later SENDs of a burst (one vectored write for many
//! frames), the rest of a partial write, and frames from the reader task. Mutual exclusion is a
//! flag under the queue's mutex: whoever queues a frame sets `busy`, and the writer clears it
//! only when it finds the queue empty under the same lock, so the writer writes only while
//! `busy` and a direct write happens only while not: bytes never interleave. The queue is a
//! deque under that lock, taken a batch at a time (a tokio channel cost a few hundred
//! instructions per frame and allocated a block per 32 frames).

use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::halves::WriteHalf;
use super::wire;
use super::writer::Outgoing;
use crate::soft::OpId;
use crate::{SendBuf, MAX_HEAD};

/// Payloads up to this size may be written by the caller at once; larger ones go to the writer.
/// For a batch ([`Outbox::send_batch_now`]), the size of all its payloads.
pub(crate) const DIRECT_MAX: usize = 64 * 1024;

/// SENDs written by the caller in one vectored system call at most (see [`write_gathered`]);
/// a larger batch goes to the writer.
const DIRECT_BATCH: usize = 64;

/// A piece of a directly written SEND (its payload, or a part of it) of at most this many bytes
/// is copied into the write's gather buffer, next to the frame headers, rather than given an
/// `iovec` of its own: the kernel's cost per `iovec` is about that of copying a kilobyte
/// (loopback, this project's 2-vCPU VM: 64 SENDs of 80 bytes in one `writev`, 135 ns per frame
/// as three `iovec`s each, 29 ns per frame gathered).
const COPY_MAX: usize = 1024;

/// A lone SEND frame of at most this many bytes is assembled on the stack for its direct write.
const SMALL_FRAME: usize = 256;

/// Bytes of payload copied into a gather buffer per write at most (headers, and pieces no
/// longer than a head, are always copied); larger pieces past this are written from where they
/// lie.
const GATHER_MAX: usize = 16 * 1024;

std::thread_local! {
    /// The gather buffer of direct writes on this thread: frame headers and small payload
    /// pieces, back to back. One per thread (a write uses it only while it runs), so it costs
    /// nothing per connection; it grows with the largest write, to under twice
    /// `GATHER_MAX + DIRECT_BATCH * (1 + SEND_HEADER + 2 * MAX_HEAD)` bytes (about 45 KiB).
    static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether a payload piece of `len` bytes is copied into the gather buffer, which holds
/// `gathered` bytes: decided the same way when copying and when laying out the write. A piece
/// no longer than a head always is, so that a frame has at most one piece of its own.
fn gathers(len: usize, gathered: usize) -> bool {
    len <= MAX_HEAD || (len <= COPY_MAX && gathered + len <= GATHER_MAX)
}

/// Writes the SEND frames of `msgs` (at most [`DIRECT_BATCH`]) in one vectored, non-blocking
/// write, copied by [`copy_pieces`] into this thread's gather buffer and, unless it is all
/// there, laid out by [`lay_out`]. Returns the bytes written: 0 if the socket would block or
/// failed.
fn write_gathered<'m, const N: usize>(
    stream: &WriteHalf,
    msgs: impl Iterator<Item = &'m SendBuf> + Clone,
) -> usize {
    GATHER.with_borrow_mut(|buf| {
        let written = match copy_pieces(buf, msgs.clone()) {
            // Small frames only (the usual batch): the buffer is the write, not laid out again.
            true => stream.try_write(buf),
            false => {
                let (slices, n) = lay_out::<N>(buf, msgs);
                stream.try_write_vectored(&slices[..n])
            }
        };
        written.unwrap_or(0)
    })
}

/// [`copy_pieces`], then [`lay_out`], as a write that is not all copied does.
#[cfg(test)]
fn gather<'a, 'm: 'a, const N: usize>(
    buf: &'a mut Vec<u8>,
    msgs: impl Iterator<Item = &'m SendBuf> + Clone,
) -> ([IoSlice<'a>; N], usize) {
    copy_pieces(buf, msgs.clone());
    lay_out(buf, msgs)
}

/// Copies each SEND frame's header and its small pieces (see [`gathers`]) into `buf`. Returns
/// whether every piece was copied: then `buf` holds the frames whole, back to back.
fn copy_pieces<'m>(buf: &mut Vec<u8>, msgs: impl Iterator<Item = &'m SendBuf>) -> bool {
    buf.clear();
    let mut all = true;
    for msg in msgs {
        buf.extend_from_slice(&wire::encode_send(msg.len() as u32));
        for part in msg.parts() {
            if gathers(part.len(), buf.len()) {
                buf.extend_from_slice(part);
            } else {
                all = false;
            }
        }
    }
    all
}

/// Lays out the SEND frames of `msgs` for one vectored write, their headers and small pieces
/// copied into `buf` by [`copy_pieces`] and larger pieces from where they lie, so that a run of
/// small frames is one `iovec`. Returns the `iovec`s and how many are used. `N` bounds them: two
/// per frame (a run of copied bytes, then the frame's one piece of its own: see [`gathers`]) and
/// one. Should a layout need more, it covers the frames up to the piece that does not fit (the
/// caller queues the rest for the writer).
fn lay_out<'a, 'm: 'a, const N: usize>(
    buf: &'a [u8],
    msgs: impl Iterator<Item = &'m SendBuf>,
) -> ([IoSlice<'a>; N], usize) {
    let mut slices = [IoSlice::new(&[]); N];
    let (mut n, mut run, mut at) = (0, 0, 0);
    'frames: for msg in msgs {
        at += 1 + wire::SEND_HEADER;
        for part in msg.parts().into_iter().filter(|p| !p.is_empty()) {
            if gathers(part.len(), at) {
                at += part.len();
                continue;
            }
            if n + 2 > N {
                break 'frames;
            }
            if run < at {
                slices[n] = IoSlice::new(&buf[run..at]);
                n += 1;
            }
            slices[n] = IoSlice::new(part);
            n += 1;
            run = at;
        }
    }
    if run < at && n < N {
        slices[n] = IoSlice::new(&buf[run..at]);
        n += 1;
    }
    (slices, n)
}

/// The frames' way to the writer task, held by the connection and the reader task (the
/// writer's end is [`OutboxRx`]).
#[derive(Debug)]
pub(crate) struct Outbox {
    inner: Arc<Inner>,
}

/// The writer task's end: takes the queued frames in batches.
#[derive(Debug)]
pub(crate) struct OutboxRx {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// The socket, for direct writes and for the writer (`None` in tests without a socket).
    stream: Option<WriteHalf>,
    /// Write system calls made on the socket (`TransportCounters::send_posts`): direct ones
    /// (made under the queue's lock) and the writer task's. Each has one writer at a time, so
    /// it is counted with a load and a store, no atomic read-modify-write.
    direct_writes: AtomicU64,
    writer_writes: AtomicU64,
}

/// The queue, and who may write. One lock for both: a frame queued sets `busy` in the same step,
/// and the writer clears it only when it finds the queue empty.
#[derive(Debug, Default)]
struct State {
    /// Frames for the writer, in order. Unbounded as a channel would be: SENDs are bounded by the
    /// peer's credits, READ responses by the reader's permits, window frames by the regions.
    frames: VecDeque<Outgoing>,
    /// The writer has frames queued or is writing.
    busy: bool,
    /// The writer's waker, left when it found no frame; taken by the next frame queued.
    waker: Option<Waker>,
    /// [`Outbox`] handles alive; with none left and no frame queued, the writer's queue ends.
    senders: usize,
    /// The writer's end is gone: frames are no longer taken.
    writer_gone: bool,
}

/// What became of a SEND offered for a direct write.
#[derive(Debug)]
pub(crate) enum Direct {
    /// Written whole: complete it.
    Written,
    /// Handed to the writer (busy, would block, too large, or partly written).
    Queued,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

/// One more on a counter that only one thread at a time updates (see `Inner::direct_writes`).
fn count(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Queues `frames` in order (dropped if the writer is gone) and marks the writer busy, then
/// releases the lock and wakes the writer if it waits.
fn enqueue(mut state: MutexGuard<'_, State>, frames: impl IntoIterator<Item = Outgoing>) {
    state.busy = true;
    if state.writer_gone {
        frames.into_iter().for_each(drop);
    } else {
        state.frames.extend(frames);
    }
    let waker = state.waker.take();
    drop(state);
    wake(waker);
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.inner.lock().senders += 1;
        Outbox { inner: self.inner.clone() }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.inner.lock();
            state.senders -= 1;
            if state.senders == 0 {
                state.waker.take()
            } else {
                None
            }
        };
        wake(waker);
    }
}

impl Outbox {
    /// Write system calls made on the socket so far (`TransportCounters::send_posts`).
    pub(crate) fn writes(&self) -> u64 {
        self.inner.direct_writes.load(Ordering::Relaxed) + self.inner.writer_writes.load(Ordering::Relaxed)
    }

    /// An outbox over the write half of a socket, and the writer's end of its queue.
    pub(crate) fn new(stream: Option<WriteHalf>) -> (Outbox, OutboxRx) {
        let state = State { senders: 1, ..State::default() };
        let inner = Arc::new(Inner {
            state: Mutex::new(state),
            stream,
            direct_writes: AtomicU64::new(0),
            writer_writes: AtomicU64::new(0),
        });
        (Outbox { inner: inner.clone() }, OutboxRx { inner })
    }

    /// Queues a frame for the writer. `Err` (the frame back) if the writer is gone (the endpoint
    /// is dead).
    pub(crate) fn queue(&self, frame: Outgoing) -> Result<(), Outgoing> {
        let state = self.inner.lock();
        if state.writer_gone {
            return Err(frame);
        }
        enqueue(state, [frame]);
        Ok(())
    }

    /// Writes the SEND frame of `msg` at once if the writer is idle and the socket takes it all
    /// without blocking; otherwise queues it for the writer (what is left of it after a partial
    /// write) as the pending operation `record` returns. `record` runs only then, under the
    /// queue's lock (a SEND written whole is never recorded); `None` (the endpoint died
    /// meanwhile) drops the frame.
    pub(crate) fn send_now(&self, msg: SendBuf, record: impl FnOnce() -> Option<OpId>) -> Direct {
        let state = self.inner.lock();
        // Measured once (a `SendBuf`'s length is a `match`).
        let len = msg.len();
        let stream = match &self.inner.stream {
            Some(s) if !state.busy && len <= DIRECT_MAX => s,
            _ => {
                enqueue(state, record().map(|op| Outgoing::Send { op, msg }));
                return Direct::Queued;
            }
        };
        let total = 1 + wire::SEND_HEADER + len;
        count(&self.inner.direct_writes);
        // Would block, or failed: the writer takes it all (and meets the error, if any).
        let written = if total <= SMALL_FRAME {
            // A small call's frame: assembled on the stack, one plain write.
            let mut frame = [0; SMALL_FRAME];
            frame[..1 + wire::SEND_HEADER].copy_from_slice(&wire::encode_send(len as u32));
            msg.copy_to_slice(&mut frame[1 + wire::SEND_HEADER..total]);
            stream.try_write(&frame[..total]).unwrap_or(0)
        } else {
            write_gathered::<3>(stream, std::iter::once(&msg))
        };
        if written == total {
            return Direct::Written;
        }
        enqueue(state, record().map(|op| rest_of_send(op, msg, written)));
        Direct::Queued
    }

    /// Writes the SEND frames of `frames` at once, in order, in one vectored system call, if the
    /// writer is idle, they are at most [`DIRECT_BATCH`] and their payloads at most
    /// [`DIRECT_MAX`] bytes in all. Returns with `frames` holding the frames written whole (a
    /// prefix: complete them); the others, the rest of a partly written one first, were queued
    /// for the writer, in order (all of them when the writer is busy, the socket would block or
    /// the batch is too large), each as the pending operation `record` returns for its tag `T`
    /// (as in [`Outbox::send_now`]: called for those only, under the queue's lock; `None` drops
    /// the frame). `payload` is the frames' payloads' size in all (the caller added them up as
    /// it checked them).
    pub(crate) fn send_batch_now<T>(
        &self,
        frames: &mut Vec<(T, SendBuf)>,
        payload: usize,
        mut record: impl FnMut(&T) -> Option<OpId>,
    ) {
        debug_assert_eq!(payload, frames.iter().map(|(_, msg)| msg.len()).sum::<usize>());
        let state = self.inner.lock();
        let fits = frames.len() <= DIRECT_BATCH && payload <= DIRECT_MAX;
        let written = match &self.inner.stream {
            Some(stream) if !state.busy && fits => {
                count(&self.inner.direct_writes);
                // Would block, or failed: the writer takes them all (and meets the error).
                write_gathered::<{ 2 * DIRECT_BATCH + 1 }>(stream, frames.iter().map(|(_, msg)| msg))
            }
            _ => 0,
        };
        if written == payload + frames.len() * (1 + wire::SEND_HEADER) {
            return; // all of them, whole
        }
        // The frames written whole, and how much of the next one went out.
        let (mut whole, mut left) = (0, written);
        for (_, msg) in frames.iter() {
            let len = 1 + wire::SEND_HEADER + msg.len();
            if left < len {
                break;
            }
            (whole, left) = (whole + 1, left - len);
        }
        if whole < frames.len() {
            let rest = frames.drain(whole..).enumerate().filter_map(|(i, (tag, msg))| {
                let op = record(&tag)?;
                Some(if i == 0 { rest_of_send(op, msg, left) } else { Outgoing::Send { op, msg } })
            });
            enqueue(state, rest);
        }
    }
}

/// The SEND frame of `msg` less its first `written` bytes (header first, then payload), for the
/// writer: frozen, since it may outlive the call in the writer's queue.
fn rest_of_send(op: OpId, msg: SendBuf, written: usize) -> Outgoing {
    let header = wire::encode_send(msg.len() as u32);
    if written == 0 {
        return Outgoing::Send { op, msg };
    }
    let msg = msg.into_bytes();
    if written < header.len() {
        Outgoing::SendRest { op, head: Bytes::copy_from_slice(&header[written..]), body: msg }
    } else {
        Outgoing::SendRest { op, head: Bytes::new(), body: msg.slice(written - header.len()..) }
    }
}

impl OutboxRx {
    /// Moves up to `max` queued frames to `out`, in order: `Ready(n > 0)`, or `Ready(0)` once no
    /// frame is queued and no [`Outbox`] is left; `Pending` (woken by the next frame) otherwise.
    pub(crate) fn poll_recv_many(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Outgoing>,
        max: usize,
    ) -> Poll<usize> {
        let mut state = self.inner.lock();
        if state.frames.is_empty() {
            if state.senders == 0 {
                return Poll::Ready(0);
            }
            match &mut state.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        let n = state.frames.len().min(max);
        out.extend(state.frames.drain(..n));
        Poll::Ready(n)
    }

    /// [`OutboxRx::poll_recv_many`] as a future.
    pub(crate) async fn recv_many(&mut self, out: &mut Vec<Outgoing>, max: usize) -> usize {
        std::future::poll_fn(|cx| self.poll_recv_many(cx, out, max)).await
    }

    /// One frame, or `None` once none is queued and no [`Outbox`] is left.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) async fn recv(&mut self) -> Option<Outgoing> {
        let mut one = Vec::with_capacity(1);
        (self.recv_many(&mut one, 1).await > 0).then(|| one.remove(0))
    }

    /// A frame if one is queued.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<Outgoing> {
        self.inner.lock().frames.pop_front()
    }

    /// The writer wrote what it had taken: marks it idle unless more frames are queued (then it
    /// takes them next; the connection keeps away from the socket meanwhile).
    pub(crate) fn idle_unless_queued(&self) {
        let mut state = self.inner.lock();
        if state.frames.is_empty() {
            state.busy = false;
        }
    }

    /// The socket as an `AsyncWrite` for the writer task.
    pub(crate) fn writer(&self) -> SharedWrite {
        SharedWrite { inner: self.inner.clone() }
    }
}

impl Drop for OutboxRx {
    /// The writer is gone: later frames are refused, what was queued is dropped (outside the
    /// lock), and the socket is shut down for writing (the peer sees EOF).
    fn drop(&mut self) {
        let queued = {
            let mut state = self.inner.lock();
            state.writer_gone = true;
            state.waker = None;
            std::mem::take(&mut state.frames)
        };
        drop(queued);
        shutdown(&self.inner);
    }
}

fn shutdown(inner: &Inner) {
    if let Some(s) = &inner.stream {
        s.shutdown();
    }
}

/// The shared write half as an `AsyncWrite` (readiness, then non-blocking writes).
#[derive(Debug)]
pub(crate) struct SharedWrite {
    inner: Arc<Inner>,
}

impl SharedWrite {
    fn stream(&self) -> io::Result<&WriteHalf> {
        match &self.inner.stream {
            Some(s) => Ok(s),
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
        self.stream()?.poll_write_vectored(cx, bufs, || count(&self.inner.writer_writes))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        shutdown(&self.inner);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the writer's waker is left with the queue (it waits), for a send to take.
    fn waiting(rx: &OutboxRx) -> bool {
        rx.inner.lock().waker.is_some()
    }

    fn window(rkey: u32) -> Outgoing {
        Outgoing::Window { rkey, len: 1 }
    }

    fn rkeys(frames: &[Outgoing]) -> Vec<u32> {
        frames.iter().map(|f| if let Outgoing::Window { rkey, .. } = f { *rkey } else { u32::MAX }).collect()
    }

    #[test]
    fn frames_come_out_in_order_in_batches_and_wake_a_waiting_writer_once_per_batch() {
        let (out, mut rx) = Outbox::new(None);
        let mut cx = Context::from_waker(Waker::noop());
        let mut got = Vec::new();
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Pending);
        assert!(waiting(&rx));
        for rkey in 1..=5 {
            out.queue(window(rkey)).unwrap();
            assert!(!waiting(&rx), "the first frame took the waker (one wake); the rest find none");
        }
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 3), Poll::Ready(3));
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Ready(2));
        assert_eq!(rkeys(&got), [1, 2, 3, 4, 5]);
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Pending);
    }

    #[test]
    fn the_writer_stays_busy_while_frames_wait_and_a_send_then_queues() {
        let (out, mut rx) = Outbox::new(None);
        out.queue(window(1)).unwrap();
        let mut got = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 1), Poll::Ready(1));
        out.queue(window(2)).unwrap();
        rx.idle_unless_queued();
        assert!(rx.inner.lock().busy, "a frame is queued: still busy");
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Ready(1));
        rx.idle_unless_queued();
        assert!(!rx.inner.lock().busy, "nothing queued: idle");
        // Without a socket a SEND is never written directly: it queues, and the writer is busy.
        assert!(matches!(out.send_now(SendBuf::from(&b"hi"[..]), || Some(7)), Direct::Queued));
        assert!(rx.inner.lock().busy);
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Ready(1));
        assert!(matches!(got.last(), Some(Outgoing::Send { op: 7, msg }) if *msg == b"hi"[..]));
    }

    /// A connected loopback pair: our outbox over the client's write half (its send buffer
    /// `sndbuf` bytes when given), the writer's end, and the server's stream to read from.
    async fn socket_outbox(sndbuf: Option<usize>) -> (Outbox, OutboxRx, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let (client, (server, _)) = (client.unwrap(), accepted.unwrap());
        if let Some(size) = sndbuf {
            socket2::SockRef::from(&client).set_send_buffer_size(size).unwrap();
            socket2::SockRef::from(&server).set_recv_buffer_size(size).unwrap();
        }
        let (_read, write) = crate::tcp::halves::split(client).unwrap();
        let (out, rx) = Outbox::new(Some(write));
        (out, rx, server)
    }

    /// SEND frames tagged with their index, payloads of `len` bytes of the index's value: in one
    /// piece for even indices, a head and a body (`SendBuf::Headed`) for odd ones.
    fn batch_len(batch: &[(usize, SendBuf)]) -> usize {
        batch.iter().map(|(_, msg)| msg.len()).sum()
    }

    fn sends(count: usize, len: usize) -> Vec<(usize, SendBuf)> {
        let msg = |i: usize| match i % 2 {
            0 => SendBuf::from(vec![i as u8; len]),
            _ => {
                let head = len.min(3);
                SendBuf::headed(&vec![i as u8; head], Bytes::from(vec![i as u8; len - head]))
            }
        };
        (0..count).map(|i| (i, msg(i))).collect()
    }

    /// The pending operation of the frame tagged `i`, when it goes to the writer.
    fn op_of(i: &usize) -> Option<OpId> {
        Some(100 + *i as OpId)
    }

    /// The bytes of SEND frames as the wire carries them.
    fn encoded(frames: &[(usize, SendBuf)]) -> Vec<u8> {
        frames
            .iter()
            .flat_map(|(_, msg)| {
                [&wire::encode_send(msg.len() as u32)[..], msg.parts()[0], msg.parts()[1]].concat()
            })
            .collect()
    }

    /// The bytes the writer would write for queued SEND frames, with their op ids.
    fn queued_bytes(frames: &[Outgoing]) -> (Vec<u8>, Vec<OpId>) {
        let (mut bytes, mut ops) = (Vec::new(), Vec::new());
        for frame in frames {
            match frame {
                Outgoing::Send { op, msg } => {
                    bytes.extend_from_slice(&wire::encode_send(msg.len() as u32));
                    msg.parts().iter().for_each(|p| bytes.extend_from_slice(p));
                    ops.push(*op);
                }
                Outgoing::SendRest { op, head, body } => {
                    bytes.extend_from_slice(head);
                    bytes.extend_from_slice(body);
                    ops.push(*op);
                }
                other => panic!("not a SEND: {other:?}"),
            }
        }
        (bytes, ops)
    }

    async fn read_exactly(stream: &mut tokio::net::TcpStream, len: usize) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0; len];
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_exact(&mut buf))
            .await
            .expect("the bytes arrive")
            .unwrap();
        buf
    }

    #[tokio::test]
    async fn a_batch_goes_out_whole_in_one_write_while_the_writer_is_idle() {
        let (out, mut rx, mut peer) = socket_outbox(None).await;
        let mut batch = sends(5, 40);
        let expected = encoded(&batch);
        let payload = batch_len(&batch);
        out.send_batch_now(&mut batch, payload, op_of);
        assert_eq!(batch.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2, 3, 4], "all written");
        assert!(!out.inner.lock().busy, "nothing for the writer");
        assert!(rx.try_recv().is_none());
        assert_eq!(read_exactly(&mut peer, expected.len()).await, expected);
    }

    #[tokio::test]
    async fn a_batch_queues_for_a_busy_writer_or_when_too_large() {
        let (out, mut rx, _peer) = socket_outbox(None).await;
        // Busy: a frame is queued ahead, so the batch goes behind it, in order.
        out.queue(window(9)).unwrap();
        let mut batch = sends(3, 8);
        let expected = encoded(&batch);
        let payload = batch_len(&batch);
        out.send_batch_now(&mut batch, payload, op_of);
        assert!(batch.is_empty(), "nothing written");
        let mut got = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 16), Poll::Ready(4));
        assert_eq!(rkeys(&got[..1]), [9]);
        assert_eq!(queued_bytes(&got[1..]), (expected, vec![100, 101, 102]));

        // Idle again, but more frames than one write takes: all to the writer.
        rx.idle_unless_queued();
        let mut batch = sends(DIRECT_BATCH + 1, 1);
        let payload = batch_len(&batch);
        out.send_batch_now(&mut batch, payload, op_of);
        assert!(batch.is_empty());
        got.clear();
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 256), Poll::Ready(DIRECT_BATCH + 1));
    }

    #[tokio::test]
    async fn a_partly_written_batch_leaves_the_rest_to_the_writer_in_order() {
        // A small send buffer and a peer that does not read yet: the socket takes part of the
        // 64 KiB batch.
        let (out, mut rx, mut peer) = socket_outbox(Some(4096)).await;
        let mut batch = sends(64, DIRECT_MAX / 64 - 5);
        let all = encoded(&batch);
        let ops: Vec<OpId> = batch.iter().filter_map(|(i, _)| op_of(i)).collect();
        let payload = batch_len(&batch);
        out.send_batch_now(&mut batch, payload, op_of);
        let whole = batch.len();
        assert!(whole < 64, "the socket took only part of the batch");
        assert!(out.inner.lock().busy, "the rest is the writer's");
        let mut queued = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(rx.poll_recv_many(&mut cx, &mut queued, 256), Poll::Ready(64 - whole));
        let (rest, rest_ops) = queued_bytes(&queued);
        assert_eq!(rest_ops, ops[whole..], "the frames not written whole, in order");
        assert!(rest.len() < all.len(), "something was written");
        // What the socket took, then what the writer would write, is the batch's bytes exactly.
        let sent = read_exactly(&mut peer, all.len() - rest.len()).await;
        assert_eq!([sent, rest].concat(), all);
    }

    /// The bytes of a layout's `iovec`s, back to back.
    fn laid_out(slices: &[IoSlice<'_>]) -> Vec<u8> {
        slices.iter().flat_map(|s| s.iter().copied()).collect()
    }

    #[test]
    fn small_frames_go_out_as_one_run_of_copied_bytes_and_large_pieces_from_where_they_lie() {
        let mut buf = Vec::new();
        // 64 small frames, in one piece and headed: one iovec for all.
        let small = sends(DIRECT_BATCH, 80);
        let (slices, n) = gather::<{ 2 * DIRECT_BATCH + 1 }>(&mut buf, small.iter().map(|(_, m)| m));
        assert_eq!(n, 1, "one run of copied bytes");
        assert_eq!(laid_out(&slices[..n]), encoded(&small));

        // Pieces around COPY_MAX, empty ones, and a large one between small frames.
        let large = Bytes::from(vec![7u8; 20 * 1024]);
        let frames: Vec<(usize, SendBuf)> = [
            SendBuf::from(vec![1u8; COPY_MAX]),
            SendBuf::from(vec![2u8; COPY_MAX + 1]),
            SendBuf::headed(&[3u8; MAX_HEAD], Bytes::new()),
            SendBuf::headed(&[4u8; 5], large.clone()),
            SendBuf::from(Vec::new()),
            SendBuf::headed(&[5u8; 2], Bytes::from(vec![6u8; 100])),
        ]
        .into_iter()
        .enumerate()
        .collect();
        let (slices, n) = gather::<{ 2 * DIRECT_BATCH + 1 }>(&mut buf, frames.iter().map(|(_, m)| m));
        assert_eq!(laid_out(&slices[..n]), encoded(&frames));
        // [header 0 + payload 0 + header 1], payload 1, [headers and heads 2, 3], body 3, [4, 5].
        assert_eq!(n, 5);
        assert_eq!(slices[3].as_ptr(), large.as_ptr(), "a large body is not copied");

        // Past GATHER_MAX, pieces of COPY_MAX are written from where they lie; heads still copied.
        let many = sends(DIRECT_BATCH, COPY_MAX);
        let (slices, n) = gather::<{ 2 * DIRECT_BATCH + 1 }>(&mut buf, many.iter().map(|(_, m)| m));
        assert_eq!(laid_out(&slices[..n]), encoded(&many));
        assert!(n > 1 && n <= 2 * DIRECT_BATCH + 1);
        assert!(buf.len() <= GATHER_MAX + DIRECT_BATCH * (1 + wire::SEND_HEADER + MAX_HEAD));
    }

    #[test]
    fn a_batch_copied_whole_is_written_as_its_buffer_and_any_other_is_laid_out() {
        let mut buf = Vec::new();
        let small = sends(DIRECT_BATCH, 80);
        assert!(copy_pieces(&mut buf, small.iter().map(|(_, m)| m)), "small frames are copied whole");
        assert_eq!(buf, encoded(&small), "the buffer is the batch's bytes");
        let (slices, n) = lay_out::<{ 2 * DIRECT_BATCH + 1 }>(&buf, small.iter().map(|(_, m)| m));
        assert_eq!((n, slices[0].len()), (1, buf.len()), "the layout would be the buffer alone");
        // One piece written from where it lies: not whole.
        let mut mixed = sends(2, 80);
        mixed.push((2, SendBuf::from(vec![9u8; COPY_MAX + 1])));
        assert!(!copy_pieces(&mut buf, mixed.iter().map(|(_, m)| m)));
        let (slices, n) = lay_out::<{ 2 * DIRECT_BATCH + 1 }>(&buf, mixed.iter().map(|(_, m)| m));
        assert_eq!(n, 2);
        assert_eq!(laid_out(&slices[..n]), encoded(&mixed));
        // Empty frames are whole too.
        let empty: Vec<(usize, SendBuf)> =
            vec![(0, SendBuf::from(Vec::new())), (1, SendBuf::from(Vec::new()))];
        assert!(copy_pieces(&mut buf, empty.iter().map(|(_, m)| m)));
        assert_eq!(buf, encoded(&empty));
    }

    #[test]
    fn a_layout_with_more_pieces_than_iovecs_covers_a_prefix_of_the_frames() {
        let mut buf = Vec::new();
        let frames = sends(3, 4 * COPY_MAX);
        let all = encoded(&frames);
        // Frame 0 (one piece): [header], payload; frame 1 (headed): [header, 3-byte head], and
        // its body does not fit.
        let (slices, n) = gather::<3>(&mut buf, frames.iter().map(|(_, m)| m));
        assert_eq!(n, 3);
        let prefix = laid_out(&slices[..n]);
        assert_eq!(prefix.len(), 2 * (1 + wire::SEND_HEADER) + frames[0].1.len() + 3);
        assert_eq!(prefix, all[..prefix.len()]);
    }

    #[test]
    fn the_queue_ends_when_the_last_outbox_goes_and_refuses_frames_once_the_writer_is_gone() {
        let (out, mut rx) = Outbox::new(None);
        let other = out.clone();
        out.queue(window(1)).unwrap();
        drop(out);
        let mut cx = Context::from_waker(Waker::noop());
        let mut got = Vec::new();
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Ready(1));
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Pending, "one outbox left");
        assert!(waiting(&rx));
        drop(other);
        assert!(!waiting(&rx), "the last outbox woke the writer");
        assert_eq!(rx.poll_recv_many(&mut cx, &mut got, 8), Poll::Ready(0), "ended");

        let (out, rx) = Outbox::new(None);
        out.queue(window(1)).unwrap();
        drop(rx);
        assert!(matches!(out.queue(window(2)), Err(Outgoing::Window { rkey: 2, .. })));
        assert!(
            matches!(out.send_now(SendBuf::from(&b"x"[..]), || Some(1)), Direct::Queued),
            "dropped, as the endpoint is dead"
        );
        assert!(out.inner.lock().frames.is_empty(), "nothing is kept for a writer that is gone");
    }
}

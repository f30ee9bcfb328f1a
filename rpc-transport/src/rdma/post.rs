//! Posting work requests: receives, SENDs (inline or from a send slab), READ chunks, and the
//! software backlogs that hold work beyond the send queue's depth or `max_rd_atomic`.
//!
//! Work requests are built as plain data and posted in chains by `sys::post_send`/`post_recv`,
//! which allocate nothing (sideway's post guards allocate three vectors per post): receives
//! re-posted while completions are handled go to the NIC together, before the next send-queue
//! post and before the CQ is polled again; the SENDs and READ chunks of one `pump` go with one
//! doorbell.
//!
//! **Unsignaled SENDs.** An inline SEND (the provider copies its bytes during the post: nothing
//! to keep alive after it) is posted unsignaled, and its completion is reported as soon as it is
//! posted, except one in `signal_every` (at most 64, at most half the send queue), which is
//! signaled, and except while a signaled SEND is pending (SEND completions keep posting order).
//! That saves a work completion, and in event-driven mode a wake-up, per small message.
//! An unsignaled request's send-queue slot is freed by the completion of a later signaled one
//! (completions come in queue order: `sq_retired`); the run of unsignaled requests after the last
//! signaled one is shorter than half the queue, so the queue never fills with requests no
//! completion will retire. A failed request always produces a completion, and fails the
//! connection as any failed request does.

use bytes::Bytes;

use super::buffers::{ReadDest, RegisteredBuf, SlotPool};
use super::conn::{Batched, Chunk, Op, RdmaConnection, ReadOp, SendSource};
use super::error::verbs;
use super::hello::HELLO_MAX;
use super::slab::TAG_BIT;
use super::sys::{self, PostError, RecvWr, SendOp, SendWr, Sge, POST_BATCH};
use crate::{Buf, Completion, ReadError, RecvBuffer, RegionDesc, SendBuf, TransportError, WrId};

impl RdmaConnection {
    /// Posts the hello receive and `recv_depth` receive buffers from the pool (before the peer
    /// can send).
    pub(super) fn post_initial_receives(&mut self, recv_depth: u32) -> Result<(), TransportError> {
        let hello = self.pool_recv_buffer(HELLO_MAX)?;
        self.post_recv_buf(hello, true)?;
        for _ in 0..recv_depth {
            let buf = self.pool_recv_buffer(self.recv_size)?;
            self.post_recv_buf(buf, false)?;
        }
        self.counters.recvs_posted += u64::from(recv_depth);
        self.flush_rq();
        self.check_alive()
    }

    fn pool_recv_buffer(&self, size: usize) -> Result<RecvBuffer, TransportError> {
        Ok(RecvBuffer::from_buf(self.pool.alloc(size)?))
    }

    /// Posts a caller's receive buffer: as it is if it is pool memory of at least `recv_size`
    /// bytes (normally one a receive completion handed out), else a pool buffer in its place
    /// that takes no larger a message than the caller's. Beyond the receive queue's capacity, it
    /// waits until a receive completes.
    pub(super) fn post_user_recv(&mut self, mut buf: RecvBuffer) {
        let usable = {
            let b = buf.buf_mut();
            b.capacity() >= self.recv_size && self.pool.keys_of_buf(b).is_some()
        };
        if !usable {
            let limit = buf.capacity().min(self.recv_size);
            buf = match self.pool.alloc(self.recv_size) {
                Ok(mut b) => {
                    b.set_len(limit);
                    RecvBuffer::from_buf(b)
                }
                Err(e) => return self.fail(format!("allocating a receive buffer failed: {e}")),
            };
        }
        if self.rq_posted >= self.rq_capacity {
            self.recv_backlog.push_back(buf);
            return;
        }
        if let Err(e) = self.post_recv_buf(buf, false) {
            self.fail(format!("posting a receive failed: {e}"));
        }
    }

    /// A receive completed: post the oldest buffer waiting for room in the receive queue.
    pub(super) fn recv_done(&mut self) {
        self.rq_posted = self.rq_posted.saturating_sub(1);
        if self.failed.is_some() {
            self.recv_backlog.clear();
            return;
        }
        if let Some(buf) = self.recv_backlog.pop_front() {
            if let Err(e) = self.post_recv_buf(buf, false) {
                self.fail(format!("posting a receive failed: {e}"));
            }
        }
    }

    /// Queues a receive into the buffer (posted by the next `flush_rq`).
    fn post_recv_buf(&mut self, mut buf: RecvBuffer, hello: bool) -> Result<(), TransportError> {
        let len = if hello { HELLO_MAX } else { self.recv_size };
        let (lkey, addr) = {
            let b = buf.buf_mut();
            let keys = self
                .pool
                .keys_of_buf(b)
                .filter(|_| b.capacity() >= len)
                .ok_or_else(|| verbs("post_recv", "receive buffer outside the connection's pool"))?;
            (keys.lkey, b.storage_mut().as_mut_ptr() as u64)
        };
        if self.qp.is_none() {
            return Err(TransportError::Disconnected("queue pair destroyed".into()));
        }
        let key = self.ops.insert(Op::Recv { buf, hello });
        self.rq_batch.push(RecvWr { wr_id: key, sge: Sge { addr, len: len as u32, lkey } });
        self.rq_posted += 1;
        if self.rq_batch.len() >= POST_BATCH {
            self.flush_rq();
        }
        Ok(())
    }

    /// Posts the queued receives. A refused post fails the connection (the buffers not posted go
    /// back to the pool).
    pub(super) fn flush_rq(&mut self) {
        while !self.rq_batch.is_empty() {
            let n = self.rq_batch.len().min(POST_BATCH);
            let result = match self.qp.as_ref() {
                // SAFETY: each request names `len` bytes of a pool buffer (registered in the QP's
                // PD, lkey from `keys_of`) owned by its `Op::Recv` in `ops` until its completion
                // or flush is handled, or until the QP is destroyed (`abandon_qp`, `Drop`);
                // moving the buffer does not move its memory, and no Rust code touches it
                // meanwhile.
                Some(qp) => unsafe { sys::post_recv(qp, &self.rq_batch[..n]) },
                None => Err(PostError { posted: 0, error: std::io::Error::other("queue pair destroyed") }),
            };
            match result {
                Ok(()) if n == self.rq_batch.len() => self.rq_batch.clear(),
                Ok(()) => {
                    self.rq_batch.drain(..n);
                }
                Err(e) => {
                    let not_posted: Vec<RecvWr> = self.rq_batch.drain(e.posted..).collect();
                    for wr in not_posted {
                        self.ops.remove(wr.wr_id);
                        self.rq_posted = self.rq_posted.saturating_sub(1);
                    }
                    return self.fail(format!("ibv_post_recv failed: {}", e.error));
                }
            }
        }
    }

    /// Sends our hello from its dedicated registered buffer.
    pub(super) fn post_hello(&mut self, msg: &[u8]) -> Result<(), TransportError> {
        let len = msg.len();
        self.hello_buf.bytes_mut(0, len).copy_from_slice(msg);
        let sge = Sge { addr: self.hello_buf.addr(0), len: len as u32, lkey: self.hello_buf.lkey() };
        self.post_setup(SendOp::Send { inline: false }, Some(sge))
    }

    /// Sends a hello nudge (see `RdmaConfig::hello_nudge_after`): a zero-length RDMA WRITE,
    /// which puts a frame on the wire but neither takes a receive of the peer's nor gives it a
    /// completion, and whose key the peer does not check (RFC 6581 uses the same message as its
    /// ready-to-receive signal, and siw sends it with key 1, as here).
    pub(super) fn post_nudge(&mut self) -> Result<(), TransportError> {
        self.post_setup(SendOp::Write { remote_addr: 0, rkey: 1 }, None)
    }

    /// Posts one signaled setup request (hello or nudge) that no caller waits for, at once.
    fn post_setup(&mut self, op: SendOp, sge: Option<Sge>) -> Result<(), TransportError> {
        if self.qp.is_none() {
            return Err(TransportError::Disconnected("queue pair destroyed".into()));
        }
        let seq = self.next_seq();
        let key = self.insert_signaled(Op::Send { wr_id: None, buf: SendSource::None, seq });
        let wr = SendWr { wr_id: key, op, signaled: true, sge, sge2: None };
        self.queue_sq(Batched { wr, unsignaled: None, inline_bytes: None });
        self.flush_sq();
        self.check_alive()
    }

    /// Registers the destination, splits the READ into chunks and queues them.
    pub(super) fn start_read(
        &mut self,
        wr_id: WrId,
        remote: RegionDesc,
        dst: Buf,
    ) -> Result<(), TransportError> {
        self.counters.reads_issued += 1;
        if dst.is_empty() {
            // Nothing to transfer: complete at once (the key is not checked by a zero-length READ).
            self.ready.push_back(Completion::Read { wr_id, result: Ok(dst) });
            return Ok(());
        }
        let (dest, registered) = ReadDest::new(&self.pd, &self.pool, dst)?;
        if registered {
            self.counters.mr_registrations += 1;
            self.counters.bytes_outside_pool += remote.len;
        }
        let chunk = self.limits.max_chunk.clamp(1, u64::from(u32::MAX));
        let chunks = remote.len.div_ceil(chunk);
        let read = self.reads.insert(ReadOp {
            wr_id,
            rkey: remote.rkey,
            dest: Some(dest),
            chunks_left: chunks as u32,
            error: None,
        });
        let mut offset = 0;
        while offset < remote.len {
            let len = (remote.len - offset).min(chunk);
            self.read_backlog.push_back(Chunk {
                read,
                remote_addr: remote.addr + offset,
                rkey: remote.rkey,
                offset,
                len: len as u32,
            });
            offset += len;
        }
        self.pump();
        Ok(())
    }

    /// Posts queued SENDs and READ chunks while the send queue and `max_rd_atomic` allow (one
    /// chain per `POST_BATCH`).
    pub(super) fn pump(&mut self) {
        loop {
            if self.failed.is_some() || self.sq_outstanding() >= self.limits.sq_depth {
                break;
            }
            let mut progress = false;
            if let Some((wr_id, msg)) = self.send_backlog.pop_front() {
                match self.try_post_send(wr_id, msg) {
                    Ok(true) => progress = true,
                    Ok(false) => {}
                    Err(e) => return self.fail(format!("posting a SEND failed: {e}")),
                }
            }
            if self.sq_outstanding() < self.limits.sq_depth && self.reads_in_flight < self.limits.max_reads {
                if let Some(chunk) = self.read_backlog.pop_front() {
                    self.queue_chunk(chunk);
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
        self.flush_sq();
    }

    /// Posts one SEND; `Ok(false)` (and the message back at the head of the backlog) when it must
    /// wait for a send slab (or for the one oversized SEND in flight).
    ///
    /// Where the bytes go out from: inline when they fit `max_inline`; else from a send slab,
    /// whose size is the smaller of our own and the peer's receive size (the peer's announced
    /// size caps what we send but never sizes our memory); a message larger than that (up to the
    /// peer's receive size; the protocol never sends one) is copied into a buffer registered for
    /// that SEND alone, one such SEND in flight at a time.
    pub(super) fn try_post_send(&mut self, wr_id: WrId, mut msg: SendBuf) -> Result<bool, TransportError> {
        let fail = |conn: &mut Self, e: TransportError| {
            conn.ready.push_back(Completion::Send { wr_id, result: Err(e.clone_for_completion()) });
            Err(e)
        };
        let len = msg.len();
        let pooled = || {
            let bytes = msg.contiguous()?;
            Some((self.pool.keys_of(bytes)?, bytes.as_ptr() as u64))
        };
        let buf = if len <= self.limits.max_inline as usize {
            SendSource::None
        } else if let Some((keys, addr)) = pooled() {
            // The operation keeps the message (moving a contiguous `SendBuf` never moves its
            // bytes) until the completion; `msg` is left empty and not read again.
            SendSource::Pooled {
                lkey: keys.lkey,
                addr,
                bytes: std::mem::replace(&mut msg, SendBuf::Shared(Bytes::new())),
            }
        } else if msg.len() <= self.send_slab_size() {
            let slot = match self.send_slab() {
                Ok(pool) => pool.alloc(),
                Err(e) => return fail(self, e),
            };
            match slot {
                Some(slot) => SendSource::Slab(slot),
                None => {
                    self.send_backlog.push_front((wr_id, msg));
                    return Ok(false);
                }
            }
        } else if self.oversized_in_flight {
            self.send_backlog.push_front((wr_id, msg));
            return Ok(false);
        } else {
            match RegisteredBuf::new(&self.pd, msg.len()) {
                Ok(mut own) => {
                    msg.copy_to_slice(own.bytes_mut(0, msg.len()));
                    self.counters.mr_registrations += 1;
                    self.counters.bytes_outside_pool += msg.len() as u64;
                    SendSource::Own(own)
                }
                Err(e) => return fail(self, e),
            }
        };
        let source = match &buf {
            SendSource::None => None,
            SendSource::Slab(slot) => {
                let pool = self.send_pool.as_mut().expect("slot came from the pool");
                msg.copy_to_slice(pool.bytes_mut(*slot, msg.len()));
                self.counters.bytes_outside_pool += msg.len() as u64;
                Some((pool.lkey(), pool.addr(*slot)))
            }
            SendSource::Pooled { lkey, addr, .. } => Some((*lkey, *addr)),
            SendSource::Own(own) => Some((own.lkey(), own.addr(0))),
        };
        let oversized = matches!(buf, SendSource::Own(_));
        let inline = matches!(buf, SendSource::None);
        // Inline: the provider copies the bytes during the post (no key needed); their SGEs are
        // filled in then, from the `Batched` entry that holds them (see `Batched::wr`).
        let sge = source.map(|(lkey, addr)| Sge { addr, len: len as u32, lkey });
        let seq = self.next_seq();
        if inline && self.signaled_sends == 0 && self.unsignaled_run + 1 < self.signal_every {
            self.unsignaled_run += 1;
            self.counters.sends_unsignaled += 1;
            let wr = SendWr {
                wr_id: TAG_BIT | seq,
                op: SendOp::Send { inline: true },
                signaled: false,
                sge,
                sge2: None,
            };
            self.queue_sq(Batched { wr, unsignaled: Some(wr_id), inline_bytes: Some(msg) });
            return Ok(true);
        }
        self.unsignaled_run = 0;
        let key = self.insert_signaled(Op::Send { wr_id: Some(wr_id), buf, seq });
        self.oversized_in_flight |= oversized;
        let wr = SendWr { wr_id: key, op: SendOp::Send { inline }, signaled: true, sge, sge2: None };
        self.queue_sq(Batched { wr, unsignaled: None, inline_bytes: inline.then_some(msg) });
        Ok(true)
    }

    /// Size of each send slab: our own receive size (our largest frame), capped by the peer's.
    fn send_slab_size(&self) -> usize {
        self.recv_size.min(self.info.peer_recv_size as usize).max(1)
    }

    /// The send slab pool, created on first use.
    fn send_slab(&mut self) -> Result<&mut SlotPool, TransportError> {
        if self.send_pool.is_none() {
            let size = self.send_slab_size();
            self.send_pool = Some(SlotPool::new(&self.pd, self.send_slabs, size)?);
        }
        Ok(self.send_pool.as_mut().expect("created above"))
    }

    /// Gives back what a finished (completed, failed or flushed) SEND sent from.
    pub(super) fn release_send_buf(&mut self, buf: SendSource) {
        match buf {
            SendSource::None | SendSource::Pooled { .. } => {}
            SendSource::Slab(slot) => {
                if let Some(pool) = self.send_pool.as_mut() {
                    pool.release(slot);
                }
            }
            SendSource::Own(own) => {
                // Deregistered and freed here: the NIC is done with it (completion or flush, or
                // the QP is destroyed).
                drop(own);
                self.counters.mr_deregistrations += 1;
                self.oversized_in_flight = false;
            }
        }
    }

    /// Queues one chunk of a READ (always signaled).
    fn queue_chunk(&mut self, chunk: Chunk) {
        let Some(read) = self.reads.get_mut(chunk.read) else { return };
        let Some(dest) = read.dest.as_ref() else { return };
        debug_assert!(chunk.offset + u64::from(chunk.len) <= dest.len());
        let sge = Sge { addr: dest.addr(chunk.offset), len: chunk.len, lkey: dest.lkey() };
        let seq = self.next_seq();
        let key = self.insert_signaled(Op::ReadChunk { read: chunk.read, seq });
        self.unsignaled_run = 0;
        self.reads_in_flight += 1;
        let op = SendOp::Read { remote_addr: chunk.remote_addr, rkey: chunk.rkey };
        let wr = SendWr { wr_id: key, op, signaled: true, sge: Some(sge), sge2: None };
        self.queue_sq(Batched { wr, unsignaled: None, inline_bytes: None });
    }

    /// Keeps a signaled send-queue request's operation in `ops` until its completion, counted
    /// in `sq_signaled` (and a SEND in `signaled_sends`); returns its key, the request's `wr_id`.
    fn insert_signaled(&mut self, op: Op) -> u64 {
        self.sq_signaled += 1;
        if matches!(op, Op::Send { .. }) {
            self.signaled_sends += 1;
        }
        self.ops.insert(op)
    }

    /// A signaled request's operation left `ops` (completed, flushed, or never posted):
    /// uncounts it (see [`RdmaConnection::insert_signaled`]).
    pub(super) fn signaled_done(&mut self, op: &Op) {
        match op {
            Op::Send { .. } => {
                self.sq_signaled = self.sq_signaled.saturating_sub(1);
                self.signaled_sends = self.signaled_sends.saturating_sub(1);
            }
            Op::ReadChunk { .. } => self.sq_signaled = self.sq_signaled.saturating_sub(1),
            Op::Recv { .. } => {}
        }
    }

    /// The next send-queue sequence number; the request counts as occupying the queue from now.
    fn next_seq(&mut self) -> u64 {
        self.sq_posted += 1;
        self.sq_posted
    }

    fn queue_sq(&mut self, batched: Batched) {
        self.sq_batch.push(batched);
        if self.sq_batch.len() >= POST_BATCH {
            self.flush_sq();
        }
    }

    /// Posts the queued receives, then the queued send-queue requests as one chain. A refused post
    /// fails the connection: the requests not posted complete with errors at once.
    pub(super) fn flush_sq(&mut self) {
        self.flush_rq();
        while !self.sq_batch.is_empty() {
            let n = self.sq_batch.len().min(POST_BATCH);
            self.counters.send_posts += 1;
            let result = match self.qp.as_ref() {
                // SAFETY: every SGE names memory registered in the QP's PD and kept alive past the
                // request's completion (or flush, or the QP's destruction): a send slab slot, a
                // SEND's own buffer or pool memory whose `SendBuf` its `Op::Send` holds, the hello
                // buffer (kept by the connection past the QP), or a READ destination owned by its
                // `ReadOp` until every chunk came back; none is written (SEND) or touched (READ)
                // by Rust code meanwhile. (Moving a contiguous `SendBuf` into its `Op::Send`
                // never moves its bytes: they are a pool block, a `Vec`'s heap memory or a
                // `Bytes`' memory.) An inline SEND's bytes are only read during the call: its
                // SGEs name them where its `Batched` entry holds them now (a headed message's
                // head lies inside the entry), and the borrow of `sq_batch` keeps the entries in
                // place until after the call.
                Some(qp) => unsafe { sys::post_send(qp, self.sq_batch[..n].iter().map(Batched::wr)) },
                None => Err(PostError { posted: 0, error: std::io::Error::other("queue pair destroyed") }),
            };
            let posted = match &result {
                Ok(()) => n,
                Err(e) => e.posted,
            };
            // An unsignaled SEND completes as it is posted.
            let (reporting, posted_done, ready) = (self.reporting, &mut self.posted_done, &mut self.ready);
            let mut report = |b: &Batched| {
                if let Some(wr_id) = b.unsignaled {
                    if reporting {
                        posted_done.push((wr_id, Ok(())));
                    } else {
                        ready.push_back(Completion::Send { wr_id, result: Ok(()) });
                    }
                }
            };
            if posted == self.sq_batch.len() {
                // All of them: each looked at where it lies, then all dropped in place. Taking
                // them out by value moved each entry (~170 bytes with an inline SEND's bytes: a
                // `memcpy` call per SEND); a `Drain` costs more still for the one or two of a
                // round.
                self.sq_batch.iter().for_each(&mut report);
                self.sq_batch.clear();
            } else {
                for b in self.sq_batch.drain(..posted) {
                    report(&b);
                }
            }
            if let Err(e) = result {
                let reason = format!("ibv_post_send failed: {}", e.error);
                let not_posted: Vec<Batched> = self.sq_batch.drain(..).collect();
                for b in not_posted {
                    self.unpost(b, &reason);
                }
                return self.fail(reason);
            }
        }
    }

    /// Completes a request the provider refused to post.
    pub(super) fn unpost(&mut self, b: Batched, reason: &str) {
        self.sq_posted -= 1;
        let failed = || Err(TransportError::Disconnected(reason.into()));
        if let Some(wr_id) = b.unsignaled {
            self.ready.push_back(Completion::Send { wr_id, result: failed() });
            return;
        }
        let Some(op) = self.ops.remove(b.wr.wr_id) else { return };
        self.signaled_done(&op);
        match op {
            Op::Send { wr_id, buf, .. } => {
                self.release_send_buf(buf);
                if let Some(wr_id) = wr_id {
                    self.ready.push_back(Completion::Send { wr_id, result: failed() });
                }
            }
            Op::ReadChunk { read, .. } => {
                self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
                self.chunk_done(read, Some(ReadError::Flushed));
            }
            Op::Recv { .. } => {}
        }
    }
}

trait CloneForCompletion {
    fn clone_for_completion(&self) -> TransportError;
}

impl CloneForCompletion for TransportError {
    fn clone_for_completion(&self) -> TransportError {
        TransportError::Disconnected(self.to_string().into())
    }
}

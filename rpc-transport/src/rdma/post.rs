//! Posting work requests: receives, SENDs (inline or from a send slab), READ chunks, and the
//! software backlogs that hold work beyond the send queue's depth or `max_rd_atomic`.

use bytes::Bytes;
use sideway::ibverbs::queue_pair::{
    PostSendGuard, QueuePair, SetInlineData, SetScatterGatherEntry, WorkRequestFlags,
};

use super::buffers::{ReadDest, RegisteredBuf, SlotPool};
use super::conn::{Chunk, Op, RdmaConnection, ReadOp, SendBuf};
use super::error::{chain, verbs};
use super::hello::HELLO_MAX;
use crate::{Buf, Completion, RecvBuffer, RegionDesc, TransportError, WrId};

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
        Ok(())
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
            let storage = buf.buf_mut().storage_mut();
            storage.len() >= self.recv_size && self.pool.keys_of(&storage[..self.recv_size]).is_some()
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

    fn post_recv_buf(&mut self, mut buf: RecvBuffer, hello: bool) -> Result<(), TransportError> {
        let len = if hello { HELLO_MAX } else { self.recv_size };
        let (lkey, addr) = {
            let storage = &mut buf.buf_mut().storage_mut()[..len];
            let keys = self
                .pool
                .keys_of(storage)
                .ok_or_else(|| verbs("post_recv", "receive buffer outside the connection's pool"))?;
            (keys.lkey, storage.as_mut_ptr() as u64)
        };
        let Some(qp) = self.qp.as_mut() else {
            return Err(TransportError::Disconnected("queue pair destroyed".into()));
        };
        let key = self.ops.insert(Op::Recv { buf, hello });
        let mut guard = qp.start_post_recv();
        // SAFETY: `addr..addr+len` lies inside a chunk of the connection's pool (registered,
        // lkey), owned by the buffer now held in `ops` until its completion or flush (or until the
        // QP is destroyed); moving the buffer does not move its memory, and no Rust code touches
        // it meanwhile.
        unsafe { guard.construct_wr(key).setup_sge(lkey, addr, len as u32) };
        if let Err(e) = guard.post() {
            self.ops.remove(key);
            return Err(verbs("ibv_post_recv", chain(&e)));
        }
        self.rq_posted += 1;
        Ok(())
    }

    /// Sends our hello from its dedicated registered buffer.
    pub(super) fn post_hello(&mut self, msg: &[u8]) -> Result<(), TransportError> {
        let len = msg.len();
        self.hello_buf.bytes_mut(0, len).copy_from_slice(msg);
        let (lkey, addr) = (self.hello_buf.lkey(), self.hello_buf.addr(0));
        let Some(qp) = self.qp.as_mut() else {
            return Err(TransportError::Disconnected("queue pair destroyed".into()));
        };
        let key = self.ops.insert(Op::Send { wr_id: None, buf: SendBuf::None });
        let mut guard = qp.start_post_send();
        let wr = guard.construct_wr(key, WorkRequestFlags::Signaled).setup_send();
        // SAFETY: the hello buffer is registered (lkey) and owned by the connection, which keeps
        // it until after the QP is destroyed; it is not written again.
        unsafe { wr.setup_sge(lkey, addr, len as u32) };
        if let Err(e) = guard.post() {
            self.ops.remove(key);
            return Err(verbs("ibv_post_send", chain(&e)));
        }
        self.sq_outstanding += 1;
        Ok(())
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

    /// Posts queued SENDs and READ chunks while the send queue and `max_rd_atomic` allow.
    pub(super) fn pump(&mut self) {
        loop {
            if self.failed.is_some() || self.sq_outstanding >= self.limits.sq_depth {
                return;
            }
            let mut progress = false;
            if let Some((wr_id, msg)) = self.send_backlog.pop_front() {
                match self.try_post_send(wr_id, msg) {
                    Ok(true) => progress = true,
                    Ok(false) => {}
                    Err(e) => return self.fail(format!("posting a SEND failed: {e}")),
                }
            }
            if self.sq_outstanding < self.limits.sq_depth && self.reads_in_flight < self.limits.max_reads {
                if let Some(chunk) = self.read_backlog.pop_front() {
                    if let Err(e) = self.post_chunk(chunk) {
                        return self.fail(format!("posting a READ failed: {e}"));
                    }
                    progress = true;
                }
            }
            if !progress {
                return;
            }
        }
    }

    /// Posts one SEND; `Ok(false)` (and the message back at the head of the backlog) when it must
    /// wait for a send slab (or for the one oversized SEND in flight).
    ///
    /// Where the bytes go out from: inline when they fit `max_inline`; else from a send slab,
    /// whose size is the smaller of our own and the peer's receive size (the peer's announced
    /// size caps what we send but never sizes our memory); a message larger than that (up to the
    /// peer's receive size; the protocol never sends one) is copied into a buffer registered for
    /// that SEND alone, one such SEND in flight at a time.
    fn try_post_send(&mut self, wr_id: WrId, msg: Bytes) -> Result<bool, TransportError> {
        let fail = |conn: &mut Self, e: TransportError| {
            conn.ready.push_back(Completion::Send { wr_id, result: Err(e.clone_for_completion()) });
            Err(e)
        };
        let buf = if msg.len() <= self.limits.max_inline as usize {
            SendBuf::None
        } else if let Some(keys) = self.pool.keys_of(&msg) {
            SendBuf::Pooled { lkey: keys.lkey, bytes: msg.clone() }
        } else if msg.len() <= self.send_slab_size() {
            let slot = match self.send_slab() {
                Ok(pool) => pool.alloc(),
                Err(e) => return fail(self, e),
            };
            match slot {
                Some(slot) => SendBuf::Slab(slot),
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
                    own.bytes_mut(0, msg.len()).copy_from_slice(&msg);
                    self.counters.mr_registrations += 1;
                    self.counters.bytes_outside_pool += msg.len() as u64;
                    SendBuf::Own(own)
                }
                Err(e) => return fail(self, e),
            }
        };
        let source = match &buf {
            SendBuf::None => None,
            SendBuf::Slab(slot) => {
                let pool = self.send_pool.as_mut().expect("slot came from the pool");
                pool.bytes_mut(*slot, msg.len()).copy_from_slice(&msg);
                self.counters.bytes_outside_pool += msg.len() as u64;
                Some((pool.lkey(), pool.addr(*slot)))
            }
            SendBuf::Pooled { lkey, bytes } => Some((*lkey, bytes.as_ptr() as u64)),
            SendBuf::Own(own) => Some((own.lkey(), own.addr(0))),
        };
        let oversized = matches!(buf, SendBuf::Own(_));
        let key = self.ops.insert(Op::Send { wr_id: Some(wr_id), buf });
        let posted = match source {
            None => self.post_inline_send(key, &msg),
            Some((lkey, addr)) => self.post_registered_send(key, lkey, addr, msg.len()),
        };
        if let Err(e) = posted {
            if let Some(Op::Send { buf, .. }) = self.ops.remove(key) {
                self.release_send_buf(buf);
            }
            return fail(self, e);
        }
        self.oversized_in_flight |= oversized;
        self.sq_outstanding += 1;
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
    pub(super) fn release_send_buf(&mut self, buf: SendBuf) {
        match buf {
            SendBuf::None | SendBuf::Pooled { .. } => {}
            SendBuf::Slab(slot) => {
                if let Some(pool) = self.send_pool.as_mut() {
                    pool.release(slot);
                }
            }
            SendBuf::Own(own) => {
                // Deregistered and freed here: the NIC is done with it (completion or flush, or
                // the QP is destroyed).
                drop(own);
                self.counters.mr_deregistrations += 1;
                self.oversized_in_flight = false;
            }
        }
    }

    fn post_inline_send(&mut self, key: u64, msg: &[u8]) -> Result<(), TransportError> {
        let qp =
            self.qp.as_mut().ok_or_else(|| TransportError::Disconnected("queue pair destroyed".into()))?;
        let mut guard = qp.start_post_send();
        let wr = guard.construct_wr(key, WorkRequestFlags::Signaled).setup_send();
        if !msg.is_empty() {
            // The provider copies inline data during ibv_post_send: nothing to keep alive.
            wr.setup_inline_data(msg);
        }
        guard.post().map_err(|e| verbs("ibv_post_send", chain(&e)))
    }

    fn post_registered_send(
        &mut self,
        key: u64,
        lkey: u32,
        addr: u64,
        len: usize,
    ) -> Result<(), TransportError> {
        let qp =
            self.qp.as_mut().ok_or_else(|| TransportError::Disconnected("queue pair destroyed".into()))?;
        let mut guard = qp.start_post_send();
        let wr = guard.construct_wr(key, WorkRequestFlags::Signaled).setup_send();
        // SAFETY: `lkey`/`addr` name a slot of the registered send pool, the SEND's own
        // registered buffer, or pool memory whose `Bytes` this SEND's Op holds, with `len` bytes;
        // all are kept alive by the connection (the latter two by this SEND's Op) until its
        // completion or flush, or until after the QP is destroyed, and are not written meanwhile
        // (`Bytes` are immutable).
        unsafe { wr.setup_sge(lkey, addr, len as u32) };
        guard.post().map_err(|e| verbs("ibv_post_send", chain(&e)))
    }

    fn post_chunk(&mut self, chunk: Chunk) -> Result<(), TransportError> {
        let Some(read) = self.reads.get_mut(chunk.read) else { return Ok(()) };
        let Some(dest) = read.dest.as_ref() else { return Ok(()) };
        debug_assert!(chunk.offset + u64::from(chunk.len) <= dest.len());
        let (lkey, addr) = (dest.lkey(), dest.addr(chunk.offset));
        let qp =
            self.qp.as_mut().ok_or_else(|| TransportError::Disconnected("queue pair destroyed".into()))?;
        let key = self.ops.insert(Op::ReadChunk { read: chunk.read });
        let mut guard = qp.start_post_send();
        let wr =
            guard.construct_wr(key, WorkRequestFlags::Signaled).setup_read(chunk.rkey, chunk.remote_addr);
        // SAFETY: the destination range lies inside the READ's registered destination (lkey),
        // owned by its ReadOp, which is handed back only after every chunk completed or flushed.
        unsafe { wr.setup_sge(lkey, addr, chunk.len) };
        if let Err(e) = guard.post() {
            self.ops.remove(key);
            self.read_backlog.push_front(chunk);
            return Err(verbs("ibv_post_send", chain(&e)));
        }
        self.sq_outstanding += 1;
        self.reads_in_flight += 1;
        Ok(())
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

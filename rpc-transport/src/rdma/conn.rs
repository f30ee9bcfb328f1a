//! [`RdmaConnection`]: one RC queue pair with its CQ, pools and pending operations.
//!
//! Posting lives in `post.rs`, completion handling and failure in `complete.rs`, connection
//! setup in `setup.rs`.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::BasicQueuePair;
use sideway::rdmacm::communication_manager::Identifier;

use super::buffers::{off_page_boundary, AdvertisedRegion, ReadDest, RegisteredBuf, SlotPool};
use super::cm::{CmChannel, CmSink};
use super::cq::CqPoller;
use super::hello::Hello;
use super::slab::Slab;
use super::sys::{RecvWr, SendWr, Sge, WorkCompletion};
use crate::{
    take_each, Buf, Completion, ConnInfo, Connection, KeyPolicy, MemPool, RKey, ReadError, RecvBuffer,
    RegionDesc, SendBuf, TransportCounters, TransportError, WrId,
};

/// A work request in flight; its slab key is the verbs `wr_id`.
#[derive(Debug)]
pub(super) enum Op {
    /// A posted receive into `buf`, a buffer of the connection's pool (`hello`: the receive of
    /// the peer's hello).
    Recv { buf: RecvBuffer, hello: bool },
    /// A posted, signaled SEND; `wr_id` is `None` for the hello. `seq`: its place on the send
    /// queue (see [`RdmaConnection::sq_posted`]).
    Send { wr_id: Option<WrId>, buf: SendSource, seq: u64 },
    /// One chunk of the READ with key `read` in the READ slab (always signaled).
    ReadChunk { read: u64, seq: u64 },
}

/// What a posted SEND's bytes went out from, kept until its completion.
#[derive(Debug)]
pub(super) enum SendSource {
    /// Inline (copied by the provider at post time), or the hello's own buffer.
    None,
    /// A slot of the send slab pool.
    Slab(u32),
    /// Bytes of the connection's pool, sent as they are from `addr`: `bytes` keeps them alive
    /// until the completion (held, never read).
    Pooled {
        lkey: u32,
        addr: u64,
        #[allow(dead_code)]
        bytes: SendBuf,
    },
    /// A buffer registered for this SEND alone (larger than a send slab).
    Own(RegisteredBuf),
}

/// A send-queue request built and not yet posted.
#[derive(Debug)]
pub(super) struct Batched {
    pub(super) wr: SendWr,
    /// For an unsignaled SEND, the caller's id: its completion is reported once it is posted.
    pub(super) unsignaled: Option<WrId>,
    /// For an inline SEND, its bytes, kept alive until the post (which copies them, from the
    /// SGEs [`Batched::wr`] names).
    pub(super) inline_bytes: Option<SendBuf>,
}

impl Batched {
    /// The request as it is posted now. An inline SEND's SGEs name its bytes where this entry
    /// holds them at this moment (the head of a [`SendBuf::Headed`] lies inside the entry, so
    /// they are named only when the entry no longer moves: during the post).
    pub(super) fn wr(&self) -> SendWr {
        let mut wr = self.wr;
        if let Some(msg) = &self.inline_bytes {
            let sge = |p: &[u8]| {
                (!p.is_empty()).then_some(Sge { addr: p.as_ptr() as u64, len: p.len() as u32, lkey: 0 })
            };
            let [first, second] = msg.parts();
            (wr.sge, wr.sge2) = match (sge(first), sge(second)) {
                (None, rest) => (rest, None),
                (first, rest) => (first, rest),
            };
        }
        wr
    }
}

/// A READ, possibly split in several chunks.
#[derive(Debug)]
pub(super) struct ReadOp {
    pub(super) wr_id: WrId,
    pub(super) rkey: RKey,
    pub(super) dest: Option<ReadDest>,
    /// Chunks not completed yet (posted or waiting in the backlog).
    pub(super) chunks_left: u32,
    pub(super) error: Option<ReadError>,
}

/// One READ work request waiting for room in the send queue / under `max_rd_atomic`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chunk {
    pub(super) read: u64,
    pub(super) remote_addr: u64,
    pub(super) rkey: RKey,
    pub(super) offset: u64,
    pub(super) len: u32,
}

/// Limits fixed at setup.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) sq_depth: u32,
    pub(super) max_inline: u32,
    pub(super) max_chunk: u64,
    pub(super) max_reads: u32,
    pub(super) poll_budget: usize,
}

/// An established (or being established) verbs connection.
pub struct RdmaConnection {
    // Drop order matters; see `Drop`. The QP goes first (explicitly), then the CQ poller (which
    // acks its events), then every registered buffer, then the rdma_cm identifier and channel.
    pub(super) qp: Option<BasicQueuePair>,
    pub(super) cq: CqPoller,
    pub(super) info: ConnInfo,
    pub(super) limits: Limits,
    pub(super) ops: Slab<Op>,
    pub(super) reads: Slab<ReadOp>,
    /// The connection's registered memory: receives, and whatever callers allocate from it.
    pub(super) pool: MemPool,
    pub(super) key_policy: KeyPolicy,
    /// Receives posted, and how many the receive queue holds.
    pub(super) rq_posted: u32,
    pub(super) rq_capacity: u32,
    pub(super) recv_backlog: VecDeque<RecvBuffer>,
    pub(super) recv_size: usize,
    pub(super) send_pool: Option<SlotPool>,
    pub(super) send_slabs: u32,
    /// A SEND larger than a send slab is in flight from its own registered buffer.
    pub(super) oversized_in_flight: bool,
    pub(super) hello_buf: RegisteredBuf,
    pub(super) send_backlog: VecDeque<(WrId, SendBuf)>,
    pub(super) read_backlog: VecDeque<Chunk>,
    /// Work requests put on the send queue so far (including those in `sq_batch`); the n-th
    /// has `seq` n.
    pub(super) sq_posted: u64,
    /// The highest `seq` known complete. Completions come in send-queue order, so a completion
    /// (of a signaled request, or an error/flush of any) completes every request before it, the
    /// unsignaled ones included: `sq_posted - sq_retired` requests occupy the send queue.
    pub(super) sq_retired: u64,
    /// Signaled SENDs and READ chunks in `ops` (what a failed connection waits for).
    pub(super) sq_signaled: u32,
    /// Signaled SENDs in `ops`. A SEND goes unsignaled only when there is none: its completion,
    /// reported at once, then never overtakes an earlier SEND's (SEND completions keep posting
    /// order).
    pub(super) signaled_sends: u32,
    /// Unsignaled SENDs since the last signaled request, and the run length that forces one
    /// signaled (at most half the send queue, so that the queue never fills with requests no
    /// completion will retire).
    pub(super) unsignaled_run: u32,
    pub(super) signal_every: u32,
    /// Send-queue requests built and not yet posted: posted together (one doorbell) at the end of
    /// `pump` or when [`super::sys::POST_BATCH`] are waiting. The `WrId` of an unsignaled SEND
    /// rides along: its completion is reported once it is posted.
    pub(super) sq_batch: Vec<Batched>,
    /// Receives queued and not yet posted: posted together at the end of the call that queued
    /// them (`post_recv`, `post_recv_batch`, the handling of a batch of completions), so a
    /// credit never reaches the peer before its buffer is posted.
    pub(super) rq_batch: Vec<RecvWr>,
    pub(super) reads_in_flight: u32,
    /// Regions advertised with a registration of their own.
    pub(super) regions: HashMap<RKey, AdvertisedRegion>,
    /// Regions of pool memory advertised with their chunk's key, kept alive until revoked.
    pub(super) pooled_regions: HashMap<RegionDesc, Bytes>,
    pub(super) ready: VecDeque<Completion>,
    /// While `post_send_batch_reporting` runs (`reporting`): the SENDs completed at posting
    /// (unsignaled), on their way to its caller's list, not through `ready`. Empty otherwise;
    /// its capacity is reused.
    pub(super) posted_done: Vec<(WrId, Result<(), TransportError>)>,
    pub(super) reporting: bool,
    pub(super) peer_hello: Option<Result<Hello, TransportError>>,
    /// Hello nudges (zero-length RDMA WRITEs) this side sent while connecting, at most
    /// `HELLO_NUDGES`.
    pub(super) nudges_sent: u32,
    pub(super) failed: Option<String>,
    /// The failure was a peer's message that broke the rules (reported as `Malformed`).
    pub(super) malformed: bool,
    /// `poll_completions` returned the failure: nothing is delivered after that (sticky error).
    pub(super) error_reported: bool,
    pub(super) disconnected: bool,
    pub(super) counters: TransportCounters,
    pub(super) wc_scratch: Vec<WorkCompletion>,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) cm_sink: Arc<CmSink>,
    /// The waker the sink holds since our last `Pending` look at it (none after an event: the
    /// event's wake-up took it). While it is the caller's, a look at the sink's length is enough.
    pub(super) cm_waker: Option<Waker>,
    pub(super) id: Option<Arc<Identifier>>,
    pub(super) cm: Arc<CmChannel>,
}

impl fmt::Debug for RdmaConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaConnection")
            .field("peer", &self.info.peer)
            .field("pending", &self.ops.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl RdmaConnection {
    /// `Err(Disconnected)` (or `Malformed`) once the connection failed or was closed.
    pub(super) fn check_alive(&self) -> Result<(), TransportError> {
        match &self.failed {
            Some(_) => Err(self.failure_error()),
            None => Ok(()),
        }
    }

    /// The error a failed connection reports.
    pub(super) fn failure_error(&self) -> TransportError {
        let reason = self.failed.clone().unwrap_or_default();
        if self.malformed {
            TransportError::Malformed(reason)
        } else {
            TransportError::Disconnected(reason.into())
        }
    }

    /// Drives the connection: rdma_cm events, then the CQ. Returns `Pending` only with wakers
    /// registered on both.
    pub(super) fn poll_progress(&mut self, cx: &mut Context<'_>) {
        // The CQ first: a message that arrived before the peer disconnected is delivered.
        self.poll_cq(cx);
        // Receives re-posted from the backlog while completions were handled.
        self.flush_rq();
        self.poll_cm_events(cx);
    }

    fn poll_cm_events(&mut self, cx: &mut Context<'_>) {
        if self.cm_sink.is_quiet() && self.cm_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            // Nothing came, and what comes wakes this caller: no registering, no lock.
            return;
        }
        self.cm_waker = None;
        while let Poll::Ready(ev) = self.cm_sink.poll_next(cx) {
            use super::cm::CmEvent;
            match ev {
                CmEvent::Disconnected => {
                    // fail() answers with our own rdma_disconnect (the DREP on IB/RoCE).
                    self.fail("peer disconnected".into());
                }
                CmEvent::Failed { kind, status } => {
                    self.fail(format!("rdma_cm reported {kind} (status {status})"));
                    if kind == "DEVICE_REMOVAL" {
                        self.abandon_qp();
                    }
                }
                other => tracing::trace!(event = ?other, "rdma_cm event on an established connection"),
            }
        }
        self.cm_waker = Some(cx.waker().clone());
    }

    /// Polls the CQ until it is empty (waker registered) or a user-visible completion is ready,
    /// within the poll budget.
    fn poll_cq(&mut self, cx: &mut Context<'_>) {
        let mut budget = self.limits.poll_budget;
        while budget > 0 {
            let mut scratch = std::mem::take(&mut self.wc_scratch);
            scratch.clear();
            let polled = self.cq.poll(cx, budget, |wc| scratch.push(*wc));
            for wc in &scratch {
                self.on_completion(wc);
            }
            self.wc_scratch = scratch;
            match polled {
                Poll::Pending => return,
                Poll::Ready(Err(e)) => {
                    self.fail(format!("polling the completion queue failed: {e}"));
                    self.abandon_qp();
                    return;
                }
                Poll::Ready(Ok(n)) => {
                    budget = budget.saturating_sub(n.max(1));
                    if !self.ready.is_empty() || self.peer_hello.is_some() {
                        return;
                    }
                }
            }
        }
        // Budget used up on internal completions only: yield, but make sure we are polled again.
        cx.waker().wake_by_ref();
    }

    /// Sends the rdma_cm disconnect once (unless the peer's came first).
    pub(super) fn disconnect_cm(&mut self) {
        if let (Some(id), false) = (&self.id, self.disconnected) {
            if let Err(e) = id.disconnect() {
                tracing::debug!(error = %e, "rdma_disconnect failed");
            }
        }
        self.disconnected = true;
    }

    /// True once the connection failed and every SEND and READ came back. Posted receives are
    /// not waited for: they are dropped on failure anyway, and siw does not always flush the
    /// last one.
    fn fully_flushed(&self) -> bool {
        self.failed.is_some() && self.sq_signaled == 0 && self.reads.is_empty()
    }

    /// Checks a SEND and queues it behind the others (posted by the next `pump`), or, when none
    /// waits and the send queue has room, builds its work request at once (the common case: the
    /// message is not moved through the backlog). The work request is posted by the next
    /// `flush_sq` (the `pump` that follows).
    fn queue_send(&mut self, wr_id: WrId, msg: SendBuf) -> Result<(), TransportError> {
        self.check_alive()?;
        let max = self.info.peer_recv_size as usize;
        if msg.len() > max {
            return Err(TransportError::MessageTooLarge { len: msg.len(), max });
        }
        self.counters.sends += 1;
        if !self.send_backlog.is_empty() || self.sq_outstanding() >= self.limits.sq_depth {
            self.send_backlog.push_back((wr_id, msg));
            return Ok(());
        }
        // As `pump` would post it (a SEND that must wait goes back to the backlog).
        if let Err(e) = self.try_post_send(wr_id, msg) {
            self.fail(format!("posting a SEND failed: {e}"));
        }
        Ok(())
    }

    /// Work requests occupying the send queue (posted or batched, not known complete).
    pub(super) fn sq_outstanding(&self) -> u32 {
        u32::try_from(self.sq_posted - self.sq_retired).unwrap_or(u32::MAX)
    }
}

impl Connection for RdmaConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn post_recv(&mut self, buf: RecvBuffer) -> Result<(), TransportError> {
        self.check_alive()?;
        self.counters.recvs_posted += 1;
        self.post_user_recv(buf);
        self.flush_rq();
        Ok(())
    }

    fn post_recv_batch(&mut self, bufs: &mut Vec<RecvBuffer>) -> Result<(), TransportError> {
        self.check_alive()?;
        let _ = take_each(bufs, |buf| {
            self.counters.recvs_posted += 1;
            self.post_user_recv(buf);
            Ok::<(), std::convert::Infallible>(())
        });
        self.flush_rq();
        Ok(())
    }

    fn post_send(&mut self, wr_id: WrId, msg: SendBuf) -> Result<(), TransportError> {
        self.queue_send(wr_id, msg)?;
        self.pump();
        Ok(())
    }

    fn post_send_batch(&mut self, sends: &mut Vec<(WrId, SendBuf)>) -> Result<(), TransportError> {
        // Stops at a refused SEND: the ones after it are dropped unposted.
        let result = take_each(sends, |(wr_id, msg)| self.queue_send(wr_id, msg));
        // One pump: the SENDs leave in chains, one doorbell per `POST_BATCH`.
        self.pump();
        result
    }

    fn post_send_batch_reporting(
        &mut self,
        sends: &mut Vec<(WrId, SendBuf)>,
        done: &mut Vec<(WrId, Result<(), TransportError>)>,
    ) -> Result<(), TransportError> {
        let before = self.ready.len();
        // The unsignaled SENDs are set aside for `done` as they are posted (`flush_sq`).
        self.reporting = true;
        let result = self.post_send_batch(sends);
        self.reporting = false;
        done.append(&mut self.posted_done);
        // What else the posting completed (SENDs failed or flushed by a failure) was appended to
        // `ready`: SEND completions go to the caller, after those posted, the rest stay, in
        // order.
        let mut i = before;
        while i < self.ready.len() {
            if matches!(self.ready[i], Completion::Send { .. }) {
                if let Some(Completion::Send { wr_id, result }) = self.ready.remove(i) {
                    done.push((wr_id, result));
                }
            } else {
                i += 1;
            }
        }
        result
    }

    fn pool(&self) -> &MemPool {
        &self.pool
    }

    fn register(&mut self, data: Bytes) -> Result<RegionDesc, TransportError> {
        self.check_alive()?;
        let data = off_page_boundary(data);
        let len = data.len() as u64;
        let pooled = if data.is_empty() { None } else { self.pool.keys_of(&data) };
        if let (Some(keys), KeyPolicy::PoolKeys) = (pooled, self.key_policy) {
            let desc = RegionDesc { addr: data.as_ptr() as u64, len, rkey: keys.rkey };
            // The same bytes advertised twice at once get a registration of their own, so that
            // each descriptor is revoked on its own.
            if let std::collections::hash_map::Entry::Vacant(slot) = self.pooled_regions.entry(desc) {
                slot.insert(data);
                self.counters.regions_registered += 1;
                return Ok(desc);
            }
        }
        if pooled.is_none() {
            self.counters.bytes_outside_pool += len;
        }
        let (region, addr) = AdvertisedRegion::new(&self.pd, data)?;
        self.counters.mr_registrations += 1;
        let rkey = region.rkey();
        self.regions.insert(rkey, region);
        self.counters.regions_registered += 1;
        Ok(RegionDesc { addr, len, rkey })
    }

    fn deregister(&mut self, region: RegionDesc) -> Result<(), TransportError> {
        if self.pooled_regions.remove(&region).is_some() {
            // The bytes may go back to the pool: the peer reported its READ done, or the
            // connection is gone. The chunk's key stays valid for this peer (KeyPolicy::PoolKeys).
            self.counters.regions_revoked += 1;
            return Ok(());
        }
        // Dropping the region runs ibv_dereg_mr: the key is invalid at the NIC when this returns.
        match self.regions.remove(&region.rkey) {
            Some(own) => {
                drop(own);
                self.counters.regions_revoked += 1;
                self.counters.mr_deregistrations += 1;
                Ok(())
            }
            None => Err(TransportError::UnknownKey(region.rkey)),
        }
    }

    fn post_read(&mut self, wr_id: WrId, remote: RegionDesc, dst: Buf) -> Result<(), TransportError> {
        self.check_alive()?;
        self.info.check_read(&remote, dst.len())?;
        self.start_read(wr_id, remote, dst)
    }

    fn poll_completions(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Poll<Result<(), TransportError>> {
        if max == 0 {
            return Poll::Ready(Ok(()));
        }
        if self.ready.is_empty() {
            self.poll_progress(cx);
        }
        if !self.ready.is_empty() {
            // One by one (a `Drain` costs more than the loop for the one or two of a poll).
            let n = max.min(self.ready.len());
            for _ in 0..n {
                if let Some(c) = self.ready.pop_front() {
                    out.push(c);
                }
            }
            return Poll::Ready(Ok(()));
        }
        if self.fully_flushed() {
            self.error_reported = true;
            return Poll::Ready(Err(self.failure_error()));
        }
        Poll::Pending
    }

    fn counters(&self) -> TransportCounters {
        let pool = self.pool.counters();
        let mut c = self.counters;
        c.mr_registrations += pool.registrations;
        c.mr_deregistrations += pool.deregistrations;
        c.busy_poll_spins = self.cq.spins();
        c.hello_nudges = u64::from(self.nudges_sent);
        c
    }

    fn close(&mut self) {
        self.fail("connection closed".into());
        // Our own decision: don't depend on the provider flushing every posted work request
        // (siw does not always): destroy the QP, after which the NIC touches none of our buffers,
        // and flush what is still pending in software.
        self.abandon_qp();
    }
}

impl Drop for RdmaConnection {
    fn drop(&mut self) {
        self.disconnect_cm();
        // Destroying the QP first guarantees the NIC no longer touches any buffer below; the CQ
        // poller then acks its events before the CQ is destroyed (when its last Arc goes).
        self.qp = None;
        // Release the identifier before the channel so that its dispatcher can see it is unused.
        self.id = None;
        self.cm.nudge();
    }
}

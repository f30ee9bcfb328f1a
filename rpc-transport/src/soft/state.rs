//! The state of one software endpoint, always used under its mutex.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use super::pending::PendingOps;
use super::regions::RegionTable;
use super::{Death, OpId};
use crate::{
    Buf, Completion, MemPool, ReadError, RecvBuffer, RegionDesc, TransportCounters, TransportError, WrId,
};

/// `max_overflow` is at least this many messages.
const MIN_OVERFLOW: usize = 64;

/// An operation posted and not yet completed.
#[derive(Debug)]
enum Pending {
    Send(WrId),
    /// `dst` is `None` while a backend fills it outside the lock. `done`: the READ completed
    /// at once ([`State::read_at_once`]) and is reported when every READ posted before it is.
    Read {
        wr_id: WrId,
        remote: RegionDesc,
        dst: Option<Buf>,
        done: Option<Buf>,
    },
}

#[derive(Debug)]
pub(super) struct State {
    posted: VecDeque<RecvBuffer>,
    /// Messages that arrived while no receive was posted, in arrival order. Invariant: when it
    /// is non-empty, `posted` is empty.
    overflow: VecDeque<Bytes>,
    /// Most messages `overflow` may hold: a peer that overruns the receive queue further than
    /// this is broken (or hostile) and the connection fails rather than buffer without bound.
    max_overflow: usize,
    cq: VecDeque<Completion>,
    waker: Option<Waker>,
    /// Set when a completion was queued or the endpoint died: the waker must be woken.
    notify: bool,
    /// Pending operations by id, in posting order.
    pending: PendingOps<Pending>,
    next_op: OpId,
    pub(super) regions: RegionTable,
    pub(super) counters: TransportCounters,
    /// SENDs begun as direct writes that went to the writer after all (see
    /// [`super::Soft::counters`]).
    pub(super) direct_sends_queued: u64,
    dead: Option<Death>,
}

impl State {
    pub(super) fn new(recv_depth: u32, recv_size: u32, pool: &MemPool) -> State {
        let posted: VecDeque<RecvBuffer> =
            (0..recv_depth).map(|_| RecvBuffer::from_buf(pool.alloc_or_heap(recv_size as usize))).collect();
        let counters = TransportCounters { recvs_posted: u64::from(recv_depth), ..Default::default() };
        State {
            posted,
            overflow: VecDeque::new(),
            max_overflow: (recv_depth as usize).max(MIN_OVERFLOW),
            cq: VecDeque::new(),
            waker: None,
            notify: false,
            pending: PendingOps::default(),
            next_op: 1,
            regions: RegionTable::default(),
            counters,
            direct_sends_queued: 0,
            dead: None,
        }
    }

    pub(super) fn alive(&self) -> Result<(), Death> {
        match &self.dead {
            Some(death) => Err(death.clone()),
            None => Ok(()),
        }
    }

    pub(super) fn take_waker_to_notify(&mut self) -> Option<Waker> {
        if std::mem::take(&mut self.notify) {
            self.waker.take()
        } else {
            None
        }
    }

    fn push(&mut self, completion: Completion) {
        self.cq.push_back(completion);
        self.notify = true;
    }

    /// Marks the endpoint dead and flushes everything; `false` if it already was.
    pub(super) fn die(&mut self, death: Death) -> bool {
        if self.dead.is_some() {
            return false;
        }
        self.posted.clear();
        self.overflow.clear();
        for op in self.pending.take_all() {
            let flushed = match op {
                Pending::Send(wr_id) => {
                    Completion::Send { wr_id, result: Err(TransportError::Disconnected(death.detail())) }
                }
                Pending::Read { wr_id, .. } => Completion::Read { wr_id, result: Err(ReadError::Flushed) },
            };
            self.cq.push_back(flushed);
        }
        self.dead = Some(death);
        self.notify = true;
        true
    }

    pub(super) fn post_recv(&mut self, buf: RecvBuffer) -> Result<(), Death> {
        self.alive()?;
        self.counters.recvs_posted += 1;
        match self.overflow.pop_front() {
            Some(msg) => self.fill_and_complete(buf, [&msg, &[]]),
            None => {
                self.posted.push_back(buf);
                Ok(())
            }
        }
    }

    pub(super) fn deliver(&mut self, msg: [&[u8]; 2]) -> Result<(), Death> {
        self.alive()?;
        match self.posted.pop_front() {
            Some(buf) => self.fill_and_complete(buf, msg),
            None if self.overflow.len() >= self.max_overflow => Err(Death::Malformed(format!(
                "peer overran the receive queue by more than {} messages",
                self.max_overflow
            ))),
            None => {
                self.counters.recv_unexpected += 1;
                self.overflow.push_back(Bytes::from(msg.concat()));
                Ok(())
            }
        }
    }

    fn fill_and_complete(&mut self, mut buf: RecvBuffer, msg: [&[u8]; 2]) -> Result<(), Death> {
        if !buf.fill(msg) {
            return Err(Death::Malformed(format!(
                "message of {} bytes does not fit the posted receive buffer of {} bytes",
                msg[0].len() + msg[1].len(),
                buf.capacity()
            )));
        }
        self.complete_recv(buf);
        Ok(())
    }

    pub(super) fn take_posted_recv(&mut self) -> Option<RecvBuffer> {
        if self.dead.is_some() {
            return None;
        }
        self.posted.pop_front()
    }

    pub(super) fn complete_recv(&mut self, buf: RecvBuffer) {
        if self.dead.is_none() {
            self.counters.recvs += 1;
            self.push(Completion::Recv { buf });
        }
    }

    fn new_op(&mut self, op: Pending) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        self.pending.push(id, op);
        id
    }

    pub(super) fn begin_send(&mut self, wr_id: WrId) -> Result<OpId, Death> {
        self.alive()?;
        self.counters.sends += 1;
        Ok(self.new_op(Pending::Send(wr_id)))
    }

    /// Counts a SEND carried out at once (see [`super::Soft::send_at_once`]).
    pub(super) fn begin_send_at_once(&mut self) -> Result<(), Death> {
        self.alive()?;
        self.counters.sends += 1;
        Ok(())
    }

    /// Completes a SEND carried out at once: with its result, or as flushed (as [`State::die`]
    /// completes pending SENDs) if the endpoint died meanwhile.
    pub(super) fn complete_send_at_once(&mut self, wr_id: WrId, result: Result<(), TransportError>) {
        let result = self.send_at_once_result(result);
        self.push(Completion::Send { wr_id, result });
    }

    /// What a SEND carried out at once completes with: its own result, or the endpoint's death
    /// if it died meanwhile.
    pub(super) fn send_at_once_result(
        &self,
        result: Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        match &self.dead {
            Some(death) => Err(TransportError::Disconnected(death.detail())),
            None => result,
        }
    }

    /// See [`super::Soft::record_direct_send`].
    pub(super) fn record_direct_send(&mut self, wr_id: WrId) -> Option<OpId> {
        self.direct_sends_queued += 1;
        if self.dead.is_some() {
            // Completes as flushed: `send_at_once_result` sees the death.
            self.complete_send_at_once(wr_id, Ok(()));
            return None;
        }
        Some(self.new_op(Pending::Send(wr_id)))
    }

    /// Takes a pending SEND off the pending operations and returns its id; `None` if it was
    /// flushed meanwhile (its completion is then already queued).
    pub(super) fn take_send(&mut self, op: OpId) -> Option<WrId> {
        let Some(Pending::Send(wr_id)) = self.pending.get(op) else { return None };
        let wr_id = *wr_id;
        self.pending.remove(op);
        Some(wr_id)
    }

    pub(super) fn complete_send(&mut self, op: OpId, result: Result<(), TransportError>) {
        if let Some(wr_id) = self.take_send(op) {
            self.push(Completion::Send { wr_id, result });
        }
    }

    pub(super) fn begin_read(&mut self, wr_id: WrId, remote: RegionDesc, dst: Buf) -> Result<OpId, Death> {
        self.alive()?;
        self.counters.reads_issued += 1;
        Ok(self.new_op(Pending::Read { wr_id, remote, dst: Some(dst), done: None }))
    }

    /// A READ whose data the backend already holds. READ completions come in posting order (as
    /// on a verbs send queue): it is reported now if no earlier READ is pending, else as soon as
    /// they all are (and flushed with them if the endpoint dies first).
    pub(super) fn read_at_once(&mut self, wr_id: WrId, remote: RegionDesc, data: Buf) -> Result<(), Death> {
        self.alive()?;
        self.counters.reads_issued += 1;
        self.counters.reads_served_from_push += 1;
        self.new_op(Pending::Read { wr_id, remote, dst: None, done: Some(data) });
        self.report_done_reads();
        Ok(())
    }

    /// Reports the READs completed at once that no pending READ posted earlier holds back.
    fn report_done_reads(&mut self) {
        loop {
            let first = self.pending.iter_mut().find(|(_, p)| matches!(p, Pending::Read { .. }));
            let Some((op, Pending::Read { wr_id, done, .. })) = first else { return };
            let Some(data) = done.take() else { return };
            let wr_id = *wr_id;
            self.pending.remove(op);
            self.counters.bytes_read += data.len() as u64;
            self.push(Completion::Read { wr_id, result: Ok(data) });
        }
    }

    pub(super) fn take_read(&mut self, op: OpId) -> Option<(RegionDesc, Buf)> {
        match self.pending.get_mut(op) {
            Some(Pending::Read { remote, dst, .. }) => dst.take().map(|d| (*remote, d)),
            _ => None,
        }
    }

    pub(super) fn complete_read(&mut self, op: OpId, result: Result<Buf, ReadError>) {
        if let Some(Pending::Read { wr_id, .. }) = self.pending.get(op) {
            let wr_id = *wr_id;
            self.pending.remove(op);
            let ok = result.is_ok();
            if let Ok(bytes) = &result {
                self.counters.bytes_read += bytes.len() as u64;
            }
            self.push(Completion::Read { wr_id, result });
            // After a failed READ the connection fails (as a queue pair does): READs posted
            // after it are flushed, not reported done.
            if ok {
                self.report_done_reads();
            }
        }
    }

    pub(super) fn poll_completions(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Poll<Result<(), TransportError>> {
        if max == 0 {
            return Poll::Ready(Ok(()));
        }
        if !self.cq.is_empty() {
            // Popped one by one: cheaper than a `drain` for the one or two completions a poll
            // usually finds.
            let n = max.min(self.cq.len());
            out.reserve(n);
            for _ in 0..n {
                let Some(completion) = self.cq.pop_front() else { break };
                out.push(completion);
            }
            // The waker is not left here: a completion queued by the poller's own work before
            // its next poll (a READ or SEND completed at posting) would wake it for nothing. A
            // poller done with its work arms the queue instead (`leave_waker_if_empty`).
            return Poll::Ready(Ok(()));
        }
        if let Some(death) = &self.dead {
            return Poll::Ready(Err(death.to_error()));
        }
        self.leave_waker(cx.waker());
        Poll::Pending
    }

    /// If no completion is queued (and the endpoint is alive), leaves `waker` as a poll that
    /// found nothing would, and returns `true`: the next completion wakes it. Otherwise `false`
    /// (poll: there is something to take).
    pub(super) fn leave_waker_if_empty(&mut self, waker: &Waker) -> bool {
        if !self.cq.is_empty() || self.dead.is_some() {
            return false;
        }
        self.leave_waker(waker);
        true
    }

    fn leave_waker(&mut self, waker: &Waker) {
        match &mut self.waker {
            Some(w) if w.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
    }
}

//! Routing work completions to their operations, and failing a connection.
//!
//! # What the caller sees when a connection fails
//!
//! Any error completion other than a flush, a DISCONNECTED rdma_cm event, a failed CQ poll or a
//! local [`crate::Connection::close`] fails the connection: the QP is moved to the error state so
//! that the NIC flushes every posted work request, queued (not yet posted) SENDs and READs are
//! flushed in software, posted receives are dropped, and once every operation came back
//! `poll_completions` returns `Err(Disconnected(reason))`. SENDs then complete with
//! `Err(Disconnected)`, READs with [`ReadError::Flushed`].
//!
//! A READ with a wrong or revoked key is an *error completion* on InfiniBand / RoCE (remote access
//! error), and the RC QP that got it is in the error state: that READ completes with
//! [`ReadError::InvalidKey`], and the connection fails as above. Verbs cannot tell a bad key from
//! an out-of-bounds range: both are reported as `InvalidKey`.
//!
//! On iWARP the peer's NIC answers such a READ with a TERMINATE message instead: the initiator
//! gets no error completion and no async event (only the *responder's* QP gets QP_REQ_ERR), just
//! a flush. There the READ completes with [`ReadError::Flushed`] and the connection fails; the
//! caller cannot tell a refused key from a peer that went away at that moment.

use rdma_mummy_sys::ibv_wc_status as st;
use sideway::ibverbs::queue_pair::{QueuePair, QueuePairAttribute, QueuePairState};

use super::conn::{Op, RdmaConnection};
use super::hello::Hello;
use super::slab::TAG_BIT;
use super::sys::WorkCompletion;
use crate::{Completion, ReadError, TransportError};

/// What a failed work completion means.
fn status_text(status: u32) -> &'static str {
    match status {
        st::IBV_WC_LOC_LEN_ERR => "local length error",
        st::IBV_WC_LOC_QP_OP_ERR => "local QP operation error",
        st::IBV_WC_LOC_PROT_ERR => "local protection error",
        st::IBV_WC_WR_FLUSH_ERR => "flushed",
        st::IBV_WC_BAD_RESP_ERR => "bad response",
        st::IBV_WC_LOC_ACCESS_ERR => "local access error",
        st::IBV_WC_REM_INV_REQ_ERR => "remote invalid request",
        st::IBV_WC_REM_ACCESS_ERR => "remote access error (wrong or revoked key, or out of bounds)",
        st::IBV_WC_REM_OP_ERR => "remote operation error",
        st::IBV_WC_RETRY_EXC_ERR => "transport retries exhausted (peer not responding)",
        st::IBV_WC_RNR_RETRY_EXC_ERR => "RNR retries exhausted (no receive posted at the peer)",
        st::IBV_WC_REM_ABORT_ERR => "remote abort",
        st::IBV_WC_FATAL_ERR => "fatal error",
        st::IBV_WC_RESP_TIMEOUT_ERR => "response timeout",
        st::IBV_WC_GENERAL_ERR => "general error",
        _ => "unknown error",
    }
}

impl RdmaConnection {
    /// Handles one work completion.
    pub(super) fn on_completion(&mut self, wc: &WorkCompletion) {
        if wc.wr_id & TAG_BIT != 0 {
            // An unsignaled SEND: only its failure (or flush) produces a completion. Its success
            // was reported when it was posted; the connection fails now.
            self.retire(wc.wr_id & !TAG_BIT);
            if wc.status != st::IBV_WC_SUCCESS {
                self.on_error_status(wc);
            }
            return self.pump();
        }
        let Some(op) = self.ops.remove(wc.wr_id) else {
            tracing::debug!(wr_id = wc.wr_id, status = wc.status, "completion for an unknown work request");
            return;
        };
        let ok = wc.status == st::IBV_WC_SUCCESS;
        if !ok {
            self.on_error_status(wc);
        }
        self.signaled_done(&op);
        match op {
            Op::Recv { buf, hello } => self.complete_recv(buf, hello, ok.then_some(wc.byte_len as usize)),
            Op::Send { wr_id, buf, seq } => {
                self.retire(seq);
                self.release_send_buf(buf);
                if let Some(wr_id) = wr_id {
                    let result = if ok { Ok(()) } else { Err(self.send_error(wc.status)) };
                    self.ready.push_back(Completion::Send { wr_id, result });
                }
                self.pump();
            }
            Op::ReadChunk { read, seq } => {
                self.retire(seq);
                self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
                let err = (!ok).then(|| self.read_error(wc.status, read));
                self.chunk_done(read, err);
                self.pump();
            }
        }
    }

    /// The send-queue request `seq` completed, and so did every one posted before it
    /// (completions come in queue order): their slots are free.
    fn retire(&mut self, seq: u64) {
        self.sq_retired = self.sq_retired.max(seq.min(self.sq_posted));
    }

    /// Logs and accounts a failed completion, and fails the connection (the QP is in error).
    fn on_error_status(&mut self, wc: &WorkCompletion) {
        if wc.status == st::IBV_WC_RNR_RETRY_EXC_ERR {
            self.counters.recv_unexpected += 1;
        }
        if wc.status != st::IBV_WC_WR_FLUSH_ERR {
            tracing::debug!(
                status = wc.status,
                vendor_err = wc.vendor_err,
                "work completion failed: {}",
                status_text(wc.status)
            );
        }
        self.fail(format!("work request failed: {}", status_text(wc.status)));
    }

    fn send_error(&self, status: u32) -> TransportError {
        if status == st::IBV_WC_WR_FLUSH_ERR {
            TransportError::Disconnected(self.failed.clone().unwrap_or_else(|| "flushed".into()).into())
        } else {
            TransportError::Verbs { call: "ibv_post_send (completion)", detail: status_text(status).into() }
        }
    }

    fn read_error(&self, status: u32, read: u64) -> ReadError {
        match status {
            st::IBV_WC_WR_FLUSH_ERR => ReadError::Flushed,
            st::IBV_WC_REM_ACCESS_ERR => ReadError::InvalidKey(self.reads.get(read).map_or(0, |r| r.rkey)),
            other => ReadError::Failed(status_text(other).into()),
        }
    }

    /// One chunk of a READ finished (or was flushed before posting); completes the READ after
    /// its last chunk.
    pub(super) fn chunk_done(&mut self, read: u64, err: Option<ReadError>) {
        let Some(op) = self.reads.get_mut(read) else { return };
        op.chunks_left = op.chunks_left.saturating_sub(1);
        if op.error.is_none() {
            op.error = err;
        }
        if op.chunks_left > 0 {
            return;
        }
        let Some(op) = self.reads.remove(read) else { return };
        let dst = match op.dest.map(|d| d.into_buf()) {
            Some((dst, deregistered)) => {
                self.counters.mr_deregistrations += u64::from(deregistered);
                dst
            }
            None => crate::Buf::zeroed(0),
        };
        let result = match op.error {
            Some(e) => Err(e),
            None => {
                self.counters.bytes_read += dst.len() as u64;
                Ok(dst)
            }
        };
        self.ready.push_back(Completion::Read { wr_id: op.wr_id, result });
    }

    fn complete_recv(&mut self, mut buf: crate::RecvBuffer, hello: bool, len: Option<usize>) {
        self.recv_done();
        let Some(len) = len else {
            // Flushed (or failed) receive: the buffer goes back to the pool, like any posted
            // receive of a dead connection.
            return;
        };
        // The receive was posted with `recv_size` (or the hello's) bytes: the NIC wrote no more
        // (a longer message fails the receive with a local length error). A caller's buffer may
        // take less.
        if !hello && len > buf.capacity() {
            let msg = format!(
                "message of {len} bytes does not fit the posted receive buffer of {} bytes",
                buf.capacity()
            );
            if self.failed.is_none() {
                self.malformed = true;
            }
            return self.fail(msg);
        }
        buf.set_len(len);
        if hello {
            let hello = Hello::decode(buf.bytes());
            if let Err(e) = &hello {
                self.fail(e.to_string());
            }
            self.peer_hello = Some(hello);
            return;
        }
        self.counters.recvs += 1;
        // A message that arrived intact is delivered even if the connection failed since, unless
        // the failure was already reported. The buffer is handed out as it is: no copy.
        if !self.error_reported {
            self.ready.push_back(Completion::Recv { buf });
        }
    }

    /// Fails the connection (first reason wins): moves the QP to the error state so that the NIC
    /// flushes every posted work request, and flushes the software backlogs.
    pub(super) fn fail(&mut self, reason: String) {
        if self.failed.is_some() {
            return;
        }
        tracing::debug!(peer = %self.info.peer, reason, "rdma connection failed");
        self.failed = Some(reason.clone());
        // Memory kept for reuse is released now; buffers in use (posted receives, READs and
        // SENDs being flushed, buffers callers hold) when they are dropped.
        self.pool.close();
        // Tell the peer (DREQ on IB/RoCE, TCP close on iWARP): its side fails too, never hangs.
        self.disconnect_cm();
        self.recv_backlog.clear();
        // Requests built and not posted yet: they complete with errors now.
        for b in std::mem::take(&mut self.sq_batch) {
            self.unpost(b, &reason);
        }
        for wr in std::mem::take(&mut self.rq_batch) {
            self.ops.remove(wr.wr_id);
            self.rq_posted = self.rq_posted.saturating_sub(1);
        }
        for (wr_id, _) in std::mem::take(&mut self.send_backlog) {
            let result = Err(TransportError::Disconnected(reason.as_str().into()));
            self.ready.push_back(Completion::Send { wr_id, result });
        }
        for chunk in std::mem::take(&mut self.read_backlog) {
            self.chunk_done(chunk.read, Some(ReadError::Flushed));
        }
        let moved = match self.qp.as_mut() {
            Some(qp) => {
                let mut attr = QueuePairAttribute::new();
                attr.setup_state(QueuePairState::Error);
                qp.modify(&attr).map_err(|e| e.to_string())
            }
            None => Err("no queue pair".into()),
        };
        if let Err(e) = moved {
            tracing::debug!(error = %e, "cannot move the QP to the error state; destroying it");
            self.abandon_qp();
        }
    }

    /// Destroys the QP (so the NIC no longer touches our buffers) and flushes every posted
    /// operation in software: for when the NIC cannot be trusted to flush them.
    pub(super) fn abandon_qp(&mut self) {
        self.qp = None;
        for op in self.ops.drain() {
            match op {
                Op::Recv { .. } => {}
                Op::Send { wr_id, buf, .. } => {
                    self.release_send_buf(buf);
                    if let Some(wr_id) = wr_id {
                        let reason = self.failed.clone().unwrap_or_default();
                        self.ready.push_back(Completion::Send {
                            wr_id,
                            result: Err(TransportError::Disconnected(reason.into())),
                        });
                    }
                }
                Op::ReadChunk { read, .. } => self.chunk_done(read, Some(ReadError::Flushed)),
            }
        }
        // Every caller failed the connection first, which completed what was batched.
        debug_assert!(self.sq_batch.is_empty() && self.rq_batch.is_empty());
        self.sq_retired = self.sq_posted;
        self.sq_signaled = 0;
        self.signaled_sends = 0;
        self.reads_in_flight = 0;
        self.rq_posted = 0;
    }
}

//! What both roles share: credits, the queue of frames waiting for a credit, finished-READ
//! reports, and the operations to post.
//!
//! Credit rules (why a SEND never meets an empty receive queue, and why this cannot deadlock):
//! * the peer posted `recv_depth` receives before the connection existed: our initial credits;
//! * every frame we send uses one credit; every frame we receive is re-posted by the driver
//!   before it next polls us, and the frames we send report how many were re-posted;
//! * a data frame (request, response, cancel) needs two credits: the last one is kept for a
//!   credit-only frame, which is sent when at least `recv_depth / 2` re-posts are unreported.
//!   Whoever receives the last frame in flight therefore always gets credits back.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use rpc_transport::{RKey, RegionDesc, WrId};

use super::config::PeerLimits;
use super::error::ProtoError;
use super::header::{Header, Kind, HEADER_LEN};
use super::stats::ProtoStats;

/// An operation the driver must post on the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// SEND this frame. A failed send completion is fatal for the connection.
    Send {
        /// Id for the completion.
        wr_id: WrId,
        /// Header and body.
        frame: Bytes,
    },
    /// Register `data` for remote READ and report with `handle_registered(call_id, ..)`.
    Register {
        /// The call the region belongs to.
        call_id: u64,
        /// The payload.
        data: Bytes,
    },
    /// Revoke the key (deregister the region).
    Deregister {
        /// The key to revoke.
        rkey: RKey,
    },
    /// READ the peer's region into a fresh buffer of `remote.len` bytes; report with
    /// `handle_read_complete(wr_id, ..)`.
    Read {
        /// Id for the completion (the call id).
        wr_id: WrId,
        /// The advertised region.
        remote: RegionDesc,
    },
}

struct Outgoing {
    header: Header,
    body: Bytes,
}

pub(crate) struct Link {
    peer_credits: u32,
    peer_recv_depth: u32,
    credits_to_return: u32,
    credit_threshold: u32,
    tx: VecDeque<Outgoing>,
    /// How many frames at the front of `tx` were already counted as stalled.
    stalled_counted: usize,
    pending_dones: VecDeque<u64>,
    ops: VecDeque<Op>,
    next_send_wr: WrId,
    sends_in_flight: u64,
    /// Largest payload sent inline to this peer.
    pub eager_limit: usize,
    /// Largest payload we accept from the peer.
    pub max_message_size: u64,
    pub stats: ProtoStats,
}

impl Link {
    pub fn new(
        own_recv_depth: u32,
        own_eager_threshold: usize,
        own_max_message: u64,
        peer: &PeerLimits,
    ) -> Link {
        let peer_frame_room = (peer.recv_size as usize).saturating_sub(HEADER_LEN);
        Link {
            peer_credits: peer.recv_depth,
            peer_recv_depth: peer.recv_depth,
            credits_to_return: 0,
            credit_threshold: (own_recv_depth / 2).max(1),
            tx: VecDeque::new(),
            stalled_counted: 0,
            pending_dones: VecDeque::new(),
            ops: VecDeque::new(),
            next_send_wr: 1,
            sends_in_flight: 0,
            eager_limit: own_eager_threshold.min(peer_frame_room),
            max_message_size: own_max_message,
            stats: ProtoStats::default(),
        }
    }

    /// Accounts for a received frame: its receive buffer is re-posted by the driver, and the
    /// credits it carries are ours again.
    pub fn on_frame_received(&mut self, header: &Header) -> Result<(), ProtoError> {
        self.stats.frames_received += 1;
        self.credits_to_return += 1;
        self.peer_credits += u32::from(header.credits);
        if self.peer_credits > self.peer_recv_depth {
            return Err(ProtoError::CreditOverflow);
        }
        Ok(())
    }

    /// Queues a frame; it goes out as soon as credits allow.
    pub fn queue(&mut self, header: Header, body: Bytes) {
        self.tx.push_back(Outgoing { header, body });
    }

    /// Reports, on the next frame out, that we finished READing the peer's region for `call_id`.
    pub fn report_done(&mut self, call_id: u64) {
        self.pending_dones.push_back(call_id);
    }

    pub fn push_op(&mut self, op: Op) {
        self.ops.push_back(op);
    }

    pub fn poll_op(&mut self) -> Option<Op> {
        self.flush();
        self.ops.pop_front()
    }

    /// Frames waiting for credits, or SENDs posted whose completion has not come back.
    pub fn has_unsent_frames(&self) -> bool {
        !self.tx.is_empty() || self.sends_in_flight > 0
    }

    /// A SEND completed. A failed SEND is fatal for the connection.
    pub fn on_send_complete(&mut self, result: Result<(), String>) -> Result<(), ProtoError> {
        self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
        result.map_err(ProtoError::SendFailed)
    }

    /// Moves frames whose credits are available into SEND operations.
    fn flush(&mut self) {
        loop {
            if !self.tx.is_empty() && self.peer_credits > 1 {
                let Some(out) = self.tx.pop_front() else { break };
                self.stalled_counted = self.stalled_counted.saturating_sub(1);
                self.send(out.header, &out.body);
                continue;
            }
            // Whatever is still queued waits for credits: count each frame once.
            self.stats.credit_stalls += (self.tx.len() - self.stalled_counted) as u64;
            self.stalled_counted = self.tx.len();
            let must_return = self.credits_to_return >= self.credit_threshold && self.peer_credits >= 1;
            let may_report = !self.pending_dones.is_empty() && self.peer_credits > 1;
            if must_return || may_report {
                self.stats.credit_frames += 1;
                self.send(Header::new(Kind::Credit), &[]);
                continue;
            }
            break;
        }
    }

    fn send(&mut self, mut header: Header, body: &[u8]) {
        let credits = self.credits_to_return.min(u32::from(u16::MAX));
        self.credits_to_return -= credits;
        header.credits = credits as u16;
        header.done = self.pending_dones.pop_front().unwrap_or(0);
        header.body_len = body.len() as u32;
        let mut frame = BytesMut::with_capacity(HEADER_LEN + body.len());
        let mut h = [0u8; HEADER_LEN];
        header.encode(&mut h);
        frame.put_slice(&h);
        frame.put_slice(body);
        self.peer_credits -= 1;
        self.sends_in_flight += 1;
        self.stats.frames_sent += 1;
        let wr_id = self.next_send_wr;
        self.next_send_wr += 1;
        self.ops.push_back(Op::Send { wr_id, frame: frame.freeze() });
    }

    /// Credits we may still use (for tests and stats).
    pub fn peer_credits(&self) -> u32 {
        self.peer_credits
    }
}

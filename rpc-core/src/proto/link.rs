//! What both roles share: credits, the queue of frames waiting for a credit, finished-READ
//! reports, keepalive, rendezvous bookkeeping, and the operations to post.
//!
//! Credit rules (why a SEND never meets an empty receive queue, and why this cannot deadlock):
//! * the peer posted `recv_depth` receives before the connection existed, and one spare
//!   ([`super::SPARE_RECEIVES`]): its `recv_depth` are our initial credits;
//! * every frame we send uses one credit; every frame we receive is re-posted by the driver
//!   before it next polls us, except at most one, re-posted just after the frames of that poll
//!   are posted (the spare stands in for it meanwhile); the frames we send report how many were
//!   re-posted;
//! * a data frame (request, response, cancel, ping, pong) needs two credits: the last one is
//!   kept for a credit-only frame, which is sent when at least `recv_depth / 2` re-posts are
//!   unreported. Whoever receives the last frame in flight therefore always gets credits back;
//! * except that a queued frame may take the last credit when it returns credits itself (at
//!   least one, and we are not withholding): its receiver gets credits back from it as from a
//!   credit frame. So that a batch that runs down to the last credit has one to return there,
//!   the frames before it in the batch leave one re-post unreported for it. A peer that sends
//!   `recv_depth` requests at once then sends them all in one batch, not all but one and the
//!   last a round later (a call at exactly the receive depth in flight would otherwise take
//!   two round trips, one call in `recv_depth` at a time).
//!
//! Why this cannot deadlock: a frame that takes a side's last credit (a credit frame, or a
//! data frame under the exception) carries at least one credit. Were both sides at zero credits
//! with nothing in flight, the later sent of their two last frames arrived after the other side
//! had sent its own last frame, and so left that side a credit: a contradiction. And a side at one
//! credit or none with frames waiting has given the peer at least `recv_depth - 1` frames not
//! yet reported, so the peer's threshold makes it return them as soon as it holds a credit.
//!
//! Enforcement: we count the receives we granted the peer (our `recv_depth`, plus every re-post
//! we reported). A frame that arrives when the peer has none left is a protocol violation
//! ([`ProtoError::CreditViolation`]): the connection is closed, so a peer cannot make us buffer
//! beyond the credits we granted.
//!
//! Backpressure: a server whose queue of frames waiting for credits reaches `max_queued_frames`
//! stops reporting re-posts to its client (it withholds credits) until the queue drains, so a
//! client that sends requests but never returns credits is held to a bounded number of frames.
//! Withholding never leaves the client without a receive: when it has none left, it gets exactly
//! one, enough for a credit frame (which returns ours) but not for a request. Only the server
//! withholds and a client always returns credits, so the two ends can never both wait.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use rpc_transport::{Buf, MemPool, RegionDesc, SendBuf, WrId};

use crate::arena::{self, Arena};

use super::budget::Budget;
use super::config::{PeerLimits, ProtoConfig};
use super::deadlines::earliest;
use super::error::ProtoError;
use super::header::{Header, Kind, HEADER_LEN};
use super::liveness::Liveness;
use super::rendezvous::Rendezvous;
use super::stats::ProtoStats;

// A frame's header fits the head of a `SendBuf::Headed`.
const _: () = assert!(HEADER_LEN <= rpc_transport::MAX_HEAD);

/// An operation the driver must post on the transport.
#[derive(Debug, PartialEq, Eq)]
pub enum Op {
    /// SEND this frame. A failed send completion is fatal for the connection.
    Send {
        /// Id for the completion.
        wr_id: WrId,
        /// Header and body: normally the pool buffer they were written into, posted as it is.
        frame: SendBuf,
    },
    /// Register `data` for remote READ and report with `handle_registered(call_id, ..)`.
    Register {
        /// The call the region belongs to.
        call_id: u64,
        /// The payload.
        data: Bytes,
    },
    /// Revoke the region (deregister it: the transport lets go of its bytes).
    Deregister {
        /// The region, as registration described it.
        region: RegionDesc,
    },
    /// READ the peer's region into a fresh buffer of `remote.len` bytes; report with
    /// `handle_read_complete(wr_id, ..)`. The buffer is allocated only now: READs wait for the
    /// rendezvous budget and the connection's READ depth before they are asked for.
    Read {
        /// Id for the completion.
        wr_id: WrId,
        /// The advertised region.
        remote: RegionDesc,
    },
}

/// What [`Link::fingerprint`] compares.
#[cfg(any(test, debug_assertions))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    peer_credits: u32,
    credits_to_return: u32,
    granted: u32,
    tx: usize,
    stalled_counted: usize,
    pending_dones: usize,
    ops: usize,
    next_send_wr: WrId,
    sends_in_flight: u64,
    ping_due: bool,
    pong_due: bool,
    stats: ProtoStats,
    /// READs queued and in flight, the next READ's id, whether the budget blocked on the
    /// endpoint's.
    rdv: (usize, usize, WrId, bool),
}

/// One step of [`Link::flush`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlushStep {
    /// SEND the frame at the front of the queue.
    Queued,
    /// Count the frames newly found waiting for credits.
    CountStalls,
    /// SEND the pong the peer's ping asked for.
    Pong,
    /// SEND a ping (keepalive).
    Ping,
    /// SEND a credit frame: credits to return, or a done report to carry.
    Credit,
}

struct Outgoing {
    header: Header,
    body: Body,
}

/// A frame's body: bytes to copy behind the header, or a buffer that already holds the body
/// behind [`HEADER_LEN`] bytes of room, where the header is written (the frame is the buffer
/// itself: no copy, no second buffer).
#[derive(Debug)]
pub(crate) enum Body {
    Bytes(Bytes),
    Framed(Buf),
}

/// Where [`Link::flush`] puts the SENDs it makes: the queue of operations ([`Link::poll_op`]),
/// or straight into the driver's batch ([`Link::poll_op_into`]). A type parameter, so that the
/// driver's path is compiled on its own (and inlined whole).
trait Sink {
    fn put(&mut self, ops: &mut VecDeque<Op>, wr_id: WrId, frame: SendBuf);
}

/// [`Sink`]: the queue of operations.
struct ToOps;

impl Sink for ToOps {
    #[inline]
    fn put(&mut self, ops: &mut VecDeque<Op>, wr_id: WrId, frame: SendBuf) {
        ops.push_back(Op::Send { wr_id, frame });
    }
}

impl Sink for Vec<(WrId, SendBuf)> {
    #[inline]
    fn put(&mut self, _ops: &mut VecDeque<Op>, wr_id: WrId, frame: SendBuf) {
        self.push((wr_id, frame));
    }
}

/// Which end of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

pub(crate) struct Link {
    peer_credits: u32,
    peer_recv_depth: u32,
    credits_to_return: u32,
    credit_threshold: u32,
    /// Receives the peer may still use: our `recv_depth` minus frames received plus re-posts
    /// reported. A frame arriving at zero is a violation.
    granted: u32,
    tx: VecDeque<Outgoing>,
    /// How many frames at the front of `tx` were already counted as stalled.
    stalled_counted: usize,
    /// Withhold credits while `tx` holds this many frames (servers only; `usize::MAX` = never).
    backlog_limit: usize,
    pending_dones: VecDeque<u64>,
    ops: VecDeque<Op>,
    next_send_wr: WrId,
    sends_in_flight: u64,
    /// Most SENDs posted and not yet completed (`max_queued_frames`).
    send_window: u64,
    /// The latest time an input carried; deadlines of READs issued on inputs without a time
    /// count from it.
    pub now: Instant,
    /// Largest payload sent inline to this peer.
    pub eager_limit: usize,
    /// Largest payload we accept from the peer.
    pub max_message_size: u64,
    /// Largest single READ the connection can issue.
    pub max_read_size: u64,
    pub live: Liveness,
    pub rdv: Rendezvous,
    /// Where frames with a body are assembled (the connection's registered memory), if given.
    pub pool: Option<MemPool>,
    /// Where small frames are assembled when there is no pool, and received frames copied by
    /// [`Link::copy_received`], when they are small.
    pub arena: Arena,
    /// Frames of at most this many bytes are copied by the transport as they are posted
    /// (`ConnInfo::copied_sends`): they go as their header and body side by side
    /// (`SendBuf::Headed`), assembled by nobody. 0 until told.
    pub copied_frames: usize,
    pub stats: ProtoStats,
}

impl Link {
    pub fn new(role: Role, config: &ProtoConfig, peer: &PeerLimits, now: Instant) -> Link {
        let peer_frame_room = (peer.recv_size as usize).saturating_sub(HEADER_LEN);
        let backlog_limit = match role {
            Role::Server => config.max_queued_frames.max(1) as usize,
            Role::Client => usize::MAX,
        };
        Link {
            peer_credits: peer.recv_depth,
            peer_recv_depth: peer.recv_depth,
            credits_to_return: 0,
            credit_threshold: (config.recv_depth / 2).max(1),
            granted: config.recv_depth,
            tx: VecDeque::new(),
            stalled_counted: 0,
            backlog_limit,
            pending_dones: VecDeque::new(),
            ops: VecDeque::new(),
            next_send_wr: 1,
            sends_in_flight: 0,
            send_window: u64::from(config.max_queued_frames.max(2)),
            now,
            eager_limit: config.eager_threshold.min(peer_frame_room),
            max_message_size: config.max_message_size,
            max_read_size: peer.max_read_size,
            live: Liveness::new(config.keepalive_interval, config.idle_timeout, now),
            rdv: Rendezvous::new(
                Budget::new(config.max_rendezvous_bytes),
                peer.max_reads_in_flight,
                config.read_timeout,
                config.done_timeout,
            ),
            stats: ProtoStats::default(),
            pool: None,
            arena: Arena::default(),
            copied_frames: 0,
        }
    }

    /// A received frame's header, decoded where the frame lies and accounted for
    /// ([`Link::on_frame_received`]); a done report in it revokes the region the peer finished
    /// READing ([`Link::on_done`]). What the frame is for is the caller's to handle.
    pub fn on_header(&mut self, frame: &[u8], now: Instant) -> Result<Header, ProtoError> {
        let header = Header::decode(frame)?;
        self.on_frame_received(&header, now)?;
        if header.done != 0 {
            self.on_done(header.done);
        }
        Ok(header)
    }

    /// Accounts for a received frame: it must have had a credit; its receive buffer is
    /// re-posted by the driver, and the credits it carries are ours again.
    pub fn on_frame_received(&mut self, header: &Header, now: Instant) -> Result<(), ProtoError> {
        if self.granted == 0 {
            self.stats.credit_violations += 1;
            return Err(ProtoError::CreditViolation);
        }
        self.granted -= 1;
        self.now = self.now.max(now);
        self.live.on_received(now);
        self.stats.frames_received += 1;
        self.credits_to_return += 1;
        self.peer_credits += u32::from(header.credits);
        if self.peer_credits > self.peer_recv_depth {
            return Err(ProtoError::CreditOverflow);
        }
        if header.kind == Kind::Ping {
            self.live.pong_due = true;
        }
        Ok(())
    }

    /// Queues a frame; it goes out as soon as credits allow.
    pub fn queue(&mut self, header: Header, body: Bytes) {
        self.queue_body(header, Body::Bytes(body));
    }

    /// A buffer holding `parts` behind [`HEADER_LEN`] bytes of room, for [`Body::Framed`]: from the
    /// pool if there is one.
    pub fn frame_buffer(&self, parts: &[&[u8]]) -> Buf {
        let len = HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
        let mut buf = match &self.pool {
            Some(pool) => pool.alloc_or_heap(len),
            None => Buf::zeroed(len),
        };
        let mut at = HEADER_LEN;
        for part in parts {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        buf
    }

    /// Queues a frame whose body already lies behind room for the header (see [`Body`]).
    pub fn queue_body(&mut self, header: Header, body: Body) {
        self.tx.push_back(Outgoing { header, body });
        self.stats.queued_frames_peak = self.stats.queued_frames_peak.max(self.tx.len() as u64);
    }

    /// A received frame, copied: into the arena if it is small, else a buffer of its own.
    pub fn copy_received(&mut self, frame: &[u8]) -> Bytes {
        match frame.len() <= arena::SMALL {
            true => self.arena.copy(&[frame]),
            false => Bytes::copy_from_slice(frame),
        }
    }

    /// Reports, on the next frame out, that we finished READing the peer's region for `call_id`.
    pub fn report_done(&mut self, call_id: u64) {
        self.pending_dones.push_back(call_id);
    }

    pub fn push_op(&mut self, op: Op) {
        self.ops.push_back(op);
    }

    /// Revokes the key of one of our regions.
    pub fn revoke(&mut self, region: RegionDesc) {
        self.stats.keys_revoked += 1;
        self.ops.push_back(Op::Deregister { region });
    }

    /// The connection is gone: revoke every region still advertised (the peer can no longer
    /// READ it).
    pub fn revoke_all(&mut self) {
        for region in self.rdv.drain_advertised() {
            self.revoke(region);
        }
    }

    /// Nothing in progress at this level: no frame unsent or unacknowledged, no region
    /// advertised or being registered, no READ queued or in flight.
    pub fn is_idle(&self) -> bool {
        !self.has_unsent_frames() && self.rdv.is_idle()
    }

    /// The peer finished READing our region for `call_id`: revoke it.
    pub fn on_done(&mut self, call_id: u64) {
        if let Some(region) = self.rdv.done(call_id) {
            self.revoke(region);
        }
    }

    /// The next operation to post. Most polls find nothing to do (the driver polls after every
    /// input, and once more to see that nothing is left): [`Link::has_work`] decides that from
    /// the state alone, by the very conditions [`Rendezvous::issue`] and [`Link::flush`] act on,
    /// and the poll returns at once.
    #[inline]
    pub fn poll_op(&mut self) -> Option<Op> {
        if !self.has_work() {
            #[cfg(debug_assertions)]
            self.assert_quiet();
            return None;
        }
        self.poll_op_slow()
    }

    /// Whether [`Link::poll_op`] has anything to do: an operation queued, a READ to issue (or a
    /// wait for the budget to count), or a step of [`Link::flush`]. When not, the full path
    /// ([`Link::poll_op_slow`]) would yield nothing and change nothing.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        !self.ops.is_empty() || self.rdv.can_issue() || self.flush_step().is_some()
    }

    /// Debug builds check every quick "nothing to do" of [`Link::poll_op`] against the full
    /// path: it must yield no operation and change nothing.
    #[cfg(debug_assertions)]
    fn assert_quiet(&mut self) {
        let before = self.fingerprint();
        let op = self.poll_op_slow();
        assert!(op.is_none(), "poll_op found nothing to do, but the full path yields {op:?}");
        assert_eq!(
            before,
            self.fingerprint(),
            "poll_op found nothing to do, but the full path changed state"
        );
    }

    /// Everything [`Rendezvous::issue`] and [`Link::flush`] can change, for comparisons.
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            peer_credits: self.peer_credits,
            credits_to_return: self.credits_to_return,
            granted: self.granted,
            tx: self.tx.len(),
            stalled_counted: self.stalled_counted,
            pending_dones: self.pending_dones.len(),
            ops: self.ops.len(),
            next_send_wr: self.next_send_wr,
            sends_in_flight: self.sends_in_flight,
            ping_due: self.live.ping_due,
            pong_due: self.live.pong_due,
            stats: self.stats(),
            rdv: self.rdv.fingerprint(),
        }
    }

    /// [`Link::poll_op`] without the quick look: issues READs and moves frames into SENDs
    /// whenever no operation is queued. The full path, with no shortcut: what the quick looks
    /// are checked against (`assert_quiet`, `tests::quiet_poll`).
    pub(crate) fn poll_op_slow(&mut self) -> Option<Op> {
        self.poll_slow(&mut ToOps, false)
    }

    /// The full path of both polls, for either sink: issues READs and moves frames into SENDs
    /// (into `sink`) whenever no operation is queued, then returns the oldest operation queued.
    /// `ask_first`: call `Rendezvous::issue` (not inlined) only when [`Rendezvous::can_issue`]
    /// says it has work, which most polls do not (exact: `tests::quiet_poll` checks it).
    #[inline(never)]
    fn poll_slow(&mut self, sink: &mut impl Sink, ask_first: bool) -> Option<Op> {
        if self.ops.is_empty() {
            if !ask_first || self.rdv.can_issue() {
                self.rdv.issue(self.now, &mut self.ops, &mut self.stats);
            }
            self.flush(sink);
        }
        self.ops.pop_front()
    }

    /// [`Link::poll_op`] for a driver that posts SENDs in batches: the SENDs go straight into
    /// `batch` (in the order `poll_op` would return them), and only the other operations are
    /// returned, one per call. Operations queued before the SENDs (a revocation, a READ) are
    /// returned first, as `poll_op` would: the frames are moved only once the queue is empty.
    #[inline]
    pub fn poll_op_into(&mut self, batch: &mut Vec<(WrId, SendBuf)>) -> Option<Op> {
        if !self.has_work() {
            #[cfg(debug_assertions)]
            self.assert_quiet();
            return None;
        }
        self.poll_slow(batch, true)
    }

    /// The earliest READ or done-report deadline added since the last look. Keepalive needs no
    /// such report: its next check only ever moves later, except in the check itself.
    #[inline]
    pub fn take_added_timeout(&mut self) -> Option<Instant> {
        self.rdv.take_added_timeout()
    }

    /// The next time keepalive, a READ or a done report must be checked.
    pub fn next_timeout(&mut self) -> Option<Instant> {
        earliest(self.live.next_timeout(), self.rdv.next_timeout())
    }

    /// Silence, an overdue READ or an overdue done report is fatal for the connection.
    pub fn check_timeouts(&mut self, now: Instant) -> Result<(), ProtoError> {
        self.now = self.now.max(now);
        self.live.check(now)?;
        self.rdv.check(now, &mut self.stats)
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

    fn backlogged(&self) -> bool {
        self.tx.len() >= self.backlog_limit
    }

    /// Whether the frame at the front of the queue may take our last credit: it returns at
    /// least one (see the module docs). Not while withholding: then a frame returns at most
    /// one credit, and only when the peer has none.
    #[inline]
    fn may_take_last_credit(&self) -> bool {
        self.peer_credits == 1 && self.credits_to_return >= 1 && !self.backlogged()
    }

    /// Whether the queued frame being sent (already taken off the queue) leaves one re-post
    /// unreported: the frames behind it run down to our last credit in this batch, and the
    /// one that takes it must return a credit to be allowed to.
    #[inline]
    fn keep_one_for_the_last(&self) -> bool {
        self.peer_credits >= 2
            && self.credits_to_return >= 1
            && self.tx.len() as u64 >= u64::from(self.peer_credits - 1)
    }

    /// What [`Link::flush`] does next, decided from the state alone; `None`: it stops there.
    /// [`Link::has_work`] asks it too, so the conditions are written down once.
    #[inline]
    fn flush_step(&self) -> Option<FlushStep> {
        // SENDs posted and not completed (a peer that does not drain its side of the
        // transport) are bounded too: nothing more is posted until some complete.
        if self.sends_in_flight >= self.send_window {
            return None;
        }
        if !self.tx.is_empty() && (self.peer_credits > 1 || self.may_take_last_credit()) {
            return Some(FlushStep::Queued);
        }
        // Whatever is still queued waits for credits: count each frame once (`stalled_counted`
        // never exceeds the queue's length).
        if self.stalled_counted < self.tx.len() {
            return Some(FlushStep::CountStalls);
        }
        // Pings and pongs are data frames: the last credit stays reserved for a credit
        // frame, which always carries credits back (a pong might carry none).
        if self.live.pong_due && self.peer_credits > 1 {
            return Some(FlushStep::Pong);
        }
        if self.live.ping_due && self.peer_credits > 1 {
            return Some(FlushStep::Ping);
        }
        let must_return = self.peer_credits >= 1
            && if self.backlogged() {
                // Withholding, but never below one receive: the peer must keep a credit to
                // return ours with, or both ends would wait for ever.
                self.granted == 0 && self.credits_to_return >= 1
            } else {
                self.credits_to_return >= self.credit_threshold
            };
        let may_report = !self.pending_dones.is_empty() && self.peer_credits > 1;
        if must_return || may_report {
            return Some(FlushStep::Credit);
        }
        None
    }

    /// Moves frames whose credits are available into SEND operations (see [`Link::flush_step`]).
    fn flush(&mut self, sink: &mut impl Sink) {
        while let Some(step) = self.flush_step() {
            match step {
                FlushStep::Queued => {
                    let Some(out) = self.tx.pop_front() else { break };
                    self.stalled_counted = self.stalled_counted.saturating_sub(1);
                    let keep = u32::from(self.keep_one_for_the_last());
                    match out.body {
                        Body::Bytes(body) => self.send_keeping(out.header, body, keep, sink),
                        Body::Framed(buf) => self.send_framed(out.header, buf, keep, sink),
                    }
                }
                FlushStep::CountStalls => {
                    self.stats.credit_stalls += (self.tx.len() - self.stalled_counted) as u64;
                    self.stalled_counted = self.tx.len();
                }
                FlushStep::Pong => {
                    self.live.pong_due = false;
                    self.send(Header::new(Kind::Pong), sink);
                }
                FlushStep::Ping => {
                    self.live.ping_due = false;
                    self.stats.pings_sent += 1;
                    self.send(Header::new(Kind::Ping), sink);
                }
                FlushStep::Credit => {
                    self.stats.credit_frames += 1;
                    self.send(Header::new(Kind::Credit), sink);
                }
            }
        }
    }

    /// Sends a frame without a body (a ping, a pong, a credit frame).
    fn send(&mut self, header: Header, sink: &mut impl Sink) {
        self.send_keeping(header, Bytes::new(), 0, sink);
    }

    /// Sends a frame, leaving `keep` re-posts unreported (see [`Link::seal`]).
    fn send_keeping(&mut self, header: Header, body: Bytes, keep: u32, sink: &mut impl Sink) {
        let h = self.seal(header, body.len(), keep);
        let len = HEADER_LEN + body.len();
        // A frame the transport copies anyway (inline on verbs, into the socket on tcp, into the
        // peer's receive on mem) goes as its header and its body side by side, copied by the
        // transport alone: nothing assembled here, nothing from registered memory. So does a
        // frame without a body.
        if len <= self.copied_frames || body.is_empty() {
            return self.push_send(SendBuf::headed(&h, body), sink);
        }
        let frame = match self.pool.as_ref().and_then(|p| p.alloc(len).ok()) {
            Some(mut buf) => {
                buf[..HEADER_LEN].copy_from_slice(&h);
                buf[HEADER_LEN..].copy_from_slice(&body);
                SendBuf::Owned(buf)
            }
            None if len <= arena::SMALL => self.arena.copy(&[&h, &body]).into(),
            None => {
                let mut frame = BytesMut::with_capacity(len);
                frame.put_slice(&h);
                frame.put_slice(&body);
                frame.freeze().into()
            }
        };
        self.push_send(frame, sink);
    }

    /// Sends a frame whose body lies in `buf` behind [`HEADER_LEN`] bytes of room.
    fn send_framed(&mut self, header: Header, mut buf: Buf, keep: u32, sink: &mut impl Sink) {
        let h = self.seal(header, buf.len().saturating_sub(HEADER_LEN), keep);
        buf[..HEADER_LEN].copy_from_slice(&h);
        self.push_send(SendBuf::Owned(buf), sink);
    }

    /// The header of the next frame out, with the credits it returns and a done report, encoded.
    /// It returns every re-post not yet reported but `keep` (at most that many, for a frame
    /// behind it in the same batch: [`Link::keep_one_for_the_last`]).
    fn seal(&mut self, mut header: Header, body_len: usize, keep: u32) -> [u8; HEADER_LEN] {
        let credits = if !self.backlogged() {
            self.credits_to_return.saturating_sub(keep).min(u32::from(u16::MAX))
        } else if self.granted == 0 {
            // Backlogged: the peer gets one receive, enough to return credits (a credit frame)
            // but not to send a request (a data frame needs two).
            self.credits_to_return.min(1)
        } else {
            0
        };
        self.credits_to_return -= credits;
        self.granted += credits;
        header.credits = credits as u16;
        header.done = self.pending_dones.pop_front().unwrap_or(0);
        header.body_len = body_len as u32;
        let mut h = [0u8; HEADER_LEN];
        header.encode(&mut h);
        h
    }

    #[inline]
    fn push_send(&mut self, frame: SendBuf, sink: &mut impl Sink) {
        self.peer_credits -= 1;
        self.sends_in_flight += 1;
        self.stats.frames_sent += 1;
        let wr_id = self.next_send_wr;
        self.next_send_wr += 1;
        sink.put(&mut self.ops, wr_id, frame);
    }

    /// The counters, with the budget's figures (derived, never stored twice).
    pub fn stats(&self) -> ProtoStats {
        let mut stats = self.stats;
        stats.rendezvous_bytes_held = self.rdv.budget.held();
        stats.rendezvous_bytes_peak = self.rdv.budget.peak();
        stats
    }

    /// Credits we may still use (for tests and stats).
    pub fn peer_credits(&self) -> u32 {
        self.peer_credits
    }
}

//! The server end of a connection: receives requests, sends responses.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rpc_transport::{Detail, MemPool, ReadError, Received, RegionDesc, SendBuf, WrId};

use super::budget::SharedBudget;
use super::config::{PeerLimits, ProtoConfig};
use super::deadlines::{earliest, DeadlineQueue};
use super::error::ProtoError;
use super::header::{Header, Kind, FLAG_ERROR, FLAG_METADATA, FLAG_RENDEZVOUS, HEADER_LEN};
use super::link::{Link, Op, Role};
use super::rendezvous::AbandonedRead;
use super::stats::ProtoStats;
use super::wire::{decode_desc, encode_desc, split_metadata, WireError, WireErrorCode};
use super::{MethodId, Path};

/// Why a handler must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The client cancelled the call.
    Cancelled,
    /// The call's deadline passed.
    DeadlineExceeded,
}

/// Something the application must act on.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// Run a handler, then call [`ServerProto::respond`].
    Request {
        /// Which call.
        call_id: u64,
        /// Which method.
        method: MethodId,
        /// The arguments' encoding, as it lies in its receive buffer or READ destination.
        payload: Received,
        /// The time the client allows, relative to when this event is delivered (for a
        /// rendezvous request, what is left after its payload was READ).
        timeout: Option<Duration>,
        /// How the payload travelled.
        path: Path,
        /// The metadata the client attached (opaque bytes; empty: none).
        metadata: Bytes,
    },
    /// Abort the handler of this call; its response would be dropped.
    Cancel {
        /// Which call.
        call_id: u64,
        /// Why.
        reason: CancelReason,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// READing the advertised request payload (queued for budget, or in flight).
    ReadingRequest,
    /// The handler runs (or waits for a handler slot).
    Running,
    /// Waiting for the response payload's registration.
    Registering,
}

#[derive(Debug)]
struct Call {
    method: MethodId,
    state: State,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    /// Budget reserved for the response when the handler started (see
    /// [`ServerProto::try_start_handler`]).
    reserved: u64,
    /// The request's metadata, kept while its payload is READ.
    metadata: Bytes,
}

/// The server end's state machine. See the [module docs](super) for the calling protocol.
///
/// A call leaves the table once its response is queued; an advertised response region stays
/// (counted in the budget, bounded by the done timeout) until the client reports it READ.
pub struct ServerProto {
    link: Link,
    /// Keyed by the client's call ids, so by a keyed hash: a peer cannot aim its ids at one
    /// bucket without the seed, which is random per process and per table (and the table holds
    /// at most `max_in_flight` calls). foldhash, a fraction of SipHash's cost per lookup.
    calls: HashMap<u64, Call, foldhash::fast::RandomState>,
    deadlines: DeadlineQueue,
    events: VecDeque<ServerEvent>,
    max_in_flight: u32,
    peer_max_message: u64,
    default_deadline: Option<Duration>,
    shutting_down: bool,
}

impl std::fmt::Debug for ServerProto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProto").field("calls", &self.calls.len()).finish_non_exhaustive()
    }
}

impl ServerProto {
    /// A server end with our config and what setup told us of the client, set up at `now`.
    pub fn new(config: &ProtoConfig, peer: &PeerLimits, now: Instant) -> ServerProto {
        ServerProto {
            link: Link::new(Role::Server, config, peer, now),
            calls: HashMap::default(),
            deadlines: DeadlineQueue::default(),
            events: VecDeque::new(),
            max_in_flight: config.max_in_flight,
            peer_max_message: peer.hello.max_message_size,
            default_deadline: None,
            shutting_down: false,
        }
    }

    /// Assembles frames in `pool` (the connection's registered memory), so that the transport
    /// sends them as they are. Without it, frames are plain heap buffers.
    pub fn with_pool(mut self, pool: MemPool) -> Self {
        self.link.pool = Some(pool);
        self
    }

    /// Frames of at most `len` bytes are copied by the transport as they are posted
    /// (`ConnInfo::copied_sends`): they are assembled in a small shared block rather than a
    /// pool buffer of their own.
    pub fn with_copied_sends(mut self, len: u32) -> Self {
        self.link.copied_frames = len as usize;
        self
    }

    /// Counts this connection's rendezvous bytes against `budget` too (shared by every
    /// connection of a server).
    pub fn with_shared_budget(mut self, budget: Arc<SharedBudget>) -> Self {
        self.link.rdv.budget.set_shared(budget);
        self
    }

    /// Applies `deadline` to requests that carry none (so that no call can hold a handler
    /// forever).
    pub fn with_default_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.default_deadline = deadline;
        self
    }

    /// Handles one received frame at time `now`. An error is fatal: close the connection.
    /// Copies a request's body (not the header; nothing of a frame without one);
    /// [`ServerProto::handle_recv_bytes`] copies nothing.
    pub fn handle_recv(&mut self, frame: &[u8], now: Instant) -> Result<(), ProtoError> {
        let header = self.link.on_header(frame, now)?;
        match header.kind {
            Kind::Request => {
                let body = self.link.copy_received(&frame[HEADER_LEN..]);
                self.on_request(&header, Received::from(body), now)
            }
            _ => self.on_bodiless(&header),
        }
    }

    /// Handles one received frame at time `now`; an eager request's payload is a slice of
    /// `frame` (no copy). An error is fatal: close the connection.
    pub fn handle_recv_bytes(&mut self, frame: impl Into<Received>, now: Instant) -> Result<(), ProtoError> {
        let frame = frame.into();
        let header = self.link.on_header(&frame, now)?;
        match header.kind {
            Kind::Request => self.on_request(&header, frame.slice(HEADER_LEN..), now),
            _ => self.on_bodiless(&header),
        }
    }

    /// A frame whose body (if any) says nothing more: all but a request.
    fn on_bodiless(&mut self, header: &Header) -> Result<(), ProtoError> {
        match header.kind {
            Kind::Cancel => {
                self.on_cancel(header.call_id, CancelReason::Cancelled);
                Ok(())
            }
            Kind::Credit | Kind::Ping | Kind::Pong => Ok(()),
            kind @ (Kind::Response | Kind::Request) => Err(ProtoError::UnexpectedKind(kind)),
        }
    }

    fn on_request(&mut self, header: &Header, body: Received, now: Instant) -> Result<(), ProtoError> {
        let call_id = header.call_id;
        let in_flight = self.calls.len();
        // One look at the table: the call goes in through the entry that found its id free.
        let Entry::Vacant(slot) = self.calls.entry(call_id) else {
            return Err(ProtoError::DuplicateCall(call_id));
        };
        if self.link.rdv.busy(call_id) {
            return Err(ProtoError::DuplicateCall(call_id));
        }
        let rendezvous = header.flags & FLAG_RENDEZVOUS != 0;
        let (metadata, body) = if header.flags & FLAG_METADATA != 0 {
            // Two parts with lives of their own: the frame is frozen (only with metadata).
            let body = body.into_bytes();
            let (metadata, rest) = split_metadata(&body)?;
            (body.slice_ref(metadata), Received::from(body.slice_ref(rest)))
        } else {
            (Bytes::new(), body)
        };
        let desc = if rendezvous { Some(decode_desc(&body)?) } else { None };
        if let Some(refusal) =
            refusal(self.shutting_down, in_flight, self.max_in_flight, &self.link, desc.as_ref())
        {
            if rendezvous {
                self.link.report_done(call_id); // we will not READ it: the client may revoke
            }
            self.queue_error(call_id, &refusal);
            return Ok(());
        }
        let timeout = match header.arg {
            0 => self.default_deadline,
            micros => Some(Duration::from_micros(micros)),
        };
        let deadline = timeout.and_then(|t| now.checked_add(t));
        let mut call = Call {
            method: header.method_id,
            state: State::Running,
            timeout,
            deadline,
            reserved: 0,
            metadata: Bytes::new(),
        };
        match desc {
            Some(remote) => {
                call.state = State::ReadingRequest;
                call.metadata = metadata;
                self.link.rdv.queue_read(call_id, remote);
            }
            None => {
                self.link.stats.eager_received += 1;
                self.events.push_back(ServerEvent::Request {
                    call_id,
                    method: call.method,
                    payload: body,
                    timeout,
                    path: Path::Eager,
                    metadata,
                });
            }
        }
        slot.insert(call);
        if let Some(at) = deadline {
            let calls = &self.calls;
            let live = |id, at| calls.get(&id).is_some_and(|c: &Call| c.deadline == Some(at));
            self.deadlines.defer(at, call_id, in_flight + 1, live);
        }
        Ok(())
    }

    /// Reports the outcome of an [`Op::Read`] of a request payload. The client is told the
    /// READ is done in any case, so it may revoke its region.
    pub fn handle_read_complete(&mut self, wr_id: WrId, result: Result<Bytes, ReadError>) {
        let Some(read) = self.link.rdv.read_complete(wr_id) else { return };
        let call_id = read.call_id;
        self.link.report_done(call_id);
        if read.abandoned {
            return; // cancelled or expired meanwhile
        }
        let Some(call) = self.calls.get_mut(&call_id).filter(|c| c.state == State::ReadingRequest) else {
            return;
        };
        match result {
            Ok(data) => {
                call.state = State::Running;
                self.link.stats.rendezvous_received += 1;
                self.link.stats.bytes_read += data.len() as u64;
                self.events.push_back(ServerEvent::Request {
                    call_id,
                    method: call.method,
                    payload: data.into(),
                    // What is left of it now that the payload is READ.
                    timeout: call
                        .deadline
                        .map(|d| d.saturating_duration_since(self.link.now))
                        .or(call.timeout),
                    path: Path::Rendezvous,
                    metadata: std::mem::take(&mut call.metadata),
                });
            }
            Err(e) => {
                self.calls.remove(&call_id);
                let err = WireError::new(WireErrorCode::ReadFailed, format!("reading the request: {e}"));
                self.queue_error(call_id, &err);
            }
        }
    }

    /// Whether the handler of `call_id` may start now, given `estimate`, the size its response
    /// is expected to have (`u64::MAX`: unknown). Its response is produced by the application
    /// before the protocol sees it, so the budget is taken at start: the estimate (the whole
    /// connection budget for an unknown one, so that it runs alone among the large ones) must
    /// fit this connection's budget, or the handler waits. A handler whose response is
    /// expected to be sent eagerly reserves nothing; it waits only while the bytes held that
    /// exist fill the budget (`Budget::has_room_for_small`), not for the reservations of
    /// responses still being built: a long-running handler of an unknown size does not stop
    /// the small calls of its connection. That keeps a client that never READs its responses
    /// from making the server produce more of them. The reservation is exchanged for the real
    /// size in [`ServerProto::respond`].
    pub fn try_start_handler(&mut self, call_id: u64, estimate: u64) -> bool {
        if estimate <= self.link.eager_limit as u64 {
            // Nothing to reserve, so nothing to note in the call's entry: no lookup (a call
            // that is gone answers nothing, whatever this says).
            if self.link.rdv.budget.has_room_for_small() {
                return true;
            }
            self.link.stats.budget_waits += 1;
            return false;
        }
        // One lookup (the table is keyed by the peer's ids: a hash that resists collisions).
        let Some(call) = self.calls.get_mut(&call_id) else { return true };
        if call.reserved != 0 {
            return true;
        }
        let budget = &mut self.link.rdv.budget;
        let want = match estimate {
            u64::MAX => budget.limit(),
            e => e,
        };
        if !budget.fits(want) {
            self.link.stats.budget_waits += 1;
            return false;
        }
        budget.reserve_estimate(want);
        call.reserved = want;
        true
    }

    /// The server-wide budget, when the last READ failed on it: register the driver's waker
    /// there, then poll again.
    pub fn blocked_on_shared_budget(&self) -> Option<Arc<SharedBudget>> {
        self.link.rdv.budget.blocked_on().cloned()
    }

    /// Answers a call whose handler finished. Answers to calls that were cancelled or expired
    /// meanwhile are dropped (returns `false`).
    pub fn respond(&mut self, call_id: u64, result: Result<Bytes, WireError>) -> bool {
        // One lookup: the entry is removed or updated below without hashing again.
        let Entry::Occupied(mut call) = self.calls.entry(call_id) else { return false };
        if call.get().state != State::Running {
            return false;
        }
        let reserved = std::mem::take(&mut call.get_mut().reserved);
        self.link.rdv.budget.release_estimate(reserved);
        let payload = match result {
            Ok(p) if p.len() as u64 > self.peer_max_message => Err(WireError::new(
                WireErrorCode::PayloadTooLarge,
                format!(
                    "response of {} bytes exceeds the client's limit of {}",
                    p.len(),
                    self.peer_max_message
                ),
            )),
            other => other,
        };
        match payload {
            // The call's deadline entry goes with it (it is in the queue when a handler in a
            // task of its own answers in a later round than its request came in).
            Err(e) => {
                self.deadlines.forget(call.remove().deadline, call_id);
                self.queue_error(call_id, &e);
            }
            Ok(p) if p.len() <= self.link.eager_limit => {
                self.deadlines.forget(call.remove().deadline, call_id);
                self.link.stats.eager_sent += 1;
                self.link.stats.calls_completed += 1;
                self.queue_response(call_id, 0, p);
            }
            Ok(p) => {
                call.get_mut().state = State::Registering;
                self.link.rdv.reserve_own(call_id, p.len() as u64);
                self.link.push_op(Op::Register { call_id, data: p });
            }
        }
        true
    }

    /// Reports the outcome of an [`Op::Register`] of a response payload.
    pub fn handle_registered(&mut self, call_id: u64, result: Result<RegionDesc, Detail>) {
        let registering = self.calls.get(&call_id).is_some_and(|c| c.state == State::Registering);
        self.link.rdv.registered(call_id, registering && result.is_ok());
        if result.is_ok() {
            self.link.stats.regions_registered += 1;
        }
        if !registering {
            // Cancelled or expired while registering: the client never saw it; revoke at once.
            if let Ok(desc) = result {
                self.link.revoke(desc);
            }
            return;
        }
        self.calls.remove(&call_id);
        match result {
            Ok(desc) => {
                self.link.stats.rendezvous_sent += 1;
                self.link.stats.calls_completed += 1;
                let now = self.link.now;
                self.link.rdv.advertise(call_id, &desc, now);
                self.queue_response(call_id, FLAG_RENDEZVOUS, Bytes::copy_from_slice(&encode_desc(&desc)));
            }
            Err(e) => {
                let err = WireError::new(WireErrorCode::Handler, format!("registering the response: {e}"));
                self.queue_error(call_id, &err);
            }
        }
    }

    /// Reports a SEND completion. A failed SEND is fatal for the connection.
    pub fn handle_send_complete(
        &mut self,
        _wr_id: WrId,
        result: Result<(), String>,
    ) -> Result<(), ProtoError> {
        self.link.on_send_complete(result)
    }

    /// Abandons a call (the client cancelled it, or its deadline passed). A READ of its request
    /// already in flight stays until its completion (then done is reported); one not yet issued
    /// is dropped and done is reported at once. A response region already advertised is not
    /// revoked: the client may be READing it; it goes with the client's done report.
    fn on_cancel(&mut self, call_id: u64, reason: CancelReason) {
        let Some(call) = self.calls.remove(&call_id) else { return };
        self.deadlines.forget(call.deadline, call_id);
        self.link.rdv.budget.release_estimate(call.reserved);
        match reason {
            CancelReason::Cancelled => self.link.stats.cancels += 1,
            CancelReason::DeadlineExceeded => self.link.stats.deadlines_expired += 1,
        }
        if call.state == State::ReadingRequest
            && self.link.rdv.abandon_read(call_id) == AbandonedRead::WasQueued
        {
            self.link.report_done(call_id);
        }
        if matches!(call.state, State::ReadingRequest | State::Running) {
            self.events.push_back(ServerEvent::Cancel { call_id, reason });
        }
    }

    /// Expires the calls whose deadline has passed (their handlers are cancelled and no
    /// response is sent: the client's deadline has passed too), and checks keepalive and the
    /// READ and done timeouts. An error is fatal: close the connection.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ProtoError> {
        self.settle_deadlines();
        for (call_id, at) in self.deadlines.expired(now) {
            if self.calls.get(&call_id).is_some_and(|c| c.deadline == Some(at)) {
                self.on_cancel(call_id, CancelReason::DeadlineExceeded);
            }
        }
        self.link.check_timeouts(now)
    }

    /// The earliest timeout added since the last look (a call's deadline, a READ's or a done
    /// report's), if any was. Nothing else makes [`ServerProto::poll_timeout`] earlier, except
    /// [`ServerProto::handle_timeout`] itself: a driver whose timer is armed no later than this (and
    /// has not fired) need not ask for it again.
    #[inline]
    pub fn take_added_timeout(&mut self) -> Option<Instant> {
        self.settle_deadlines();
        earliest(self.deadlines.take_added(), self.link.take_added_timeout())
    }

    /// When [`ServerProto::handle_timeout`] must next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.settle_deadlines();
        let calls = &self.calls;
        let call = self.deadlines.next(|id, at| calls.get(&id).is_some_and(|c| c.deadline == Some(at)));
        earliest(call, self.link.next_timeout())
    }

    /// Adds the deadlines of calls started since the last look that are still in progress (see
    /// `DeadlineQueue::defer`).
    #[inline]
    fn settle_deadlines(&mut self) {
        let calls = &self.calls;
        self.deadlines.settle(calls.len(), |id, at| calls.get(&id).is_some_and(|c| c.deadline == Some(at)));
    }

    /// Stops taking new calls (they are answered `ShuttingDown`); calls in progress go on.
    pub fn begin_shutdown(&mut self) {
        self.shutting_down = true;
    }

    /// No call in progress, no region awaiting the client's READ, nothing waiting to be sent,
    /// no SEND awaiting its completion: the connection can be closed without losing anything.
    pub fn is_idle(&self) -> bool {
        self.calls.is_empty() && self.link.is_idle()
    }

    /// The connection is dead: forget every call (the runtime aborts their handlers), and
    /// revoke every region still advertised (poll the operations once more).
    pub fn fail_all(&mut self) {
        self.calls.clear();
        self.link.revoke_all();
    }

    fn queue_response(&mut self, call_id: u64, flags: u16, body: Bytes) {
        let mut h = Header::new(Kind::Response);
        h.call_id = call_id;
        h.flags = flags;
        self.link.queue(h, body);
    }

    fn queue_error(&mut self, call_id: u64, err: &WireError) {
        self.queue_response(call_id, FLAG_ERROR, Bytes::from(err.encode()));
    }

    /// The next operation to post.
    pub fn poll_op(&mut self) -> Option<Op> {
        self.link.poll_op()
    }

    /// [`Self::poll_op`], with the SENDs put straight into `batch` (see `Link::poll_op_into`).
    #[inline]
    pub fn poll_op_into(&mut self, batch: &mut Vec<(WrId, SendBuf)>) -> Option<Op> {
        self.link.poll_op_into(batch)
    }

    /// Whether [`Self::poll_op`] has anything to do: when not, it would return `None` at once
    /// and change nothing.
    #[inline]
    pub fn has_ops(&self) -> bool {
        self.link.has_work()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// Whether [`Self::poll_event`] has an event to return.
    #[inline]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Calls in progress.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Largest response sent inline to this client; a larger one takes the rendezvous path.
    pub fn eager_limit(&self) -> usize {
        self.link.eager_limit
    }

    /// Our response regions the client has not yet reported READ.
    pub fn regions_advertised(&self) -> usize {
        self.link.rdv.advertised()
    }

    /// Counters.
    pub fn stats(&self) -> ProtoStats {
        self.link.stats()
    }
}

/// Why a new request must be refused, if it must: the server shuts down, `in_flight` calls
/// fill the connection, or the payload it advertises is beyond what we READ.
fn refusal(
    shutting_down: bool,
    in_flight: usize,
    max_in_flight: u32,
    link: &Link,
    desc: Option<&RegionDesc>,
) -> Option<WireError> {
    if shutting_down {
        return Some(WireError::new(WireErrorCode::ShuttingDown, "server is shutting down"));
    }
    if in_flight >= max_in_flight as usize {
        let msg = format!("{in_flight} calls in progress on this connection");
        return Some(WireError::new(WireErrorCode::Overloaded, msg));
    }
    let max = link.max_message_size.min(link.max_read_size);
    match desc {
        Some(d) if d.len > max => Some(WireError::new(
            WireErrorCode::PayloadTooLarge,
            format!("request of {} bytes exceeds the server's limit of {max}", d.len),
        )),
        _ => None,
    }
}

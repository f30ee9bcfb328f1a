//! The client end of a connection: issues calls, receives responses.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rpc_transport::{Buf, Detail, MemPool, ReadError, Received, RegionDesc, SendBuf, WrId};
use rustc_hash::FxHashMap;

use super::config::{PeerLimits, ProtoConfig};
use super::deadlines::{earliest, DeadlineQueue};
use super::error::ProtoError;
use super::header::{Header, Kind, FLAG_ERROR, FLAG_METADATA, FLAG_RENDEZVOUS, HEADER_LEN};
use super::link::{Body, Link, Op, Role};
use super::rendezvous::AbandonedRead;
use super::stats::ProtoStats;
use super::wire::{
    decode_desc, encode_desc, encode_request_body, metadata_overhead, WireError, MAX_METADATA_LEN,
};
use super::{CallInfo, MethodId, Path};

/// Why a call failed, as the protocol sees it (the runtime maps it to its public error).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallFailure {
    /// The server answered with an error.
    Remote(WireError),
    /// The deadline passed first.
    DeadlineExceeded,
    /// READing the advertised response failed.
    ReadFailed(ReadError),
    /// The advertised response is larger than this side accepts.
    TooLarge {
        /// Advertised length.
        len: u64,
        /// Our limit.
        max: u64,
    },
    /// Registering the request payload failed (the cause is the transport's error).
    RegisterFailed(Detail),
    /// The connection died (the cause is the transport's error, when it failed).
    Disconnected(Detail),
}

/// Why a call could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// That id is in use.
    #[error("call id {0} is already in use")]
    DuplicateId(u64),
    /// Call id 0 is reserved.
    #[error("call id 0 is reserved")]
    ZeroId,
    /// `max_in_flight` calls are in progress.
    #[error("too many calls in flight ({0})")]
    TooManyInFlight(u32),
    /// The metadata section exceeds [`MAX_METADATA_LEN`].
    #[error("metadata of {len} bytes exceeds the limit of {max}")]
    MetadataTooLarge {
        /// Encoded metadata length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The payload exceeds what the server accepts.
    #[error("request of {len} bytes exceeds the server's limit of {max}")]
    TooLarge {
        /// Payload length.
        len: u64,
        /// The server's limit.
        max: u64,
    },
}

/// A request payload as the runtime hands it over.
#[derive(Debug)]
pub(crate) enum Payload {
    /// Encoded bytes (copied behind the header of an eager request).
    Bytes(Bytes),
    /// Encoded behind [`HEADER_LEN`] bytes of room in a buffer of the connection's pool: an
    /// eager request without metadata goes out as this very buffer, its header written in the
    /// room (one buffer per request, no copy).
    Framed(Buf),
}

impl Payload {
    /// Encoded length.
    pub(crate) fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Framed(b) => b.len().saturating_sub(HEADER_LEN),
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Payload::Bytes(b) => b,
            Payload::Framed(b) => b.freeze().slice(HEADER_LEN..),
        }
    }
}

/// Something the application must learn.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// A call finished (successfully or not). Exactly one per started call, unless cancelled.
    Completed {
        /// Which call.
        call_id: u64,
        /// The response payload (as it lies in its receive buffer or READ destination), or why
        /// there is none.
        result: Result<Received, CallFailure>,
        /// Which path each direction took.
        info: CallInfo,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the request payload's registration.
    Registering,
    /// The request is queued or sent.
    AwaitingResponse,
    /// READing the advertised response (queued for budget, or in flight).
    ReadingResponse,
}

#[derive(Debug)]
struct Call {
    method: MethodId,
    state: State,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    info: CallInfo,
    /// Opaque metadata sent with the request (empty: none), kept until the request is queued.
    metadata: Bytes,
}

/// The header of a request.
fn request_header(call_id: u64, method: MethodId, timeout: Option<Duration>, flags: u16) -> Header {
    let mut h = Header::new(Kind::Request);
    h.call_id = call_id;
    h.method_id = method;
    h.flags = flags;
    // Relative deadline in microseconds, at least 1 so that it is not read as "none".
    h.arg = timeout.map_or(0, |t| (t.as_micros().min(u64::MAX as u128) as u64).max(1));
    h
}

/// The client end's state machine. See the [module docs](super) for the calling protocol.
pub struct ClientProto {
    link: Link,
    /// Keyed by the ids the caller chose (never the peer): a fast hash is enough.
    calls: FxHashMap<u64, Call>,
    deadlines: DeadlineQueue,
    events: VecDeque<ClientEvent>,
    max_in_flight: u32,
    peer_max_message: u64,
}

impl std::fmt::Debug for ClientProto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientProto").field("calls", &self.calls.len()).finish_non_exhaustive()
    }
}

impl ClientProto {
    /// A client end with our config and what setup told us of the server, set up at `now`.
    pub fn new(config: &ProtoConfig, peer: &PeerLimits, now: Instant) -> ClientProto {
        ClientProto {
            link: Link::new(Role::Client, config, peer, now),
            calls: FxHashMap::default(),
            deadlines: DeadlineQueue::default(),
            events: VecDeque::new(),
            max_in_flight: config.max_in_flight,
            peer_max_message: peer.hello.max_message_size,
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

    /// Starts call `call_id` (chosen by the caller, non-zero, unique on this connection).
    /// `timeout` travels as a relative duration; the call fails locally when it passes.
    pub fn start_call(
        &mut self,
        call_id: u64,
        method: MethodId,
        payload: Bytes,
        timeout: Option<Duration>,
        now: Instant,
    ) -> Result<(), StartError> {
        self.start_call_with_metadata(call_id, method, payload, Bytes::new(), timeout, now)
    }

    /// Like [`ClientProto::start_call`], with `metadata` (opaque bytes, at most
    /// [`MAX_METADATA_LEN`]; empty: none) travelling in the request frame ahead of the payload or
    /// its descriptor. The payload goes inline if it fits with the metadata.
    pub fn start_call_with_metadata(
        &mut self,
        call_id: u64,
        method: MethodId,
        payload: Bytes,
        metadata: Bytes,
        timeout: Option<Duration>,
        now: Instant,
    ) -> Result<(), StartError> {
        self.start(call_id, method, Payload::Bytes(payload), metadata, timeout, now)
    }

    /// Like [`ClientProto::start_call_with_metadata`], with a payload in either form.
    pub(crate) fn start(
        &mut self,
        call_id: u64,
        method: MethodId,
        payload: Payload,
        metadata: Bytes,
        timeout: Option<Duration>,
        now: Instant,
    ) -> Result<(), StartError> {
        if metadata.len() > MAX_METADATA_LEN {
            return Err(StartError::MetadataTooLarge { len: metadata.len(), max: MAX_METADATA_LEN });
        }
        if call_id == 0 {
            return Err(StartError::ZeroId);
        }
        let in_flight = self.calls.len();
        // One look at the table: the call goes in through the entry that found its id free.
        let Entry::Vacant(slot) = self.calls.entry(call_id) else {
            return Err(StartError::DuplicateId(call_id));
        };
        if self.link.rdv.busy(call_id) {
            return Err(StartError::DuplicateId(call_id));
        }
        if in_flight >= self.max_in_flight as usize {
            return Err(StartError::TooManyInFlight(self.max_in_flight));
        }
        let len = payload.len() as u64;
        if len > self.peer_max_message {
            return Err(StartError::TooLarge { len, max: self.peer_max_message });
        }
        self.link.now = self.link.now.max(now);
        // A timeout too far away to be a point in time (`Duration::MAX`) is no deadline.
        let deadline = timeout.and_then(|t| now.checked_add(t));
        let eager = payload.len() + metadata_overhead(&metadata) <= self.link.eager_limit;
        let mut call = Call {
            method,
            state: State::AwaitingResponse,
            timeout,
            deadline,
            info: CallInfo::default(),
            metadata: Bytes::new(),
        };
        let mut metadata = metadata;
        if !eager {
            // The metadata travels with the request once its payload is registered.
            call.metadata = std::mem::take(&mut metadata);
            call.state = State::Registering;
            call.info.request = Path::Rendezvous;
        }
        slot.insert(call);
        if let Some(at) = deadline {
            let calls = &self.calls;
            let live = |id, at| calls.get(&id).is_some_and(|c: &Call| c.deadline == Some(at));
            self.deadlines.push_pruned(at, call_id, in_flight + 1, live);
        }
        if eager {
            self.link.stats.eager_sent += 1;
            match payload {
                Payload::Framed(buf) if metadata.is_empty() => {
                    let h = request_header(call_id, method, timeout, 0);
                    self.link.queue_body(h, Body::Framed(buf));
                }
                Payload::Framed(buf) => {
                    // The metadata goes between the header and the payload: one frame buffer
                    // with room for both, the payload copied once.
                    let h = request_header(call_id, method, timeout, FLAG_METADATA);
                    let body = [&(metadata.len() as u16).to_le_bytes()[..], &metadata, &buf[HEADER_LEN..]];
                    let frame = self.link.frame_buffer(&body);
                    self.link.queue_body(h, Body::Framed(frame));
                }
                other => self.queue_request(call_id, method, timeout, 0, &metadata, other.into_bytes()),
            }
        } else {
            self.link.rdv.reserve_own(call_id, len);
            self.link.push_op(Op::Register { call_id, data: payload.into_bytes() });
        }
        Ok(())
    }

    fn queue_request(
        &mut self,
        call_id: u64,
        method: MethodId,
        timeout: Option<Duration>,
        flags: u16,
        metadata: &[u8],
        body: Bytes,
    ) {
        let flags = if metadata.is_empty() { flags } else { flags | FLAG_METADATA };
        let h = request_header(call_id, method, timeout, flags);
        self.link.queue(h, encode_request_body(metadata, body));
    }

    /// Reports the outcome of an [`Op::Register`].
    pub fn handle_registered(&mut self, call_id: u64, result: Result<RegionDesc, Detail>) {
        let registering = self.calls.get(&call_id).is_some_and(|c| c.state == State::Registering);
        self.link.rdv.registered(call_id, registering && result.is_ok());
        if result.is_ok() {
            self.link.stats.regions_registered += 1;
        }
        let Some(call) = self.calls.get_mut(&call_id).filter(|_| registering) else {
            // Cancelled (or expired) while registering: the server never saw it; revoke at once.
            if let Ok(desc) = result {
                self.link.revoke(desc);
            }
            return;
        };
        match result {
            Ok(desc) => {
                call.state = State::AwaitingResponse;
                let (method, timeout) = (call.method, call.timeout);
                let metadata = std::mem::take(&mut call.metadata);
                self.link.stats.rendezvous_sent += 1;
                let now = self.link.now;
                self.link.rdv.advertise(call_id, &desc, now);
                let body = Bytes::copy_from_slice(&encode_desc(&desc));
                self.queue_request(call_id, method, timeout, FLAG_RENDEZVOUS, &metadata, body);
            }
            Err(e) => self.complete(call_id, Err(CallFailure::RegisterFailed(e))),
        }
    }

    /// Handles one received frame at time `now`. An error is fatal: close the connection and
    /// call [`ClientProto::fail_all`].
    /// Copies a response's body (not the header; nothing of a frame without one);
    /// [`ClientProto::handle_recv_bytes`] copies nothing.
    pub fn handle_recv(&mut self, frame: &[u8], now: Instant) -> Result<(), ProtoError> {
        let header = self.link.on_header(frame, now)?;
        match header.kind {
            Kind::Response => {
                let body = self.link.copy_received(&frame[HEADER_LEN..]);
                self.on_response(&header, Received::from(body))
            }
            other => Self::on_bodiless(other),
        }
    }

    /// Handles one received frame at time `now`; an eager response's payload is a slice of
    /// `frame` (no copy). An error is fatal: close the connection and call
    /// [`ClientProto::fail_all`].
    pub fn handle_recv_bytes(&mut self, frame: impl Into<Received>, now: Instant) -> Result<(), ProtoError> {
        let frame = frame.into();
        let header = self.link.on_header(&frame, now)?;
        match header.kind {
            Kind::Response => self.on_response(&header, frame.slice(HEADER_LEN..)),
            other => Self::on_bodiless(other),
        }
    }

    /// A frame other than a response: credits and keepalive say nothing more; a server sends
    /// nothing else.
    fn on_bodiless(kind: Kind) -> Result<(), ProtoError> {
        match kind {
            Kind::Credit | Kind::Ping | Kind::Pong => Ok(()),
            other => Err(ProtoError::UnexpectedKind(other)),
        }
    }

    fn on_response(&mut self, header: &Header, body: Received) -> Result<(), ProtoError> {
        let call_id = header.call_id;
        let rendezvous = header.flags & FLAG_RENDEZVOUS != 0;
        if rendezvous && header.flags & FLAG_ERROR != 0 {
            return Err(ProtoError::UnknownFlags(header.flags));
        }
        // One look at the table: a call answered is taken out through the same entry.
        let Entry::Occupied(entry) = self.calls.entry(call_id) else {
            if rendezvous {
                // A response to a call we abandoned: we will not READ it; the server may revoke.
                decode_desc(&body)?;
                self.link.report_done(call_id);
            }
            return Ok(());
        };
        if entry.get().state != State::AwaitingResponse {
            return Err(ProtoError::UnexpectedKind(Kind::Response));
        }
        if header.flags & FLAG_ERROR != 0 {
            let call = entry.remove();
            self.completed(call_id, call, Err(CallFailure::Remote(WireError::decode(&body))));
            return Ok(());
        }
        if !rendezvous {
            self.link.stats.eager_received += 1;
            let call = entry.remove();
            self.completed(call_id, call, Ok(body));
            return Ok(());
        }
        let desc = decode_desc(&body)?;
        let call = entry.into_mut();
        call.info.response = Path::Rendezvous;
        let max = self.link.max_message_size.min(self.link.max_read_size);
        if desc.len > max {
            self.link.report_done(call_id);
            self.complete(call_id, Err(CallFailure::TooLarge { len: desc.len, max }));
            return Ok(());
        }
        call.state = State::ReadingResponse;
        self.link.rdv.queue_read(call_id, desc);
        Ok(())
    }

    /// Reports the outcome of an [`Op::Read`]. The peer is told the READ is done in any case,
    /// so it may revoke its region.
    pub fn handle_read_complete(&mut self, wr_id: WrId, result: Result<Bytes, ReadError>) {
        let Some(read) = self.link.rdv.read_complete(wr_id) else { return };
        self.link.report_done(read.call_id);
        if read.abandoned {
            return; // cancelled or expired meanwhile; the buffer is simply dropped now
        }
        match result {
            Ok(data) => {
                self.link.stats.rendezvous_received += 1;
                self.link.stats.bytes_read += data.len() as u64;
                self.complete(read.call_id, Ok(data.into()));
            }
            Err(e) => self.complete(read.call_id, Err(CallFailure::ReadFailed(e))),
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

    /// Abandons a call: the server is told (it aborts the handler, and reports done for our
    /// request region once it is sure not to READ it). Nothing is revoked here: our region stays
    /// until that report (or the done timeout), and a READ of the response already in flight
    /// stays until its completion, after which we report done. No event follows.
    /// Returns whether the call was in progress.
    pub fn cancel(&mut self, call_id: u64) -> bool {
        let Some(call) = self.calls.remove(&call_id) else { return false };
        self.deadlines.forget(call.deadline, call_id);
        self.link.stats.cancels += 1;
        self.abandon(call_id, call);
        true
    }

    fn abandon(&mut self, call_id: u64, call: Call) {
        if call.state != State::Registering {
            let mut h = Header::new(Kind::Cancel);
            h.call_id = call_id;
            self.link.queue(h, Bytes::new());
        }
        if call.state == State::ReadingResponse
            && self.link.rdv.abandon_read(call_id) == AbandonedRead::WasQueued
        {
            self.link.report_done(call_id);
        }
    }

    /// Expires the calls whose deadline has passed, and checks keepalive and the READ and
    /// done timeouts. An error is fatal: close the connection and call
    /// [`ClientProto::fail_all`].
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ProtoError> {
        for (call_id, at) in self.deadlines.expired(now) {
            let live = self.calls.get(&call_id).is_some_and(|c| c.deadline == Some(at));
            if let (true, Some(call)) = (live, self.calls.remove(&call_id)) {
                self.link.stats.deadlines_expired += 1;
                let info = call.info;
                self.abandon(call_id, call);
                self.events.push_back(ClientEvent::Completed {
                    call_id,
                    result: Err(CallFailure::DeadlineExceeded),
                    info,
                });
            }
        }
        self.link.check_timeouts(now)
    }

    /// The earliest timeout added since the last look (a call's deadline, a READ's or a done
    /// report's), if any was. Nothing else makes [`ClientProto::poll_timeout`] earlier, except
    /// [`ClientProto::handle_timeout`] itself: a driver whose timer is armed no later than this (and
    /// has not fired) need not ask for it again.
    #[inline]
    pub fn take_added_timeout(&mut self) -> Option<Instant> {
        earliest(self.deadlines.take_added(), self.link.take_added_timeout())
    }

    /// When [`ClientProto::handle_timeout`] must next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let calls = &self.calls;
        let call = self.deadlines.next(|id, at| calls.get(&id).is_some_and(|c| c.deadline == Some(at)));
        earliest(call, self.link.next_timeout())
    }

    /// No call in progress, nothing to send or being sent, no region advertised, no READ: the
    /// connection can be closed without leaving the server a region to revoke or a cancel unsaid.
    pub fn is_idle(&self) -> bool {
        self.calls.is_empty() && self.link.is_idle()
    }

    /// The connection is dead: every call in progress completes with `Disconnected`, and every
    /// region still advertised is revoked (poll the operations once more).
    pub fn fail_all(&mut self, reason: impl Into<Detail>) {
        let reason = reason.into();
        self.link.revoke_all();
        let mut ids: Vec<u64> = self.calls.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(call) = self.calls.remove(&id) {
                let result = Err(CallFailure::Disconnected(reason.clone()));
                self.events.push_back(ClientEvent::Completed { call_id: id, result, info: call.info });
            }
        }
    }

    fn complete(&mut self, call_id: u64, result: Result<Received, CallFailure>) {
        if let Some(call) = self.calls.remove(&call_id) {
            self.completed(call_id, call, result);
        }
    }

    /// Reports the end of a call already taken out of the table.
    fn completed(&mut self, call_id: u64, call: Call, result: Result<Received, CallFailure>) {
        self.deadlines.forget(call.deadline, call_id);
        self.link.stats.calls_completed += 1;
        self.events.push_back(ClientEvent::Completed { call_id, result, info: call.info });
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
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// Whether [`Self::poll_event`] has an event.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Largest payload sent inline (with no metadata) to this server.
    pub fn eager_limit(&self) -> usize {
        self.link.eager_limit
    }

    /// Calls in progress.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Counters.
    pub fn stats(&self) -> ProtoStats {
        self.link.stats()
    }

    /// Credits left towards the server (for tests).
    pub fn peer_credits(&self) -> u32 {
        self.link.peer_credits()
    }

    /// Our regions the server has not yet reported READ (for tests and stats).
    pub fn regions_advertised(&self) -> usize {
        self.link.rdv.advertised()
    }
}

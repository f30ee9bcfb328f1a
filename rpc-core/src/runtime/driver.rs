//! What the client and server drivers share: feeding completions into the state machine and
//! posting the operations it asks for.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;

use rpc_transport::{
    Buf, Completion, Connection, ReadError, RecvBuffer, RegionDesc, TransportCounters, TransportError, WrId,
};
use tokio::time::Sleep;

use crate::proto::{ClientProto, Op, ProtoError, ProtoStats, ServerProto};

/// Completions taken per poll of the completion queue.
pub(crate) const COMPLETION_BATCH: usize = 64;
/// Rounds of (commands, completions, ops) one wake-up may run before yielding to the scheduler.
pub(crate) const ROUNDS_PER_WAKE: usize = 16;

/// Counters of one connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnStats {
    /// The protocol's counters.
    pub proto: ProtoStats,
    /// The transport's counters.
    pub transport: TransportCounters,
    /// Calls in progress.
    pub calls_in_flight: usize,
    /// Times the connection's driver task was polled since it started: its wake-ups (a poll
    /// that runs several rounds of work counts once).
    pub driver_polls: u64,
    /// Handler tasks the connection's driver spawned (a server's; 0 on a client).
    pub handlers_spawned: u64,
}

impl ConnStats {
    /// Field-by-field sum, for totals over connections.
    pub fn sum(&self, other: &ConnStats) -> ConnStats {
        ConnStats {
            proto: self.proto.merged(&other.proto),
            transport: self.transport.merged(&other.transport),
            calls_in_flight: self.calls_in_flight + other.calls_in_flight,
            driver_polls: self.driver_polls + other.driver_polls,
            handlers_spawned: self.handlers_spawned + other.handlers_spawned,
        }
    }
}

/// The inputs both state machines take from the transport.
pub(crate) trait ProtoEnd {
    fn handle_frame(&mut self, frame: Bytes, now: Instant) -> Result<(), ProtoError>;
    fn handle_send(&mut self, wr_id: WrId, result: Result<(), String>) -> Result<(), ProtoError>;
    fn handle_read(&mut self, wr_id: WrId, result: Result<Bytes, ReadError>);
    fn handle_registered(&mut self, call_id: u64, result: Result<RegionDesc, String>);
    fn next_op(&mut self) -> Option<Op>;
    fn timeout(&mut self) -> Option<Instant>;
    fn expire(&mut self, now: Instant) -> Result<(), ProtoError>;
}

macro_rules! impl_proto_end {
    ($ty:ty, |$p:ident, $frame:ident, $now:ident| $recv:expr) => {
        impl ProtoEnd for $ty {
            fn handle_frame(&mut self, $frame: Bytes, $now: Instant) -> Result<(), ProtoError> {
                let $p = self;
                $recv
            }
            fn handle_send(&mut self, wr_id: WrId, result: Result<(), String>) -> Result<(), ProtoError> {
                self.handle_send_complete(wr_id, result)
            }
            fn handle_read(&mut self, wr_id: WrId, result: Result<Bytes, ReadError>) {
                self.handle_read_complete(wr_id, result)
            }
            fn handle_registered(&mut self, call_id: u64, result: Result<RegionDesc, String>) {
                <$ty>::handle_registered(self, call_id, result)
            }
            fn next_op(&mut self) -> Option<Op> {
                self.poll_op()
            }
            fn timeout(&mut self) -> Option<Instant> {
                self.poll_timeout()
            }
            fn expire(&mut self, now: Instant) -> Result<(), ProtoError> {
                self.handle_timeout(now)
            }
        }
    };
}

impl_proto_end!(ClientProto, |p, frame, now| p.handle_recv_bytes(frame, now));
impl_proto_end!(ServerProto, |p, frame, now| p.handle_recv_bytes(frame, now));

/// Why a connection's driver stops.
#[derive(Debug)]
pub(crate) enum Fatal {
    Transport(TransportError),
    Protocol(ProtoError),
}

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fatal::Transport(e) => write!(f, "{e}"),
            Fatal::Protocol(
                e @ (ProtoError::PeerSilent { .. }
                | ProtoError::DoneTimeout { .. }
                | ProtoError::ReadTimeout { .. }),
            ) => {
                write!(f, "{e}")
            }
            Fatal::Protocol(e) => write!(f, "protocol violation by the peer: {e}"),
        }
    }
}

/// The current time, from tokio's clock (so paused-time tests work).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Polls the completion queue once and feeds what it returns into `proto`. Returns whether any
/// completion was handled. Receive buffers are re-posted before the next operation is polled,
/// as the credit scheme requires.
pub(crate) fn poll_completions<P: ProtoEnd>(
    cx: &mut Context<'_>,
    conn: &mut dyn Connection,
    proto: &mut P,
    scratch: &mut Vec<Completion>,
) -> Result<bool, Fatal> {
    match conn.poll_completions(cx, scratch, COMPLETION_BATCH) {
        Poll::Pending => return Ok(false),
        Poll::Ready(Err(e)) => return Err(Fatal::Transport(e)),
        Poll::Ready(Ok(())) => {}
    }
    let now = now();
    for completion in scratch.drain(..) {
        match completion {
            Completion::Recv { buf } => {
                // The message is handed on as it lies in the receive buffer (no copy); a fresh
                // buffer of the connection's pool takes its place in the receive queue before the
                // state machine can return the credit.
                let size = buf.capacity();
                let handled = proto.handle_frame(buf.into_bytes(), now);
                conn.post_recv(RecvBuffer::from_buf(conn.pool().alloc_or_heap(size)))
                    .map_err(Fatal::Transport)?;
                handled.map_err(Fatal::Protocol)?;
            }
            Completion::Send { wr_id, result } => {
                proto.handle_send(wr_id, result.map_err(|e| e.to_string())).map_err(Fatal::Protocol)?;
            }
            Completion::Read { wr_id, result } => proto.handle_read(wr_id, result.map(Buf::freeze)),
            other => tracing::warn!(?other, "unknown completion kind ignored"),
        }
    }
    Ok(true)
}

/// Posts every operation the state machine asks for.
pub(crate) fn post_ops<P: ProtoEnd>(conn: &mut dyn Connection, proto: &mut P) -> Result<(), Fatal> {
    while let Some(op) = proto.next_op() {
        match op {
            Op::Send { wr_id, frame } => conn.post_send(wr_id, frame).map_err(Fatal::Transport)?,
            Op::Register { call_id, data } => {
                let result = conn.register(data).map_err(|e| e.to_string());
                proto.handle_registered(call_id, result);
            }
            Op::Deregister { region } => {
                if let Err(e) = conn.deregister(region) {
                    tracing::warn!(?region, error = %e, "revoking a region failed");
                }
            }
            Op::Read { wr_id, remote } => {
                // The destination comes from the connection's pool: registered once, reused.
                let dst = conn.pool().alloc_or_heap(remote.len as usize);
                conn.post_read(wr_id, remote, dst).map_err(Fatal::Transport)?;
            }
        }
    }
    Ok(())
}

/// After the connection closed: carries out the revocations the state machine still asks for
/// (its regions go with the connection); everything else it asks for is moot.
pub(crate) fn revoke_after_close<P: ProtoEnd>(conn: &mut dyn Connection, proto: &mut P) {
    while let Some(op) = proto.next_op() {
        if let Op::Deregister { region } = op {
            if let Err(e) = conn.deregister(region) {
                tracing::debug!(?region, error = %e, "revoking a region after close failed");
            }
        }
    }
}

/// Runs expired timers (call deadlines, keepalive, READ and done timeouts) and arms `sleep`
/// for the next one. Returns whether anything expired; a fatal timeout (a silent peer, an
/// overdue READ or done report) is an error.
pub(crate) fn drive_timers<P: ProtoEnd>(
    cx: &mut Context<'_>,
    proto: &mut P,
    sleep: &mut Pin<Box<Sleep>>,
) -> Result<bool, Fatal> {
    let mut fired = false;
    loop {
        let Some(at) = proto.timeout() else { return Ok(fired) };
        let at = tokio::time::Instant::from_std(at);
        if at <= tokio::time::Instant::now() {
            proto.expire(now()).map_err(Fatal::Protocol)?;
            fired = true;
            continue;
        }
        if sleep.deadline() == at {
            // Armed for this very time by an earlier round (which polled it, so it wakes this
            // task then; only this task polls it): nothing to do until it fires.
            return Ok(fired);
        }
        sleep.as_mut().reset(at);
        if sleep.as_mut().poll(cx).is_pending() {
            return Ok(fired);
        }
    }
}

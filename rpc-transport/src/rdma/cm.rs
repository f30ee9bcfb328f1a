//! rdma_cm events, asynchronously: one event channel per listener / outgoing connection, drained
//! by a small tokio task that routes each event to the [`CmSink`] of its `rdma_cm_id`.
//!
//! Connections accepted by a listener get their events (ESTABLISHED, DISCONNECTED) on the
//! listener's channel (sideway does not wrap `rdma_migrate_id`), so the task lives as long as any
//! identifier of its channel: it stops when the last owner is gone.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use sideway::rdmacm::communication_manager::{EventChannel, EventType, Identifier, PortSpace};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::error::RdmaError;
use super::sys;
use crate::TransportError;

/// One rdma_cm event, as routed to the identifier it concerns.
#[derive(Clone)]
pub(crate) enum CmEvent {
    AddressResolved,
    RouteResolved,
    /// A new identifier for an incoming connection (delivered to the listener's sink).
    ConnectRequest(Arc<Identifier>),
    ConnectResponse,
    Established,
    Disconnected,
    /// Address/route error, unreachable, connect error, rejected, device removal...
    Failed {
        kind: &'static str,
        status: i32,
    },
    /// Anything else (logged by whoever waits).
    Other(&'static str),
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmEvent::AddressResolved => f.write_str("ADDR_RESOLVED"),
            CmEvent::RouteResolved => f.write_str("ROUTE_RESOLVED"),
            CmEvent::ConnectRequest(_) => f.write_str("CONNECT_REQUEST"),
            CmEvent::ConnectResponse => f.write_str("CONNECT_RESPONSE"),
            CmEvent::Established => f.write_str("ESTABLISHED"),
            CmEvent::Disconnected => f.write_str("DISCONNECTED"),
            CmEvent::Failed { kind, status } => write!(f, "{kind} (status {status})"),
            CmEvent::Other(kind) => f.write_str(kind),
        }
    }
}

/// The events of one identifier, waiting for its owner.
#[derive(Default)]
pub(crate) struct CmSink {
    queue: Mutex<VecDeque<CmEvent>>,
    /// The queue's length, written under its lock: an owner whose waker is registered looks
    /// here (one load) instead of registering again and taking the lock on every poll.
    queued: AtomicUsize,
    waker: AtomicWaker,
}

impl fmt::Debug for CmSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmSink").finish_non_exhaustive()
    }
}

impl CmSink {
    fn push(&self, ev: CmEvent) {
        {
            let mut queue = self.queue.lock();
            queue.push_back(ev);
            self.queued.store(queue.len(), Ordering::Release);
        }
        self.waker.wake();
    }

    /// The next event, registering the task's waker when there is none.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<CmEvent> {
        self.waker.register(cx.waker());
        let mut queue = self.queue.lock();
        let ev = queue.pop_front();
        self.queued.store(queue.len(), Ordering::Release);
        match ev {
            Some(ev) => Poll::Ready(ev),
            None => Poll::Pending,
        }
    }

    /// No event is queued. With the owner's waker registered by a `Pending` [`CmSink::poll_next`]
    /// since its last event, nothing is lost by not polling: an event pushed after this look
    /// wakes that waker (a push stores the length before it wakes).
    pub(crate) fn is_quiet(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }

    /// Waits for the next event.
    pub(crate) async fn next(&self) -> CmEvent {
        poll_fn(|cx| self.poll_next(cx)).await
    }
}

/// Attaches a fresh sink to an identifier and returns it.
pub(crate) fn attach_sink(id: &Identifier) -> Arc<CmSink> {
    let sink = Arc::new(CmSink::default());
    id.setup_context(Arc::clone(&sink));
    sink
}

fn sink_of(id: &Identifier) -> Option<Arc<CmSink>> {
    id.get_context::<Arc<CmSink>>().map(|s| Arc::clone(&*s))
}

/// An rdma_cm event channel with its dispatcher task. Dropping the last owner (together with
/// every identifier created on it) stops the task.
pub(crate) struct CmChannel {
    channel: Arc<EventChannel>,
    wake: Arc<Notify>,
}

impl fmt::Debug for CmChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmChannel").field("fd", &self.channel.as_raw_fd()).finish()
    }
}

impl CmChannel {
    /// Opens `/dev/infiniband/rdma_cm` (through librdmacm) and starts the dispatcher.
    pub(crate) fn open() -> Result<CmChannel, TransportError> {
        let channel = EventChannel::new()
            .map_err(|e| RdmaError::NoDevice(format!("cannot open an rdma_cm event channel: {e}")))?;
        sys::set_nonblocking(channel.as_raw_fd())
            .map_err(|e| TransportError::Verbs { call: "fcntl(rdma_cm fd)", detail: e.to_string() })?;
        let fd = sys::register_readable(Arc::clone(&channel))?;
        let wake = Arc::new(Notify::new());
        tokio::spawn(dispatch(fd, Arc::clone(&wake)));
        Ok(CmChannel { channel, wake })
    }

    /// A new RC (`RDMA_PS_TCP`) identifier with its sink.
    pub(crate) fn create_id(&self) -> Result<(Arc<Identifier>, Arc<CmSink>), TransportError> {
        let id = self
            .channel
            .create_id(PortSpace::Tcp)
            .map_err(|e| TransportError::Verbs { call: "rdma_create_id", detail: e.to_string() })?;
        let sink = attach_sink(&id);
        Ok((id, sink))
    }

    /// Tells the dispatcher to check whether it is still needed (call after dropping identifiers).
    pub(crate) fn nudge(&self) {
        self.wake.notify_one();
    }
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

async fn dispatch(fd: AsyncFd<Arc<EventChannel>>, wake: Arc<Notify>) {
    loop {
        tokio::select! {
            ready = fd.readable() => match ready {
                Ok(mut guard) => {
                    // Drain until the channel reports no event; try_io clears the readiness only
                    // then, so an event that arrives meanwhile wakes us again.
                    while let Ok(res) = guard.try_io(|inner| next_event(inner.get_ref())) {
                        if let Err(e) = res {
                            tracing::warn!(error = %e, "rdma_cm event channel failed; dispatcher stops");
                            return;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rdma_cm event channel not pollable; dispatcher stops");
                    return;
                }
            },
            _ = wake.notified() => {}
        }
        // Only this task still holds the channel: every identifier and owner is gone.
        if Arc::strong_count(fd.get_ref()) == 1 {
            tracing::trace!("rdma_cm dispatcher done");
            return;
        }
    }
}

/// Gets, routes and acknowledges one event. `WouldBlock` when there is none.
fn next_event(channel: &Arc<EventChannel>) -> std::io::Result<()> {
    use sideway::rdmacm::communication_manager::GetEventErrorKind;
    let ev = match channel.get_cm_event() {
        Ok(ev) => ev,
        Err(e) => {
            return Err(match e.0 {
                GetEventErrorKind::NoEvent => std::io::ErrorKind::WouldBlock.into(),
                other => std::io::Error::other(other.to_string()),
            })
        }
    };
    let ty = ev.event_type();
    let status = ev.status();
    tracing::debug!(event = ?ty, status, "rdma_cm event");
    let routed = match ty {
        EventType::ConnectRequest => ev.cm_id().map(CmEvent::ConnectRequest).zip(ev.listener_id()),
        _ => ev.cm_id().map(|id| (map_event(ty, status), id)),
    };
    // Acknowledge before handing the event on (nothing of the raw event is kept).
    let _ = ev.ack();
    if let Some((event, owner)) = routed {
        match sink_of(&owner) {
            Some(sink) => sink.push(event),
            None => tracing::debug!(?event, "rdma_cm event for an identifier nobody waits on"),
        }
    }
    Ok(())
}

fn map_event(ty: EventType, status: i32) -> CmEvent {
    let failed = |kind| CmEvent::Failed { kind, status };
    match ty {
        EventType::AddressResolved => CmEvent::AddressResolved,
        EventType::RouteResolved => CmEvent::RouteResolved,
        EventType::ConnectResponse => CmEvent::ConnectResponse,
        EventType::Established => CmEvent::Established,
        EventType::Disconnected => CmEvent::Disconnected,
        EventType::AddressError => failed("ADDR_ERROR"),
        EventType::RouteError => failed("ROUTE_ERROR"),
        EventType::ConnectError => failed("CONNECT_ERROR"),
        EventType::Unreachable => failed("UNREACHABLE"),
        EventType::Rejected => failed("REJECTED"),
        EventType::DeviceRemoval => failed("DEVICE_REMOVAL"),
        EventType::ConnectRequest => CmEvent::Other("CONNECT_REQUEST"),
        EventType::MulticastJoin => CmEvent::Other("MULTICAST_JOIN"),
        EventType::MulticastError => CmEvent::Other("MULTICAST_ERROR"),
        EventType::AddressChange => CmEvent::Other("ADDR_CHANGE"),
        EventType::TimewaitExit => CmEvent::Other("TIMEWAIT_EXIT"),
    }
}

//! The few verbs / rdma_cm calls that `sideway` does not wrap, fenced here behind safe functions.
//!
//! Every `unsafe` block of the rdma backend that touches `rdma_mummy_sys` directly lives in this
//! file: completion-channel events (`ibv_get_cq_event`, `ibv_ack_cq_events`,
//! `ibv_req_notify_cq`), allocation-free CQ polling (`ibv_poll_cq`), async device events, the
//! port's `max_msg_sz`, the QP's granted capabilities, and building a `ConnectionParameter` with the
//! fields sideway has no setters for.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};

use rdma_mummy_sys as ffi;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::rdmacm::communication_manager::ConnectionParameter;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub(crate) use ffi::ibv_wc as WorkCompletion;

/// A zeroed work completion, to fill a poll array.
pub(crate) fn empty_wc() -> WorkCompletion {
    // SAFETY: `ibv_wc` is a plain C struct of integers and a union of integers: all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// Polls up to `out.len()` completions into `out`; returns how many were written.
pub(crate) fn poll_cq(cq: &BasicCompletionQueue, out: &mut [WorkCompletion]) -> io::Result<usize> {
    let n = i32::try_from(out.len()).unwrap_or(i32::MAX);
    // SAFETY: the CQ is alive (we hold a reference to its owner) and `out` has room for `n`
    // entries; ibv_poll_cq writes at most `n` of them and returns the count or a negative errno.
    let ret = unsafe { ffi::ibv_poll_cq(cq.cq().as_ptr(), n, out.as_mut_ptr()) };
    if ret < 0 {
        return Err(io::Error::from_raw_os_error(-ret));
    }
    Ok(ret as usize)
}

/// Arms the CQ: the next completion added to it produces one event on its completion channel.
pub(crate) fn req_notify_cq(cq: &BasicCompletionQueue) -> io::Result<()> {
    // SAFETY: the CQ is alive; req_notify_cq only writes to the provider's doorbell / CQ state.
    let ret = unsafe { ffi::ibv_req_notify_cq(cq.cq().as_ptr(), 0) };
    // Providers return a positive errno, a negative one, or set errno: normalise all three.
    match ret {
        0 => Ok(()),
        r if r < 0 => Err(io::Error::from_raw_os_error(-r)),
        r => Err(io::Error::from_raw_os_error(r)),
    }
}

/// Takes one event off a non-blocking completion channel. `Ok(false)`: no event pending.
pub(crate) fn get_cq_event(channel: &CompletionChannel) -> io::Result<bool> {
    let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
    let mut ctx: *mut std::ffi::c_void = ptr::null_mut();
    // SAFETY: the channel is alive and its fd is non-blocking; the out-pointers are valid locals.
    let ret = unsafe { ffi::ibv_get_cq_event(channel.comp_channel().as_ptr(), &mut cq, &mut ctx) };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.kind() == io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Acknowledges `n` events taken from the CQ's channel (required before the CQ is destroyed).
pub(crate) fn ack_cq_events(cq: &BasicCompletionQueue, n: u32) {
    if n == 0 {
        return;
    }
    // SAFETY: the CQ is alive and `n` events were taken with get_cq_event and not yet acked.
    unsafe { ffi::ibv_ack_cq_events(cq.cq().as_ptr(), n) }
}

/// Registers an object owning a file descriptor with tokio's reactor for read readiness.
///
/// Every caller passes an owner (an `Arc` of a sideway object, or a device context) whose
/// descriptor stays open, and unchanged, for as long as the owner lives; the `AsyncFd` owns it.
pub(crate) fn register_readable<T: AsRawFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: per this function's contract, `inner.as_raw_fd()` is an open descriptor that keeps
    // referring to the same file for as long as `inner` (owned by the AsyncFd) lives.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

/// Puts a file descriptor in non-blocking mode.
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The async-event file descriptor of a device context.
pub(crate) fn async_fd(ctx: &DeviceContext) -> RawFd {
    // SAFETY: the context is alive (sideway never closes rdma_cm's contexts); async_fd is a plain int.
    unsafe { ctx.context().as_ref().async_fd }
}

/// One asynchronous device event, already acknowledged.
#[derive(Debug, Clone)]
pub(crate) struct AsyncEvent {
    /// `ibv_event_type_str` of the event.
    pub(crate) name: String,
    /// The raw event type.
    pub(crate) kind: u32,
    /// For QP events, the QP number.
    pub(crate) qp_num: Option<u32>,
}

/// Event types whose element is a QP: QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, COMM_EST, SQ_DRAINED,
/// PATH_MIG, PATH_MIG_ERR, QP_LAST_WQE_REACHED.
const QP_EVENTS: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 16];
/// Event types that mean the QP can no longer be used.
pub(crate) const QP_FATAL_EVENTS: [u32; 3] = [1, 2, 3];

/// Takes one async event off the (non-blocking) context, if any.
pub(crate) fn get_async_event(ctx: &DeviceContext) -> io::Result<Option<AsyncEvent>> {
    let mut ev = std::mem::MaybeUninit::<ffi::ibv_async_event>::zeroed();
    // SAFETY: the context is alive; on success the library fills `ev`.
    let ret = unsafe { ffi::ibv_get_async_event(ctx.context().as_ptr(), ev.as_mut_ptr()) };
    if ret != 0 {
        let err = io::Error::last_os_error();
        return if err.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(err) };
    }
    let raw = ev.as_mut_ptr();
    // SAFETY: the event was filled by ibv_get_async_event. The type is read as a u32 (not as the
    // Rust enum, which would be UB for a value this binding does not know).
    let kind = unsafe { ptr::read(ptr::addr_of!((*raw).event_type) as *const u32) };
    let qp_num = if QP_EVENTS.contains(&kind) {
        // SAFETY: for QP events the union holds a valid `ibv_qp` pointer until the event is acked.
        unsafe { NonNull::new((*raw).element.qp).map(|qp| qp.as_ref().qp_num) }
    } else {
        None
    };
    let name = event_type_name(kind);
    // SAFETY: the event came from ibv_get_async_event and is acked exactly once.
    unsafe { ffi::ibv_ack_async_event(raw) };
    Ok(Some(AsyncEvent { name, kind, qp_num }))
}

fn event_type_name(kind: u32) -> String {
    const NAMES: [&str; 21] = [
        "CQ_ERR",
        "QP_FATAL",
        "QP_REQ_ERR",
        "QP_ACCESS_ERR",
        "COMM_EST",
        "SQ_DRAINED",
        "PATH_MIG",
        "PATH_MIG_ERR",
        "DEVICE_FATAL",
        "PORT_ACTIVE",
        "PORT_ERR",
        "LID_CHANGE",
        "PKEY_CHANGE",
        "SM_CHANGE",
        "SRQ_ERR",
        "SRQ_LIMIT_REACHED",
        "QP_LAST_WQE_REACHED",
        "CLIENT_REREGISTER",
        "GID_CHANGE",
        "WQ_FATAL",
        "DEVICE_SPEED_CHANGE",
    ];
    NAMES.get(kind as usize).map(|s| s.to_string()).unwrap_or_else(|| format!("event {kind}"))
}

/// Limits of a port that sideway's `PortAttr` does not expose.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortLimits {
    /// Largest message (and so largest single READ) the port carries.
    pub(crate) max_msg_sz: u32,
    /// `ibv_port_state` (4 = ACTIVE).
    pub(crate) state: u32,
}

/// Queries `max_msg_sz` and the state of a port.
pub(crate) fn query_port_limits(ctx: &DeviceContext, port: u8) -> io::Result<PortLimits> {
    let mut attr = std::mem::MaybeUninit::<ffi::ibv_port_attr>::zeroed();
    // SAFETY: the context is alive and `attr` is a properly sized, zeroed ibv_port_attr.
    let ret = unsafe { ffi::ibv_query_port(ctx.context().as_ptr(), port, attr.as_mut_ptr()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret.abs()));
    }
    // SAFETY: ibv_query_port returned 0, so the struct is filled (it was zeroed before anyway).
    let attr = unsafe { attr.assume_init() };
    Ok(PortLimits { max_msg_sz: attr.max_msg_sz, state: attr.state })
}

/// The fields of `rdma_conn_param` we set (sideway offers a setter only for the QP number).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnParamFields {
    pub(crate) qp_num: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
}

/// Builds a sideway `ConnectionParameter` with every field we need (no private data: our hello
/// travels in-band, see `hello.rs`).
pub(crate) fn conn_param(fields: ConnParamFields) -> ConnectionParameter {
    let raw = ffi::rdma_conn_param {
        private_data: ptr::null(),
        private_data_len: 0,
        responder_resources: fields.responder_resources,
        initiator_depth: fields.initiator_depth,
        flow_control: 1,
        retry_count: fields.retry_count.min(7),
        rnr_retry_count: fields.rnr_retry_count.min(7),
        srq: 0,
        qp_num: fields.qp_num,
    };
    // SAFETY: `ConnectionParameter` (sideway 0.4) is a struct whose single field is an
    // `rdma_conn_param`. `transmute` checks at compile time that both types have the same size, and a
    // struct whose size equals that of its only field has that field at offset 0, so the bytes
    // mean the same thing. The value holds no pointer to anything (private_data is null).
    unsafe { std::mem::transmute::<ffi::rdma_conn_param, ConnectionParameter>(raw) }
}

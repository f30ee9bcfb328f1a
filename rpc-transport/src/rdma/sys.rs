//! The few verbs / rdma_cm calls that `sideway` does not wrap, fenced here behind safe functions.
//!
//! Every `unsafe` block of the rdma backend that touches `rdma_mummy_sys` directly lives in this
//! file: completion-channel events (`ibv_get_cq_event`, `ibv_ack_cq_events`,
//! `ibv_req_notify_cq`), allocation-free CQ polling (`ibv_poll_cq`) and posting (`ibv_post_send`,
//! `ibv_post_recv`: sideway's post guards allocate three vectors per call), async device events, the
//! port's `max_msg_sz`, the QP's granted capabilities, and building a `ConnectionParameter` with the
//! fields sideway has no setters for.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};

use rdma_mummy_sys as ffi;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair};
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

/// Work requests posted with one `ibv_post_send` / `ibv_post_recv` call at most (a stack array).
pub(crate) const POST_BATCH: usize = 16;

/// One scatter-gather entry: `len` bytes at `addr`, in memory registered with `lkey`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sge {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SendOp {
    /// A SEND of the SGE's bytes; `inline`: the provider copies them during the post.
    Send { inline: bool },
    /// An RDMA READ into the SGE from the peer's `remote_addr` (key `rkey`).
    Read { remote_addr: u64, rkey: u32 },
    /// An RDMA WRITE of the SGE's bytes to the peer's `remote_addr` (key `rkey`); only used with
    /// no SGE (zero length, the hello nudge).
    Write { remote_addr: u64, rkey: u32 },
}

/// A send-queue work request as plain data (no pointers), turned into an `ibv_send_wr` by
/// [`post_send`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWr {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    /// Produce a completion on success (errors always produce one).
    pub(crate) signaled: bool,
    /// `None` for an empty SEND.
    pub(crate) sge: Option<Sge>,
    /// A second piece after `sge` (only with `sge`): the body of an inline SEND behind its head.
    pub(crate) sge2: Option<Sge>,
}

/// A receive work request as plain data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvWr {
    pub(crate) wr_id: u64,
    pub(crate) sge: Sge,
}

/// How many work requests of a failed post went to the queue (those before the one the provider
/// refused), and why it refused.
#[derive(Debug)]
pub(crate) struct PostError {
    pub(crate) posted: usize,
    pub(crate) error: io::Error,
}

fn post_errno(ret: i32) -> io::Error {
    // Providers return a positive errno or a negative one.
    io::Error::from_raw_os_error(ret.abs())
}

/// Posts up to [`POST_BATCH`] send-queue work requests as one chain (one doorbell), without
/// allocating. Only the entries posted are initialised (not the whole stack array).
///
/// # Safety
/// For every request with an SGE, `addr..addr + len` lies in memory registered with `lkey` in
/// the QP's protection domain; for a non-inline request it stays allocated, and is not written
/// (a SEND) or not read nor written by Rust code (a READ destination), until the request's
/// completion is polled, the QP is destroyed, or, for an unsignaled request, a later request's
/// completion is polled. Inline data is only read during this call.
pub(crate) unsafe fn post_send(
    qp: &BasicQueuePair,
    wrs: impl ExactSizeIterator<Item = SendWr>,
) -> Result<(), PostError> {
    debug_assert!(wrs.len() <= POST_BATCH);
    let n = wrs.len().min(POST_BATCH);
    if n == 0 {
        return Ok(());
    }
    let mut raw = [const { MaybeUninit::<ffi::ibv_send_wr>::uninit() }; POST_BATCH];
    // Two per request, side by side: `sge` and `sge2`.
    let mut sges = [const { [MaybeUninit::<ffi::ibv_sge>::uninit(); 2] }; POST_BATCH];
    for (i, wr) in wrs.take(n).enumerate() {
        let mut flags: u32 = 0;
        if wr.signaled {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        // SAFETY: `ibv_send_wr` is a plain C struct (integers, pointers, unions of integers):
        // all-zero is a valid value.
        let r = raw[i].write(unsafe { std::mem::zeroed() });
        r.wr_id = wr.wr_id;
        match wr.op {
            SendOp::Send { inline } => {
                r.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
                if inline {
                    flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
                }
            }
            SendOp::Read { remote_addr, rkey } => {
                r.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
                r.wr.rdma.remote_addr = remote_addr;
                r.wr.rdma.rkey = rkey;
            }
            SendOp::Write { remote_addr, rkey } => {
                r.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                r.wr.rdma.remote_addr = remote_addr;
                r.wr.rdma.rkey = rkey;
            }
        }
        r.send_flags = flags;
        if let Some(sge) = wr.sge {
            let pair = &mut sges[i];
            pair[0].write(ffi::ibv_sge { addr: sge.addr, length: sge.len, lkey: sge.lkey });
            r.num_sge = 1;
            if let Some(more) = wr.sge2 {
                pair[1].write(ffi::ibv_sge { addr: more.addr, length: more.len, lkey: more.lkey });
                r.num_sge = 2;
            }
            // A pointer to the pair (`MaybeUninit<T>` has `T`'s layout): its first `num_sge`
            // entries are written.
            r.sg_list = pair.as_mut_ptr().cast();
        }
    }
    // SAFETY: the loop above initialised the first `n` entries (`wrs` yields `n` items: it is
    // an exact-size iterator of at least `n`).
    let raw = unsafe { assume_init_chain(&mut raw[..n]) };
    let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
    // SAFETY: the QP is alive (borrowed); the chain of `n` requests and their SGEs are valid
    // locals for the duration of the call (the provider copies them); the memory the SGEs name
    // is the caller's obligation (see # Safety).
    let ret = unsafe { ffi::ibv_post_send(qp.qp().as_ptr(), raw.as_mut_ptr(), &mut bad) };
    post_outcome(raw, bad, ret)
}

/// Posts up to [`POST_BATCH`] receive work requests as one chain, without allocating.
///
/// # Safety
/// For every request, `addr..addr + len` lies in memory registered with `lkey` (local write) in
/// the QP's protection domain, stays allocated and is not read nor written by Rust code until the
/// request's completion is polled or the QP is destroyed.
pub(crate) unsafe fn post_recv(qp: &BasicQueuePair, wrs: &[RecvWr]) -> Result<(), PostError> {
    debug_assert!(wrs.len() <= POST_BATCH);
    let wrs = &wrs[..wrs.len().min(POST_BATCH)];
    let n = wrs.len();
    if n == 0 {
        return Ok(());
    }
    let mut raw = [const { MaybeUninit::<ffi::ibv_recv_wr>::uninit() }; POST_BATCH];
    let mut sges = [const { MaybeUninit::<ffi::ibv_sge>::uninit() }; POST_BATCH];
    for (i, wr) in wrs.iter().enumerate() {
        // SAFETY: a plain C struct, all-zero is valid (as in post_send).
        let r = raw[i].write(unsafe { std::mem::zeroed() });
        r.wr_id = wr.wr_id;
        r.sg_list = sges[i].write(ffi::ibv_sge { addr: wr.sge.addr, length: wr.sge.len, lkey: wr.sge.lkey });
        r.num_sge = 1;
    }
    // SAFETY: the loop above initialised the first `n` entries.
    let raw = unsafe { assume_init_chain(&mut raw[..n]) };
    let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
    // SAFETY: as in post_send: a live QP, a valid local chain; the memory is the caller's
    // obligation.
    let ret = unsafe { ffi::ibv_post_recv(qp.qp().as_ptr(), raw.as_mut_ptr(), &mut bad) };
    post_outcome(raw, bad, ret)
}

/// A work request with a `next` pointer (`ibv_send_wr`, `ibv_recv_wr`).
trait Chained: Sized {
    fn set_next(&mut self, next: *mut Self);
}

impl Chained for ffi::ibv_send_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Chained for ffi::ibv_recv_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// The initialised entries as a slice, each linked to the next (the last one's `next` stays
/// null, as zeroed).
///
/// # Safety
/// Every entry of `raw` is initialised.
unsafe fn assume_init_chain<T: Chained>(raw: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: the caller guarantees every entry is initialised; `MaybeUninit<T>` has `T`'s layout.
    let raw = unsafe { &mut *(raw as *mut [MaybeUninit<T>] as *mut [T]) };
    let base = raw.as_mut_ptr();
    for i in 1..raw.len() {
        // SAFETY: `i` is in bounds of `raw`, so `base.add(i)` points into it.
        let next = unsafe { base.add(i) };
        raw[i - 1].set_next(next);
    }
    raw
}

/// The result of a post of the chain `raw`: on failure, the requests before `bad` (the one the
/// provider refused) were posted.
fn post_outcome<T>(raw: &[T], bad: *mut T, ret: i32) -> Result<(), PostError> {
    if ret == 0 {
        return Ok(());
    }
    let posted = raw.iter().position(|r| ptr::eq(r, bad)).unwrap_or(0);
    Err(PostError { posted, error: post_errno(ret) })
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

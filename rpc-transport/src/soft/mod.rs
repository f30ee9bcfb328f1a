//! A software verbs endpoint: the receive queue, completion queue, pending operations and
//! registered regions of one end of a connection, shared by the `mem` and `tcp` backends.
//!
//! The backends move bytes; this module keeps the verbs semantics in one place: messages land
//! in posted receives (or wait, counted as unexpected, until one is posted), completions are
//! queued in order and wake the polling task, READs of registered regions are checked for key
//! and bounds, and a failure flushes every pending operation before the completion queue reports
//! the error. A peer that overruns the receive queue by more than `max(recv_depth, 64)` messages
//! fails the connection as malformed, rather than make it buffer without bound.

mod pending;
mod regions;
mod state;

use parking_lot::{Mutex, MutexGuard};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use crate::{
    Buf, Completion, ConnParams, Detail, MemPool, RKey, ReadError, RecvBuffer, RegionDesc, TransportCounters,
    TransportError, WrId, MAX_PRIVATE_DATA,
};

use state::State;

/// Identifies a pending operation inside one endpoint (also the READ id on the tcp wire).
pub(crate) type OpId = u64;

/// Largest `recv_depth` a connection may ask for (or a peer may announce).
pub(crate) const MAX_RECV_DEPTH: u32 = 1 << 16;
/// Largest `recv_size` a connection may ask for (or a peer may announce): 64 MiB.
pub(crate) const MAX_RECV_SIZE: u32 = 64 << 20;
/// Largest single READ (mem and tcp): 1 GiB.
pub(crate) const MAX_READ_SIZE: u64 = 1 << 30;

/// Why an endpoint died.
#[derive(Debug, Clone)]
pub(crate) enum Death {
    /// Closed by either side, the peer vanished, or an I/O error: reported as `Disconnected`.
    Closed(Detail),
    /// The peer violated the transport's framing: reported as `Malformed`.
    Malformed(String),
}

impl Death {
    pub(crate) fn reason(&self) -> &str {
        match self {
            Death::Closed(d) => d.message(),
            Death::Malformed(r) => r,
        }
    }

    /// Why, with the error behind it (a failed socket read, ..) when there is one.
    pub(crate) fn detail(&self) -> Detail {
        match self {
            Death::Closed(d) => d.clone(),
            Death::Malformed(r) => Detail::new(r.as_str()),
        }
    }

    pub(crate) fn to_error(&self) -> TransportError {
        match self {
            Death::Closed(d) => TransportError::Disconnected(d.clone()),
            Death::Malformed(r) => TransportError::Malformed(r.clone()),
        }
    }
}

type DeathHook = Box<dyn Fn(&Death) + Send + Sync>;

/// One end of a connection, in software. Shared (`Arc`) between the `Connection` object and
/// whatever delivers to it (the peer's `mem` connection, the `tcp` reader and writer tasks).
pub(crate) struct Soft {
    state: Mutex<State>,
    pool: MemPool,
    on_death: OnceLock<DeathHook>,
    /// The endpoint has died (set once, after the state says so): the direct-send path checks
    /// it without the lock.
    dead: AtomicBool,
    /// SENDs begun as direct writes ([`Soft::begin_direct_sends`]). Only the connection's
    /// poster writes it (a load and a store, not an atomic update).
    direct_sends: AtomicU64,
    /// The last [`Soft::poll_completions`] found nothing and left the waker recorded in
    /// `armed_waker` with the state; nothing was queued, and the endpoint has not died, since.
    /// Set under the lock by the poller, cleared under the lock by whatever queues a completion
    /// or kills the endpoint (it then wakes that waker): a poll with the same waker may then
    /// return `Pending` without the lock. A stale `true` is harmless: the wake comes.
    armed: AtomicBool,
    /// The data and vtable pointers of the waker the poller left (see `armed`); written only by
    /// the poller, under the lock.
    armed_waker: [AtomicUsize; 2],
}

impl fmt::Debug for Soft {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Soft").finish_non_exhaustive()
    }
}

/// Checks the parameters a side asks for (sizes, and the setup bounds being positive).
pub(crate) fn validate_params(p: &ConnParams) -> Result<(), TransportError> {
    check_sizes(p.recv_depth, p.recv_size, p.private_data.len()).map_err(TransportError::Handshake)?;
    check_setup_bounds(p).map_err(TransportError::Handshake)
}

/// Checks `handshake_timeout`, `max_pending_handshakes` and `tcp.keepalive` (all backends).
pub(crate) fn check_setup_bounds(p: &ConnParams) -> Result<(), String> {
    if p.handshake_timeout.is_zero() {
        return Err("handshake_timeout must be positive".into());
    }
    if p.max_pending_handshakes == 0 {
        return Err("max_pending_handshakes must be at least 1".into());
    }
    if p.tcp.keepalive.is_some_and(|idle| idle < std::time::Duration::from_secs(1)) {
        return Err("tcp.keepalive must be at least 1 s (the kernel counts whole seconds)".into());
    }
    Ok(())
}

/// Checks sizes announced at setup: depth and size within limits, private data at most 256 bytes.
pub(crate) fn check_sizes(recv_depth: u32, recv_size: u32, private_len: usize) -> Result<(), String> {
    if recv_depth == 0 || recv_depth > MAX_RECV_DEPTH {
        return Err(format!("recv_depth {recv_depth} outside 1..={MAX_RECV_DEPTH}"));
    }
    if recv_size == 0 || recv_size > MAX_RECV_SIZE {
        return Err(format!("recv_size {recv_size} outside 1..={MAX_RECV_SIZE}"));
    }
    if private_len > MAX_PRIVATE_DATA {
        return Err(format!("private data of {private_len} bytes exceeds {MAX_PRIVATE_DATA}"));
    }
    Ok(())
}

impl Soft {
    /// A live endpoint with `recv_depth` receives of `recv_size` bytes already posted.
    pub(crate) fn new(params: &ConnParams) -> Arc<Soft> {
        #[cfg(test)]
        pools_allocated::bump();
        let pool = MemPool::heap(params.pool);
        Arc::new(Soft {
            state: Mutex::new(State::new(params.recv_depth, params.recv_size, &pool)),
            pool,
            on_death: OnceLock::new(),
            dead: AtomicBool::new(false),
            direct_sends: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            armed_waker: [AtomicUsize::new(0), AtomicUsize::new(0)],
        })
    }

    /// The endpoint's memory pool (receives come from it; so should READ destinations).
    pub(crate) fn pool(&self) -> &MemPool {
        &self.pool
    }

    /// Sets the function called (once, outside the lock) when this endpoint dies: the backend
    /// uses it to stop its tasks or to take the peer down too. Only the first call has effect.
    pub(crate) fn set_on_death(&self, hook: impl Fn(&Death) + Send + Sync + 'static) {
        let _ = self.on_death.set(Box::new(hook));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The lock does not poison: a panic while holding it cannot leave the state half-updated
        // in a way that matters more than losing the connection, so the next holder goes on.
        self.state.lock()
    }

    /// Runs `f` on the state, then wakes the completion poller (outside the lock) if `f`
    /// queued a completion or killed the endpoint.
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (result, waker) = {
            let mut st = self.lock();
            let result = f(&mut st);
            let waker = st.take_waker_to_notify();
            if waker.is_some() {
                // Something was queued (or the endpoint died) for the waker the poller left.
                self.armed.store(false, Ordering::Release);
            }
            (result, waker)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        result
    }

    /// Like [`Soft::update`]; a `Death` returned by `f` kills the endpoint (if it is not dead
    /// already) and comes back as the matching error.
    fn update_or_fail<R>(&self, f: impl FnOnce(&mut State) -> Result<R, Death>) -> Result<R, Death> {
        let result = self.update(f);
        if let Err(death) = &result {
            self.fail(death.clone());
        }
        result
    }

    /// Kills the endpoint: posted receives are dropped, pending sends complete with
    /// `Disconnected`, pending READs with `Flushed`; once those are drained the completion queue
    /// reports the error. Idempotent: only the first death counts.
    pub(crate) fn fail(&self, death: Death) {
        let first = self.update(|st| {
            // Set under the lock: whoever learns of the death from the state (a poller woken
            // by it) sees the flag too.
            self.dead.store(true, Ordering::Release);
            st.die(death.clone())
        });
        if first {
            // Memory kept for reuse goes now; buffers in use go when dropped.
            self.pool.close();
            tracing::debug!(reason = death.reason(), "transport endpoint failed");
            if let Some(hook) = self.on_death.get() {
                hook(&death);
            }
        }
    }

    /// Whether the endpoint has died.
    pub(crate) fn is_dead(&self) -> bool {
        self.lock().alive().is_err()
    }

    /// Posts a receive; a message waiting in the overflow queue is delivered into it at once.
    pub(crate) fn post_recv(&self, buf: RecvBuffer) -> Result<(), TransportError> {
        self.update_or_fail(|st| st.post_recv(buf)).map_err(|d| d.to_error())
    }

    /// [`Soft::post_recv`] of every buffer of `bufs` (drained, in order), under one lock.
    pub(crate) fn post_recv_batch(&self, bufs: &mut Vec<RecvBuffer>) -> Result<(), TransportError> {
        if bufs.is_empty() {
            return Ok(());
        }
        self.update_or_fail(|st| crate::take_each(bufs, |buf| st.post_recv(buf))).map_err(|d| d.to_error())
    }

    /// Delivers an incoming message into the next posted receive, or keeps it (counted as
    /// unexpected) until one is posted. A message larger than the receive kills the endpoint.
    /// A dead endpoint refuses the message (`Err` with its death).
    pub(crate) fn deliver(&self, msg: &[u8]) -> Result<(), Death> {
        self.deliver_parts([msg, &[]])
    }

    /// [`Soft::deliver`] of a message in two pieces (a head and a body), copied one after the
    /// other.
    pub(crate) fn deliver_parts(&self, msg: [&[u8]; 2]) -> Result<(), Death> {
        self.update_or_fail(|st| st.deliver(msg))
    }

    /// [`Soft::deliver`] of each message `next` yields, in order, under one lock (and one wake
    /// of the completion poller for all): `next` is called with the lock held, so it must only
    /// look at memory. Stops at the first message that kills the endpoint.
    pub(crate) fn deliver_run<'a>(&self, mut next: impl FnMut() -> Option<&'a [u8]>) -> Result<(), Death> {
        self.update_or_fail(|st| {
            while let Some(msg) = next() {
                st.deliver([msg, &[]])?;
            }
            Ok(())
        })
    }

    /// Takes the next posted receive so that a backend can fill it in place; `None` if none is
    /// posted or the endpoint is dead (then use [`Soft::deliver`]).
    pub(crate) fn take_posted_recv(&self) -> Option<RecvBuffer> {
        self.lock().take_posted_recv()
    }

    /// Queues the receive completion of a buffer taken with [`Soft::take_posted_recv`] and filled.
    pub(crate) fn complete_recv(&self, buf: RecvBuffer) {
        self.update(|st| st.complete_recv(buf))
    }

    /// Records a SEND as pending; `Err` if the endpoint is dead.
    pub(crate) fn begin_send(&self, wr_id: WrId) -> Result<OpId, TransportError> {
        self.update(|st| st.begin_send(wr_id)).map_err(|d| d.to_error())
    }

    /// A SEND that the backend carries out at once (`mem` without a delay): counted as
    /// [`Soft::begin_send`] counts it, carried out by `send` outside the lock, then completed
    /// with `send`'s result, never recorded as pending. `Err` (and `send` not called) if the
    /// endpoint is dead; if it dies meanwhile, the SEND completes as a flushed one does.
    /// With `done`, the completion goes there instead of to the queue `poll_completions` empties
    /// (see `Connection::post_send_batch_reporting`).
    pub(crate) fn send_at_once(
        &self,
        wr_id: WrId,
        send: impl FnOnce() -> Result<(), TransportError>,
        done: Option<&mut Vec<(WrId, Result<(), TransportError>)>>,
    ) -> Result<(), TransportError> {
        self.update(|st| st.begin_send_at_once()).map_err(|d| d.to_error())?;
        let result = send();
        match done {
            Some(done) => done.push((wr_id, self.lock().send_at_once_result(result))),
            None => self.update(|st| st.complete_send_at_once(wr_id, result)),
        }
        Ok(())
    }

    /// Counts `n` SENDs the backend tries to write at once (the tcp direct write): counted as
    /// sent and as direct, not recorded as pending. `Err` if the endpoint is dead. One that is
    /// not written at once after all goes through [`Soft::record_direct_send`]; one written
    /// whole is complete (see [`Soft::complete_direct_send`]).
    /// Takes no lock: only the connection's poster calls it (the poster of a connection is one
    /// task at a time).
    pub(crate) fn begin_direct_sends(&self, n: u64) -> Result<(), TransportError> {
        if self.dead.load(Ordering::Acquire) {
            return self.lock().alive().map_err(|d| d.to_error());
        }
        let begun = self.direct_sends.load(Ordering::Relaxed);
        self.direct_sends.store(begun + n, Ordering::Relaxed);
        Ok(())
    }

    /// A SEND begun with [`Soft::begin_direct_sends`] that goes to the writer after all: recorded
    /// as pending (and no longer counted as direct). `None` if the endpoint died meanwhile: the
    /// SEND then completes as a flushed one does, and the frame must be dropped.
    pub(crate) fn record_direct_send(&self, wr_id: WrId) -> Option<OpId> {
        self.update(|st| st.record_direct_send(wr_id))
    }

    /// A SEND begun with [`Soft::begin_direct_sends`] and written whole: its completion is
    /// queued (as a flushed one if the endpoint died meanwhile).
    pub(crate) fn complete_direct_send(&self, wr_id: WrId) {
        self.update(|st| st.complete_send_at_once(wr_id, Ok(())))
    }

    /// Completes a pending SEND (no effect if it was flushed meanwhile).
    pub(crate) fn complete_send(&self, op: OpId, result: Result<(), TransportError>) {
        self.update(|st| st.complete_send(op, result))
    }

    /// Completes several pending SENDs successfully, in the given order, under one lock.
    pub(crate) fn complete_sends_ok(&self, ops: &[OpId]) {
        self.update(|st| ops.iter().for_each(|&op| st.complete_send(op, Ok(()))))
    }

    /// Records a READ of `remote` into `dst` as pending; `Err` if the endpoint is dead.
    pub(crate) fn begin_read(
        &self,
        wr_id: WrId,
        remote: RegionDesc,
        dst: Buf,
    ) -> Result<OpId, TransportError> {
        self.update(|st| st.begin_read(wr_id, remote, dst)).map_err(|d| d.to_error())
    }

    /// Takes the destination of a pending READ so that it can be filled outside the lock; the
    /// READ stays pending (and is flushed if the endpoint dies meanwhile). `None` for an unknown
    /// id or a destination already taken.
    pub(crate) fn take_read(&self, op: OpId) -> Option<(RegionDesc, Buf)> {
        self.lock().take_read(op)
    }

    /// Completes a pending READ with its filled destination or its error (no effect if it was
    /// flushed meanwhile).
    pub(crate) fn complete_read(&self, op: OpId, result: Result<Buf, ReadError>) {
        self.update(|st| st.complete_read(op, result))
    }

    /// Completes a pending READ by copying `served` (exactly the requested length) into its
    /// destination, outside the lock.
    pub(crate) fn complete_read_from(&self, op: OpId, served: Result<Bytes, ReadError>) {
        let Some((_, mut dst)) = self.take_read(op) else { return };
        let result = served.and_then(|bytes| {
            if bytes.len() == dst.len() {
                dst.copy_from_slice(&bytes);
                Ok(dst)
            } else {
                Err(ReadError::Failed(format!("served {} bytes for a READ of {}", bytes.len(), dst.len())))
            }
        });
        self.complete_read(op, result);
    }

    /// Completes a READ at once with `data` (exactly `remote.len` bytes) that the backend already
    /// holds (tcp: bytes the peer pushed), counted as issued and served from push.
    pub(crate) fn read_at_once(
        &self,
        wr_id: WrId,
        remote: RegionDesc,
        data: Buf,
    ) -> Result<(), TransportError> {
        self.update(|st| st.read_at_once(wr_id, remote, data)).map_err(|d| d.to_error())
    }

    /// Updates counters that only the backend sees (tcp: pushes).
    pub(crate) fn count(&self, f: impl FnOnce(&mut TransportCounters)) {
        f(&mut self.lock().counters)
    }

    /// Registers `data` for remote READ.
    pub(crate) fn register(&self, data: Bytes) -> RegionDesc {
        let mut st = self.lock();
        st.counters.regions_registered += 1;
        st.regions.register(data)
    }

    /// Revokes a key.
    pub(crate) fn deregister(&self, rkey: RKey) -> Result<(), TransportError> {
        let mut st = self.lock();
        if !st.regions.deregister(rkey) {
            return Err(TransportError::UnknownKey(rkey));
        }
        st.counters.regions_revoked += 1;
        Ok(())
    }

    /// Serves a READ the peer issued against this endpoint's regions (size, key and bounds
    /// checked), counting it as served or refused. A dead endpoint serves nothing (`Flushed`).
    pub(crate) fn serve_read(&self, addr: u64, len: u64, rkey: RKey) -> Result<Bytes, ReadError> {
        let mut st = self.lock();
        if st.alive().is_err() {
            return Err(ReadError::Flushed);
        }
        let result = if len > MAX_READ_SIZE {
            Err(ReadError::Failed(format!("READ of {len} bytes exceeds max_read_size {MAX_READ_SIZE}")))
        } else {
            st.regions.read(addr, len, rkey)
        };
        match &result {
            Ok(_) => st.counters.reads_served += 1,
            Err(_) => st.counters.reads_refused += 1,
        }
        result
    }

    /// Moves up to `max` completions into `out` (see [`crate::Connection::poll_completions`]).
    ///
    /// A poll that finds nothing leaves its waker; the next poll with the same waker, if
    /// nothing came meanwhile, returns `Pending` without the lock (`armed`).
    pub(crate) fn poll_completions(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Poll<Result<(), TransportError>> {
        if max > 0 && self.is_armed(cx.waker()) {
            return Poll::Pending;
        }
        let mut st = self.lock();
        let polled = st.poll_completions(cx, out, max);
        if polled.is_pending() {
            self.note_armed(cx.waker());
        }
        polled
    }

    /// Arms the queue for `waker` if nothing is queued (see [`crate::Connection::arm`]): what a
    /// poll that finds nothing does, without taking anything.
    pub(crate) fn arm(&self, waker: &Waker) -> bool {
        if self.is_armed(waker) {
            return true;
        }
        let mut st = self.lock();
        if !st.leave_waker_if_empty(waker) {
            return false;
        }
        self.note_armed(waker);
        true
    }

    /// The last poll (or arming) left `waker` with the state, and nothing was queued (nor did
    /// the endpoint die) since.
    fn is_armed(&self, waker: &Waker) -> bool {
        let id = waker_id(waker);
        self.armed.load(Ordering::Acquire)
            && self.armed_waker[0].load(Ordering::Relaxed) == id[0]
            && self.armed_waker[1].load(Ordering::Relaxed) == id[1]
    }

    /// Records that `waker` was left with the state (under its lock).
    fn note_armed(&self, waker: &Waker) {
        let id = waker_id(waker);
        self.armed_waker[0].store(id[0], Ordering::Relaxed);
        self.armed_waker[1].store(id[1], Ordering::Relaxed);
        self.armed.store(true, Ordering::Release);
    }

    pub(crate) fn counters(&self) -> TransportCounters {
        let st = self.lock();
        let mut counters = st.counters;
        // Read under the lock: a direct SEND queued (counted in the state) was begun before.
        let direct = self.direct_sends.load(Ordering::Relaxed);
        counters.sends += direct;
        counters.sends_direct += direct.saturating_sub(st.direct_sends_queued);
        counters
    }
}

/// What tells two wakers apart, as [`Waker::will_wake`] does: their data and vtable pointers.
fn waker_id(waker: &Waker) -> [usize; 2] {
    [waker.data() as usize, std::ptr::from_ref(waker.vtable()) as usize]
}

/// Test-only count of receive pools allocated ([`Soft::new`]) on the current thread: the tests
/// of the tcp handshake run on a current-thread runtime, so every task they spawn counts here.
#[cfg(test)]
pub(crate) mod pools_allocated {
    use std::cell::Cell;

    thread_local! {
        static COUNT: Cell<u64> = const { Cell::new(0) };
    }

    pub(crate) fn bump() {
        COUNT.with(|c| c.set(c.get() + 1));
    }

    /// Pools allocated on this thread so far.
    pub(crate) fn get() -> u64 {
        COUNT.with(Cell::get)
    }
}

#[cfg(test)]
mod tests;

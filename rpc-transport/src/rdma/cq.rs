//! Our asynchronous completion-queue poller.
//!
//! One basic CQ per connection with its own completion channel, whose fd is non-blocking and
//! registered with tokio ([`AsyncFd`]). [`CqPoller::poll`] does, in order:
//!
//! 1. poll the CQ (at most `budget` completions: bounded work per wake-up), unless it is armed
//!    and was found empty since the arming (then any completion since raised an event, and
//!    looking would find nothing), or the previous poll's look emptied it (then arm first and
//!    look once after). A poll of an empty CQ is not free: a lock and a call into the provider,
//!    several times per call when every round of the driver looked;
//! 2. if that found nothing and the busy-poll window ([`RdmaConfig::busy_poll`]) is open, wake our
//!    own task and return `Pending`: the runtime runs every other ready task (the caller, the
//!    handler: whose work ends the wait) and polls us again at once. The window opens at the
//!    first empty poll after a completion and closes `busy_poll` later: we spin while
//!    completions keep coming, and sleep on the channel when they stop. Never blocking the
//!    thread is what makes spinning pay on a current-thread runtime;
//! 3. if the CQ is not armed: `ibv_req_notify_cq`, then **poll once more** (a completion that
//!    landed between the empty poll and the arming raises no event);
//! 4. wait for the channel fd: on readiness go back to 1 (the CQ is disarmed again: an armed CQ
//!    raises one event). What the event announced is handed on first; the event is taken
//!    (`ibv_get_cq_event`, a read; the channel is this CQ's alone) and the CQ armed (a system
//!    call on rxe) only when a look finds nothing more, after the request a response answers
//!    has gone out. In the VM, arming before the look cost a 32 B round trip about 6%. Events
//!    are acknowledged in batches (`ibv_ack_cq_events`). The fd's readiness is cleared as it is
//!    seen (the event it announces is then taken before the CQ is armed again), so that an
//!    event the arming raises is never cleared unseen.
//!
//! No timer papers over a missed wake-up: the arm-then-poll order makes one impossible. All taken
//! events are acknowledged before the CQ can be destroyed (in `Drop`), as `ibv_destroy_cq` would
//! otherwise block forever.

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};

use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel};
use sideway::ibverbs::device_context::DeviceContext;
use tokio::io::unix::AsyncFd;

use super::config::RdmaConfig;
use super::error::{chain, verbs};
use super::sys::{self, WorkCompletion};
use crate::busy_window::BusyWindow;
use crate::TransportError;

/// Events acknowledged together (acking takes a mutex in libibverbs).
const ACK_BATCH: u32 = 16;
/// Completions taken per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// A CQ with its completion channel, polled asynchronously.
pub(crate) struct CqPoller {
    cq: Arc<BasicCompletionQueue>,
    channel: AsyncFd<Arc<CompletionChannel>>,
    armed: bool,
    /// The CQ may hold completions that no event will announce (it was not armed when they
    /// landed, or the last look stopped at its budget): look before waiting on the channel.
    /// False only while armed and found empty since the arming.
    must_drain: bool,
    /// The last poll's look returned completions and found the CQ empty after them: the next
    /// poll arms (or spins) before looking, instead of spending a look that would find the CQ
    /// empty again.
    emptied: bool,
    unacked: u32,
    /// The channel's readiness woke us and its event is not taken yet (it is taken, and the
    /// readiness cleared, before the next arming).
    ready_untaken: bool,
    wcs: Vec<WorkCompletion>,
    /// The busy-poll window ([`RdmaConfig::busy_poll`]); its spins are polls that found nothing
    /// inside a window.
    busy: BusyWindow,
}

impl std::fmt::Debug for CqPoller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqPoller").field("armed", &self.armed).field("unacked", &self.unacked).finish()
    }
}

impl CqPoller {
    /// Creates a CQ of `cqe` entries with a fresh non-blocking completion channel.
    pub(crate) fn new(ctx: &Arc<DeviceContext>, cqe: u32, cfg: &RdmaConfig) -> Result<Self, TransportError> {
        let channel = ctx.create_comp_channel().map_err(|e| verbs("ibv_create_comp_channel", chain(&e)))?;
        channel.set_nonblocking(true).map_err(|e| verbs("fcntl(comp channel)", e))?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(cqe)
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| verbs("ibv_create_cq", chain(&e)))?;
        let channel = sys::register_readable(channel)?;
        Ok(CqPoller {
            cq,
            channel,
            armed: false,
            must_drain: true,
            emptied: false,
            unacked: 0,
            ready_untaken: false,
            wcs: vec![sys::empty_wc(); POLL_BATCH],
            busy: BusyWindow::new(cfg.busy_poll),
        })
    }

    /// The CQ, to attach a QP to.
    pub(crate) fn cq(&self) -> &Arc<BasicCompletionQueue> {
        &self.cq
    }

    /// Hands up to `budget` completions to `on_wc`. `Ready(Ok(n))` with `n > 0` when some were
    /// handled; `Pending` (channel armed, waker registered) when the CQ is empty.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        budget: usize,
        mut on_wc: impl FnMut(&WorkCompletion),
    ) -> Poll<io::Result<usize>> {
        let budget = budget.max(1);
        // The last look emptied the CQ (and returned what it found): arm before looking again,
        // not after an empty look (see `emptied`).
        let mut skip_look = std::mem::take(&mut self.emptied);
        loop {
            if self.must_drain && !skip_look {
                let n = self.drain(budget, &mut on_wc)?;
                if n < budget && self.armed {
                    // Empty at the end of this look, and armed since before it: whatever lands
                    // next raises an event.
                    self.must_drain = false;
                }
                if n > 0 {
                    // Completions keep coming: the next empty poll opens a new window.
                    self.busy.arrived();
                    self.emptied = n < budget;
                    return Poll::Ready(Ok(n));
                }
            }
            skip_look = false;
            if !self.armed {
                if self.busy.spin() {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                if self.ready_untaken {
                    // Found nothing more: now is the time to take the event that woke us.
                    self.take_event()?;
                }
                self.arm()?;
                continue; // poll once more: closes the poll/arm race
            }
            match self.channel.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(mut guard)) => {
                    // Look first; take the event (a read) and arm (a system call on rxe) only
                    // once the look finds nothing more: what the event announced is handed on
                    // before either is paid. An armed CQ raises one event and is then disarmed
                    // until we arm it again, so the channel holds at most this one meanwhile,
                    // and no other comes before the arming: the readiness is cleared now (no
                    // second look at it to take the event), and an event the arming raises sets
                    // it again.
                    guard.clear_ready();
                    self.ready_untaken = true;
                    self.armed = false;
                    self.must_drain = true;
                }
            }
        }
    }

    /// Takes the event whose readiness woke us (if there is one: a spurious readiness has
    /// none); the readiness was cleared when it was seen. The channel serves this CQ alone and
    /// an armed CQ raises one event: after taking it the channel holds no other until we arm
    /// again, so no second read looks for EAGAIN (a system call per wake-up).
    #[inline(never)] // off the spinning path: keeps `poll` small
    fn take_event(&mut self) -> io::Result<()> {
        self.ready_untaken = false;
        let event = sys::get_cq_event(self.channel.get_ref())?;
        if event {
            self.unacked += 1;
            if self.unacked >= ACK_BATCH {
                self.ack_events();
            }
        }
        Ok(())
    }

    /// Requests an event for the next completion; the CQ must then be looked at once more.
    fn arm(&mut self) -> io::Result<()> {
        sys::req_notify_cq(&self.cq)?;
        self.armed = true;
        self.must_drain = true;
        Ok(())
    }

    /// Polls the CQ until it is empty or `budget` completions were handled.
    fn drain(&mut self, budget: usize, on_wc: &mut impl FnMut(&WorkCompletion)) -> io::Result<usize> {
        let mut handled = 0;
        while handled < budget {
            let want = (budget - handled).min(self.wcs.len());
            let n = sys::poll_cq(&self.cq, &mut self.wcs[..want])?;
            for wc in &self.wcs[..n] {
                on_wc(wc);
            }
            handled += n;
            if n < want {
                break;
            }
        }
        Ok(handled)
    }

    /// Empty polls spent inside busy-poll windows since creation.
    pub(crate) fn spins(&self) -> u64 {
        self.busy.spins()
    }

    fn ack_events(&mut self) {
        sys::ack_cq_events(&self.cq, self.unacked);
        self.unacked = 0;
    }
}

impl Drop for CqPoller {
    fn drop(&mut self) {
        // Every event taken must be acknowledged before ibv_destroy_cq, or it blocks forever.
        self.ack_events();
    }
}

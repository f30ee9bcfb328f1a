//! Our asynchronous completion-queue poller.
//!
//! One basic CQ per connection with its own completion channel, whose fd is non-blocking and
//! registered with tokio ([`AsyncFd`]). [`CqPoller::poll`] does, in order:
//!
//! 1. poll the CQ (at most `budget` completions: bounded work per wake-up);
//! 2. if that found nothing: optionally busy-poll for [`RdmaConfig::busy_poll`];
//! 3. if the CQ is not armed: `ibv_req_notify_cq`, then **poll once more** (a completion that
//!    landed between the empty poll and the arming raises no event);
//! 4. wait for the channel fd: on readiness take every event (`ibv_get_cq_event`), acknowledge them
//!    in batches (`ibv_ack_cq_events`), and go back to 1 (the CQ is disarmed again).
//!
//! No timer papers over a missed wake-up: the arm-then-poll order makes one impossible. All taken
//! events are acknowledged before the CQ can be destroyed (in `Drop`), as `ibv_destroy_cq` would
//! otherwise block forever.

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel};
use sideway::ibverbs::device_context::DeviceContext;
use tokio::io::unix::AsyncFd;

use super::config::RdmaConfig;
use super::error::{chain, verbs};
use super::sys::{self, WorkCompletion};
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
    unacked: u32,
    wcs: Vec<WorkCompletion>,
    busy_poll: Duration,
    skip_busy_poll: bool,
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
            unacked: 0,
            wcs: vec![sys::empty_wc(); POLL_BATCH],
            busy_poll: cfg.busy_poll,
            skip_busy_poll: false,
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
        loop {
            let n = self.drain(budget, &mut on_wc)?;
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            if let Some(n) = self.busy_poll(budget, &mut on_wc)? {
                return Poll::Ready(Ok(n));
            }
            if !self.armed {
                sys::req_notify_cq(&self.cq)?;
                self.armed = true;
                continue; // poll once more: closes the poll/arm race
            }
            match self.channel.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(mut guard)) => {
                    loop {
                        if sys::get_cq_event(guard.get_inner())? {
                            self.unacked += 1;
                            self.armed = false;
                        } else {
                            guard.clear_ready();
                            break;
                        }
                    }
                    if self.unacked >= ACK_BATCH {
                        self.ack_events();
                    }
                    // A wake-up through the channel: the busy-poll window may pay off again.
                    self.skip_busy_poll = false;
                }
            }
        }
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

    /// The optional busy-poll window: `Some(n)` if it found completions.
    fn busy_poll(
        &mut self,
        budget: usize,
        on_wc: &mut impl FnMut(&WorkCompletion),
    ) -> io::Result<Option<usize>> {
        if self.busy_poll.is_zero() || self.skip_busy_poll {
            return Ok(None);
        }
        let start = Instant::now();
        while start.elapsed() < self.busy_poll {
            let n = self.drain(budget, on_wc)?;
            if n > 0 {
                return Ok(Some(n));
            }
            std::hint::spin_loop();
        }
        // Nothing came within the window: don't spin again until an event wakes us.
        self.skip_busy_poll = true;
        Ok(None)
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

//! A look at the socket right after a SEND whose write took long: the peer has likely answered.
//!
//! Between two processes on one CPU, writing a request wakes the peer, and the scheduler often
//! runs it inside our write: it reads the request, answers it, and only when it waits again does
//! our write return, with the answer already in our socket. The runtime learns of that answer
//! only when it next waits for I/O (an `epoll_wait` that returns at once, then the I/O driver's
//! turn) and then wakes the reader. A look instead wakes the reader as the SEND goes out, and the
//! reader reads the socket once whatever the runtime's readiness says: the answer is read
//! without that wait.
//!
//! A look that finds nothing costs a `recv` system call, so a SEND is followed by one only when
//! its write took at least [`SLOW_FACTOR`] times the fastest write of the last [`WINDOW`] SENDs
//! (timed with [`stamp`]: only ratios count, so no unit is needed): a write that long had the
//! peer (or something) run inside it. Measured on a 2-vCPU KVM guest with both processes on one
//! vCPU (BENCHMARKS.md, session 63): writes that returned with the answer waiting took 10.5 us or
//! more, the others 4 to 8 us; the rule looked after 43% of SENDs, and 99.7% of its looks found
//! the answer. A write slowed by something else (another process run in it, a wake-up across
//! CPUs) makes a look that misses; when a window's looks miss more than they find, looks pause
//! for one window, then two, four, up to [`MAX_PAUSE`] windows, and the pause ends with the first
//! window whose looks mostly find. A peer on another CPU or host never answers within a write:
//! there the pauses hold the looks to a few in a hundred SENDs (6% with the server on the other
//! vCPU of that guest), each a `recv` against a round trip of tens of microseconds.
//!
//! Reading behind the runtime's readiness is sound with its edge-triggered registration: bytes
//! that arrive later raise a new edge, and an edge whose bytes a look took is neither reported
//! by `epoll_wait` (which checks a queued edge's socket for what its registration asked about:
//! readable only, see `halves.rs`; with writable asked too, as tokio's `TcpStream` asks, it was
//! reported, and a wait after a found look returned at once) nor acted on by the reader beyond
//! one read that finds nothing and waits again.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
#[cfg(not(target_arch = "x86_64"))]
use std::{sync::OnceLock, time::Instant};

use super::halves::ReadHalf;
use crate::busy_window::BusyWindow;
use futures::task::AtomicWaker;
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};

/// A SEND whose write took this many times the window's fastest is followed by a look.
pub(crate) const SLOW_FACTOR: u64 = 2;
/// SENDs over which the fastest write is taken (and looks' outcomes weighed).
pub(crate) const WINDOW: u32 = 256;
/// The longest pause of looks, in windows, after windows whose looks mostly missed.
pub(crate) const MAX_PAUSE: u32 = 64;

/// A reading of a fast clock, in a unit of its own: only ratios of differences between readings
/// are used. On x86_64 the time-stamp counter (tens of cycles, no conversion: two readings and
/// their difference cost ~10 instructions, against ~110 for `Instant::now` twice and
/// `elapsed`); elsewhere nanoseconds of the monotonic clock.
#[inline]
pub(crate) fn stamp() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86_64 CPU; it reads the time-stamp counter into
        // registers and touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What the sending side and the reader task share.
#[derive(Debug, Default)]
pub(crate) struct ReadAfterSend {
    /// The reader should look at the socket at its next poll.
    asked: AtomicBool,
    /// The reader task, while it waits for the socket.
    reader: AtomicWaker,
    /// Wakers an ask took from `reader`: the reader leaves its waker again when this moved since
    /// it last left it (an ask may take a waker left after the ask raised its flag).
    taken: AtomicU64,
    /// Looks made, and those that found bytes (or the end of the stream, or its error).
    looks: AtomicU64,
    found: AtomicU64,
    /// The reader's busy-poll spins (published by the reader, its only writer).
    spins: AtomicU64,
}

impl ReadAfterSend {
    /// Asks the reader for a look at its next poll, and wakes it if it waits.
    pub(crate) fn ask(&self) {
        if self.raise() {
            self.wake_reader();
        }
    }

    /// Raises the flag for a look; true if it was down.
    fn raise(&self) -> bool {
        !self.asked.swap(true, Ordering::AcqRel)
    }

    /// Takes the reader's waker, if left, and wakes it. On a runtime with several threads the
    /// reader may run between [`raise`](Self::raise) and this: it then makes the look, leaves its
    /// waker again, and this takes that one; `taken` tells the reader so, at the poll this wake
    /// causes.
    fn wake_reader(&self) {
        if let Some(waker) = self.reader.take() {
            self.taken.fetch_add(1, Ordering::Release);
            waker.wake();
        }
    }

    /// Takes the request for a look.
    fn take_ask(&self) -> bool {
        self.asked.load(Ordering::Relaxed) && self.asked.swap(false, Ordering::AcqRel)
    }

    fn record(&self, found: bool) {
        self.looks.fetch_add(1, Ordering::Relaxed);
        if found {
            self.found.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Looks made, and those that found bytes.
    pub(crate) fn looks(&self) -> (u64, u64) {
        (self.looks.load(Ordering::Relaxed), self.found.load(Ordering::Relaxed))
    }

    /// Reads the reader made inside busy-poll windows that found nothing.
    pub(crate) fn spins(&self) -> u64 {
        self.spins.load(Ordering::Relaxed)
    }
}

/// When a SEND is followed by a look: the sending side's state, owned by the connection (no I/O,
/// no clock: it is told how long each write took, in [`stamp`]'s unit).
#[derive(Debug)]
pub(crate) struct LookPolicy {
    enabled: bool,
    /// The fastest write of the last full window (`None` before the first).
    floor: Option<u64>,
    /// The fastest write of this window so far.
    window_min: u64,
    /// SENDs in this window so far.
    window_sends: u32,
    /// The shared counters `(looks, found)` when this window began.
    window_start: (u64, u64),
    /// Windows left in the current pause of looks, and the length of the next pause.
    paused: u32,
    next_pause: u32,
}

impl LookPolicy {
    pub(crate) fn new(enabled: bool) -> Self {
        LookPolicy {
            enabled,
            floor: None,
            window_min: u64::MAX,
            window_sends: 0,
            window_start: (0, 0),
            paused: 0,
            next_pause: 1,
        }
    }

    /// A SEND's write returned after `took`: asks `shared`'s reader for a look if the rule says so.
    /// Returns whether it did.
    pub(crate) fn after_send(&mut self, took: u64, shared: &ReadAfterSend) -> bool {
        if !self.enabled {
            return false;
        }
        self.window_min = self.window_min.min(took);
        self.window_sends += 1;
        if self.window_sends == WINDOW {
            // The window's last SEND makes no look: the window's looks are all weighed.
            self.end_window(shared.looks());
            return false;
        }
        let look =
            self.paused == 0 && self.floor.is_some_and(|floor| took >= floor.saturating_mul(SLOW_FACTOR));
        if look {
            shared.ask();
        }
        look
    }

    /// A window of SENDs ended: its fastest write becomes the floor, and its looks' outcome sets
    /// the pause.
    fn end_window(&mut self, (looks, found): (u64, u64)) {
        self.floor = Some(self.window_min);
        let (window_looks, window_found) = (looks - self.window_start.0, found - self.window_start.1);
        if self.paused > 0 {
            self.paused -= 1;
        } else if window_found * 2 < window_looks {
            self.paused = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
        } else if window_looks > 0 {
            self.next_pause = 1;
        }
        self.window_min = u64::MAX;
        self.window_sends = 0;
        self.window_start = (looks, found);
    }
}

/// The reader task's side of the socket: reads as the runtime's readiness says, and once
/// whatever it says when a SEND asked for a look, or at each poll of a busy-poll window
/// ([`crate::TcpSettings::busy_poll`]: an empty read inside one wakes the task again at once).
#[derive(Debug)]
pub(crate) struct LookingReader {
    half: ReadHalf,
    shared: Arc<ReadAfterSend>,
    /// The busy-poll window (`None`: none set).
    busy: Option<BusyWindow>,
    /// The last poll found nothing inside a busy-poll window: this one reads the socket.
    spun: bool,
    /// The waker last left in `shared`, and `shared.taken` read just before: left again only
    /// when the waker changes or an ask took one since, not at every poll (two atomic updates
    /// each).
    left: Option<(Waker, u64)>,
}

impl LookingReader {
    pub(crate) fn new(half: ReadHalf, shared: Arc<ReadAfterSend>, busy_poll: Duration) -> Self {
        let busy = (!busy_poll.is_zero()).then(|| BusyWindow::new(busy_poll));
        LookingReader { half, shared, busy, spun: false, left: None }
    }
}

impl AsyncRead for LookingReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let asked = me.shared.take_ask();
        if asked {
            // The ask takes the waker left in `shared` (now or in a moment): leave it again.
            me.left = None;
        }
        if asked || me.spun {
            me.spun = false;
            // The socket is non-blocking: this read returns at once.
            let read = me.half.read_now(buf.initialize_unfilled());
            // A look that ends the stream (its end, or an error) found what there was.
            let found = !matches!(&read, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted));
            if asked {
                me.shared.record(found);
            }
            match read {
                Ok(n) => {
                    if let Some(busy) = &mut me.busy {
                        busy.arrived();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        // Left before the readiness poll: an ask after it wakes this task.
        let taken = me.shared.taken.load(Ordering::Acquire);
        if !me.left.as_ref().is_some_and(|(w, at)| *at == taken && w.will_wake(cx.waker())) {
            me.shared.reader.register(cx.waker());
            me.left = Some((cx.waker().clone(), taken));
        }
        let read = Pin::new(&mut me.half).poll_read(cx, buf);
        if let Some(busy) = &mut me.busy {
            match read {
                Poll::Ready(_) => busy.arrived(),
                // Nothing yet: inside a busy-poll window, the task runs again at once (after
                // the runtime's other ready tasks) and reads the socket then.
                Poll::Pending if busy.spin() => {
                    me.spun = true;
                    me.shared.spins.store(busy.spins(), Ordering::Relaxed);
                    cx.waker().wake_by_ref();
                }
                Poll::Pending => {}
            }
        }
        read
    }
}

#[cfg(test)]
#[path = "read_after_send_tests.rs"]
mod tests;

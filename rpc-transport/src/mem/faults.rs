//! Fault injection for the in-process fabric.

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::soft::{Death, Soft};

/// Faults to inject into every connection made through one listener name of a
/// [`MemFabric`](super::MemFabric).
///
/// Obtained with [`faults`](super::faults) (global fabric) or
/// [`MemFabric::faults`](super::MemFabric::faults); the same plan is shared by all connections
/// of that name, those that exist already and those made later, and may be changed at any time.
/// Every knob acts on operations posted after it is set.
#[derive(Debug, Default)]
pub struct FaultPlan {
    delay_nanos: AtomicU64,
    fail_next: AtomicU64,
    fail_reads: AtomicBool,
    corrupt_next: AtomicU64,
    black_hole: AtomicBool,
    send_stall_nanos: AtomicU64,
    /// Both ends of every connection made under this name, to kill them.
    links: Mutex<Vec<(Weak<Soft>, Weak<Soft>)>>,
}

/// What happens to one posted SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendFault {
    /// Delivered intact.
    None,
    /// Not delivered; the send completes with `Err(Injected)`.
    Fail,
    /// Delivered with bytes flipped.
    Corrupt,
}

impl FaultPlan {
    /// Kills every connection currently made under this name, both ends at once, as if the peer
    /// process died: pending operations are flushed with errors and `poll_completions` then
    /// returns `Disconnected`. Connections made afterwards are not affected.
    pub fn kill(&self) {
        let links = std::mem::take(&mut *self.lock_links());
        tracing::debug!(connections = links.len(), "fault plan: kill");
        for (a, b) in links {
            for end in [a, b].iter().filter_map(Weak::upgrade) {
                end.fail(Death::Closed("killed by fault injection".into()));
            }
        }
    }

    /// Delays every completion (both the SEND's own and the peer's receive, and READs) by
    /// `delay` from the moment the operation is posted. Order is preserved. Needs a tokio
    /// runtime at post time; `Duration::ZERO` turns the delay off.
    pub fn set_completion_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.delay_nanos.store(nanos, Ordering::Relaxed);
    }

    /// The next `n` SENDs complete with `Err(TransportError::Injected)`; their message is not
    /// delivered.
    pub fn fail_next_completions(&self, n: u64) {
        self.fail_next.store(n, Ordering::Relaxed);
    }

    /// While `true`, every READ completes with `ReadError::Failed("injected")` and the peer's
    /// memory is not read. Unlike a READ the peer refuses (bad key, out of bounds, revoked),
    /// which closes the connection as on verbs, an injected failure leaves it up.
    pub fn fail_reads(&self, fail: bool) {
        self.fail_reads.store(fail, Ordering::Relaxed);
    }

    /// The next `n` delivered messages arrive corrupted: their first 8 bytes (fewer for a
    /// shorter message; a 0-byte message is unchanged) are XORed with `0xA5`.
    pub fn corrupt_next_frames(&self, n: u64) {
        self.corrupt_next.store(n, Ordering::Relaxed);
    }

    /// Makes every connection of this name go silent, as if the peer's host vanished without a
    /// FIN: every SEND and READ posted afterwards, in either direction, silently vanishes. It is
    /// not delivered (a READ does not touch the peer's memory), it never completes, and nothing
    /// dies: the connections stay up, and the swallowed operations complete (flushed) only when
    /// a connection is closed or killed. For keepalive and idle-timeout tests.
    /// Same as `set_black_hole(true)`.
    pub fn black_hole(&self) {
        self.set_black_hole(true);
    }

    /// Turns the black hole of [`FaultPlan::black_hole`] on or off. Turning it off affects
    /// operations posted afterwards only: those swallowed stay lost (pending until the
    /// connection dies).
    pub fn set_black_hole(&self, on: bool) {
        self.black_hole.store(on, Ordering::Relaxed);
    }

    /// Makes every SEND block the thread that posts it for `stall`, inside the post, before the
    /// message is handed over: as a slow send system call does, or a thread the kernel takes off
    /// its CPU there (a peer the send woke on the same CPU running first). For tests of what a
    /// driver counts against the work it did before posting. `Duration::ZERO` turns it off.
    pub fn set_send_stall(&self, stall: Duration) {
        let nanos = u64::try_from(stall.as_nanos()).unwrap_or(u64::MAX);
        self.send_stall_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Turns every knob off (no delay, no failures, no corruption, no black hole, no send
    /// stall). Does not revive anything, nor deliver what the black hole swallowed.
    pub fn clear(&self) {
        self.set_completion_delay(Duration::ZERO);
        self.set_send_stall(Duration::ZERO);
        self.fail_next_completions(0);
        self.fail_reads(false);
        self.corrupt_next_frames(0);
        self.set_black_hole(false);
    }

    pub(crate) fn black_holed(&self) -> bool {
        self.black_hole.load(Ordering::Relaxed)
    }

    pub(crate) fn completion_delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }

    /// Blocks this thread for the send stall, if one is set ([`FaultPlan::set_send_stall`]).
    pub(crate) fn stall_send(&self) {
        let nanos = self.send_stall_nanos.load(Ordering::Relaxed);
        if nanos != 0 {
            std::thread::sleep(Duration::from_nanos(nanos));
        }
    }

    pub(crate) fn reads_fail(&self) -> bool {
        self.fail_reads.load(Ordering::Relaxed)
    }

    /// Decides the fate of the next SEND, consuming one count of a knob. A failed SEND is not
    /// delivered, so it does not use up a corruption.
    pub(crate) fn next_send_fault(&self) -> SendFault {
        if take_one(&self.fail_next) {
            SendFault::Fail
        } else if take_one(&self.corrupt_next) {
            SendFault::Corrupt
        } else {
            SendFault::None
        }
    }

    /// Remembers a new connection's two ends (forgetting connections that are gone).
    pub(crate) fn track(&self, a: &Arc<Soft>, b: &Arc<Soft>) {
        let mut links = self.lock_links();
        links.retain(|(a, b)| a.strong_count() > 0 || b.strong_count() > 0);
        links.push((Arc::downgrade(a), Arc::downgrade(b)));
    }

    fn lock_links(&self) -> MutexGuard<'_, Vec<(Weak<Soft>, Weak<Soft>)>> {
        self.links.lock()
    }
}

/// Decrements `counter` if it is positive; `true` if it did.
fn take_one(counter: &AtomicU64) -> bool {
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
}

/// The corrupted form of a message: first 8 bytes XORed with `0xA5`.
pub(crate) fn corrupt(msg: [&[u8]; 2]) -> Vec<u8> {
    let mut bytes = msg.concat();
    bytes.iter_mut().take(8).for_each(|b| *b ^= 0xA5);
    bytes
}

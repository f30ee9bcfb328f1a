//! Rendezvous budgets: the bytes a connection (and a whole endpoint) holds for large payloads.
//!
//! Two kinds of bytes count, on both roles: READ destinations from the moment their READ is
//! issued until its completion returns (a cancelled call's READ included), and our own regions
//! advertised to the peer until it reports the READ done (or the connection dies).
//!
//! A READ is issued only when its destination fits the budget; otherwise it waits in the
//! connection's READ queue (bounded by its calls in flight). A single payload larger than the
//! budget proceeds alone: when nothing else is held it always fits, so no payload up to
//! `max_message_size` can be starved. Our own advertised regions are counted but never wait:
//! their bytes exist already; the server instead stops starting handlers while the budget is
//! spent (see [`ServerProto::may_start_handler`](super::ServerProto::may_start_handler)).

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

/// A budget shared by every connection of one endpoint (a server's `max_rendezvous_bytes`).
///
/// Thread-safe. A connection that finds it spent registers its driver's waker with
/// [`SharedBudget::register_waker`] and polls again; every release wakes the waiting drivers.
#[derive(Debug)]
pub struct SharedBudget {
    limit: u64,
    inner: Mutex<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    held: u64,
    peak: u64,
    waiters: Vec<Waker>,
}

impl SharedBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<SharedBudget> {
        Arc::new(SharedBudget { limit, inner: Mutex::new(Shared::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.lock().held
    }

    /// The most bytes ever held at once.
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// Whether anything is left (new handlers may start).
    pub fn has_room(&self) -> bool {
        self.lock().held < self.limit
    }

    /// Takes `len` bytes if they fit, or if nothing is held (one payload proceeds alone).
    pub(crate) fn try_reserve(&self, len: u64) -> bool {
        let mut s = self.lock();
        if s.held != 0 && s.held.saturating_add(len) > self.limit {
            return false;
        }
        s.held = s.held.saturating_add(len);
        s.peak = s.peak.max(s.held);
        true
    }

    /// Takes `len` bytes whatever is held (bytes that exist already: our advertised regions).
    pub(crate) fn force_reserve(&self, len: u64) {
        let mut s = self.lock();
        s.held = s.held.saturating_add(len);
        s.peak = s.peak.max(s.held);
    }

    /// Gives back `len` bytes and wakes every waiting driver.
    pub(crate) fn release(&self, len: u64) {
        let waiters = {
            let mut s = self.lock();
            s.held = s.held.saturating_sub(len);
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Wakes `waker` at the next release. Register first, then try again: a release between
    /// the failed attempt and the registration is then not missed.
    pub fn register_waker(&self, waker: &Waker) {
        let mut s = self.lock();
        if !s.waiters.iter().any(|w| w.will_wake(waker)) {
            s.waiters.push(waker.clone());
        }
    }
}

/// One connection's budget, plus its share of the endpoint's.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    held: u64,
    peak: u64,
    shared: Option<Arc<SharedBudget>>,
    /// The last reservation failed on the shared budget (not on our own).
    blocked_on_shared: bool,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { limit, held: 0, peak: 0, shared: None, blocked_on_shared: false }
    }

    pub fn set_shared(&mut self, shared: Arc<SharedBudget>) {
        self.shared = Some(shared);
    }

    pub fn held(&self) -> u64 {
        self.held
    }

    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Room left on this connection and on the endpoint: may a new handler start?
    pub fn has_room(&mut self) -> bool {
        if self.held >= self.limit {
            self.blocked_on_shared = false;
            return false;
        }
        let shared_room = self.shared.as_ref().is_none_or(|s| s.has_room());
        self.blocked_on_shared = !shared_room;
        shared_room
    }

    /// Takes `len` bytes for a READ destination if they fit (see the module docs).
    pub fn try_reserve(&mut self, len: u64) -> bool {
        if self.held != 0 && self.held.saturating_add(len) > self.limit {
            self.blocked_on_shared = false;
            return false;
        }
        if let Some(shared) = &self.shared {
            if !shared.try_reserve(len) {
                self.blocked_on_shared = true;
                return false;
            }
        }
        self.blocked_on_shared = false;
        self.add(len);
        true
    }

    /// Counts `len` bytes of our own advertised region.
    pub fn force_reserve(&mut self, len: u64) {
        if let Some(shared) = &self.shared {
            shared.force_reserve(len);
        }
        self.add(len);
    }

    fn add(&mut self, len: u64) {
        self.held = self.held.saturating_add(len);
        self.peak = self.peak.max(self.held);
    }

    pub fn release(&mut self, len: u64) {
        let len = len.min(self.held);
        self.held -= len;
        if let Some(shared) = &self.shared {
            shared.release(len);
        }
    }

    /// The endpoint's budget, when the last attempt failed on it: the driver registers its
    /// waker there.
    pub fn blocked_on(&self) -> Option<&Arc<SharedBudget>> {
        self.shared.as_ref().filter(|_| self.blocked_on_shared)
    }
}

impl Drop for Budget {
    /// A connection that ends gives back to the endpoint whatever it still held: its regions
    /// and READ destinations go with the transport connection.
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.release(self.held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_payload_larger_than_the_budget_proceeds_alone() {
        let mut b = Budget::new(100);
        assert!(b.try_reserve(1000), "nothing held: a large payload proceeds");
        assert!(!b.try_reserve(1), "nothing else while it is held");
        b.release(1000);
        assert!(b.try_reserve(60));
        assert!(b.try_reserve(40));
        assert!(!b.try_reserve(1));
        assert_eq!(b.peak(), 1000);
    }

    #[test]
    fn the_shared_budget_bounds_all_connections_and_is_given_back_on_drop() {
        let shared = SharedBudget::new(100);
        let mut a = Budget::new(80);
        a.set_shared(shared.clone());
        let mut b = Budget::new(80);
        b.set_shared(shared.clone());
        assert!(a.try_reserve(70));
        assert!(!b.try_reserve(70), "the endpoint's budget is spent");
        assert!(b.blocked_on().is_some());
        assert!(b.try_reserve(30));
        assert!(b.blocked_on().is_none());
        b.force_reserve(50);
        assert_eq!(shared.held(), 150);
        assert!(!a.has_room() || !shared.has_room());
        drop(b);
        assert_eq!(shared.held(), 70, "a closed connection gives its bytes back");
        drop(a);
        assert_eq!(shared.held(), 0);
        assert_eq!(shared.peak(), 150);
    }
}

//! Rendezvous budgets: the bytes a connection (and a whole endpoint) holds for large payloads.
//!
//! Two kinds of bytes count, on both roles: READ destinations from the moment their READ is
//! issued until its completion returns (a cancelled call's READ included), and our own regions
//! advertised to the peer until it reports the READ done (or the connection dies).
//!
//! A READ is issued only when its destination fits the budget; otherwise it waits in the
//! connection's READ queue (bounded by its calls in flight). A single payload larger than the
//! budget proceeds alone: when nothing else is held it always fits, so no payload up to
//! `max_message_size` can be starved. Our own payloads (to be advertised) are counted from the
//! moment they are handed to the protocol, but never wait: their bytes exist already; the server
//! instead stops starting handlers while the connection's budget is spent (see
//! [`ServerProto::try_start_handler`](super::ServerProto::try_start_handler)).
//!
//! The endpoint's shared budget counts READ destinations only: the memory the framework
//! allocates on peers' behalf. A peer that does not READ our responses thus holds its own
//! connection's budget (and, after the done timeout, loses the connection) but cannot starve the
//! READs of other connections.

use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;
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
        self.inner.lock()
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
    /// Of `held`, the bytes also taken from `shared` (READ destinations).
    shared_held: u64,
    /// Of `held`, the bytes only reserved for responses their handlers are still building
    /// ([`Budget::reserve_estimate`]), as opposed to bytes that exist (READ destinations,
    /// response regions advertised).
    estimated: u64,
    shared: Option<Arc<SharedBudget>>,
    /// The last reservation failed on the shared budget (not on our own).
    blocked_on_shared: bool,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget {
            limit,
            held: 0,
            peak: 0,
            shared_held: 0,
            estimated: 0,
            shared: None,
            blocked_on_shared: false,
        }
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

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether `len` more bytes fit (always, when nothing is held).
    pub fn fits(&self, len: u64) -> bool {
        self.held == 0 || self.held.saturating_add(len) <= self.limit
    }

    /// Room left for a handler whose response is expected to be small (sent eagerly, holding
    /// nothing): the bytes held that exist are under the limit. Reservations for responses
    /// still being built do not count: the response of a handler that runs alone because its
    /// size is unknown (it reserved the whole budget) does not exist yet, so it need not stop
    /// the small calls meanwhile, while bytes a client leaves unread do.
    pub fn has_room_for_small(&self) -> bool {
        self.held - self.estimated.min(self.held) < self.limit
    }

    /// Reserves `len` bytes for a response its handler is about to build (this connection
    /// only); [`Budget::release_estimate`] gives them back when it is built or abandoned.
    pub fn reserve_estimate(&mut self, len: u64) {
        self.estimated = self.estimated.saturating_add(len);
        self.add(len);
    }

    /// Gives back a reservation of [`Budget::reserve_estimate`].
    pub fn release_estimate(&mut self, len: u64) {
        self.estimated -= len.min(self.estimated);
        self.release(len);
    }

    /// Takes `len` bytes for a READ destination if they fit, here and on the endpoint.
    pub fn try_reserve_read(&mut self, len: u64) -> bool {
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
        if self.shared.is_some() {
            self.shared_held += len;
        }
        self.add(len);
        true
    }

    /// Gives back a READ destination's bytes, here and on the endpoint.
    pub fn release_read(&mut self, len: u64) {
        self.release(len);
        if let Some(shared) = &self.shared {
            let len = len.min(self.shared_held);
            self.shared_held -= len;
            shared.release(len);
        }
    }

    /// Counts `len` bytes of our own payload, to be advertised (this connection only).
    pub fn force_reserve(&mut self, len: u64) {
        self.add(len);
    }

    fn add(&mut self, len: u64) {
        self.held = self.held.saturating_add(len);
        self.peak = self.peak.max(self.held);
    }

    /// Gives back `len` bytes of our own payload.
    pub fn release(&mut self, len: u64) {
        self.held -= len.min(self.held);
    }

    /// The endpoint's budget, when the last attempt failed on it: the driver registers its
    /// waker there.
    pub fn blocked_on(&self) -> Option<&Arc<SharedBudget>> {
        self.shared.as_ref().filter(|_| self.blocked_on_shared)
    }
}

impl Drop for Budget {
    /// A connection that ends gives back to the endpoint the READ destinations it still held:
    /// they go with the transport connection.
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.release(self.shared_held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_payload_larger_than_the_budget_proceeds_alone() {
        let mut b = Budget::new(100);
        assert!(b.try_reserve_read(1000), "nothing held: a large payload proceeds");
        assert!(!b.try_reserve_read(1), "nothing else while it is held");
        b.release_read(1000);
        assert!(b.try_reserve_read(60));
        assert!(b.try_reserve_read(40));
        assert!(!b.try_reserve_read(1));
        assert_eq!(b.peak(), 1000);
    }

    #[test]
    fn the_shared_budget_bounds_all_connections_and_is_given_back_on_drop() {
        let shared = SharedBudget::new(100);
        let mut a = Budget::new(80);
        a.set_shared(shared.clone());
        let mut b = Budget::new(80);
        b.set_shared(shared.clone());
        assert!(a.try_reserve_read(70));
        assert!(!b.try_reserve_read(70), "the endpoint's budget is spent");
        assert!(b.blocked_on().is_some());
        assert!(b.try_reserve_read(30));
        assert!(b.blocked_on().is_none());
        b.force_reserve(50);
        assert_eq!(shared.held(), 100, "our own payloads count on the connection only");
        assert!(!b.has_room_for_small(), "80 of 80 held on connection B");
        assert!(a.has_room_for_small());
        drop(b);
        assert_eq!(shared.held(), 70, "a closed connection gives its READ bytes back");
        drop(a);
        assert_eq!(shared.held(), 0);
        assert_eq!(shared.peak(), 100);
    }

    #[test]
    fn a_reservation_for_a_response_being_built_stops_large_calls_but_not_small_ones() {
        let mut b = Budget::new(100);
        b.reserve_estimate(100);
        assert!(!b.fits(1), "another large response waits");
        assert!(b.has_room_for_small(), "nothing exists yet: small calls go on");
        // Bytes that exist (a region the client has not READ yet) stop small calls too.
        b.force_reserve(100);
        assert!(!b.has_room_for_small());
        b.release(100);
        b.release_estimate(100);
        assert_eq!(b.held(), 0);
        assert!(b.has_room_for_small() && b.fits(100));
    }
}

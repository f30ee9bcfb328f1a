//! The calls in progress on one client connection, shared by the callers and the connection's
//! driver: a slab of slots, each holding the waiting caller's waker and then its result. A call
//! takes a slot when it starts and gives it back when it ends, so in steady state a call
//! allocates nothing here (the slab grows to the most calls ever in flight at once, which the
//! client's in-flight semaphore bounds, and stays).
//!
//! The slot's key travels in the call id: the low 32 bits are `key + 1` (never 0), the high 32
//! bits a sequence number, so an id names one call even after its slot is reused.

use parking_lot::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use slab::Slab;

use tokio::time::Instant;

use crate::error::CallError;
use crate::proto::CallInfo;
use rpc_transport::{Detail, Received};

/// What a call returns: the response and the paths it took, or why it failed.
pub(crate) type CallResult = Result<(Received, CallInfo), CallError>;

enum Slot {
    /// In progress; the waker of the task awaiting it, once it has polled.
    Waiting { call_id: u64, waker: Option<Waker> },
    /// The driver delivered the result at `at` (its clock reading then); the caller has not
    /// taken it yet.
    Done { call_id: u64, result: CallResult, at: Instant },
}

impl Slot {
    fn call_id(&self) -> u64 {
        match self {
            Slot::Waiting { call_id, .. } | Slot::Done { call_id, .. } => *call_id,
        }
    }
}

#[derive(Default)]
struct Inner {
    slots: Slab<Slot>,
    /// The high half of the next call id.
    seq: u32,
    /// The driver has stopped: no call starts any more.
    closed: bool,
}

/// The slots of one connection's calls.
#[derive(Default)]
pub(crate) struct CallSlots {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for CallSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSlots").field("calls", &self.lock().slots.len()).finish()
    }
}

fn key_of(call_id: u64) -> Option<usize> {
    ((call_id & u64::from(u32::MAX)) as usize).checked_sub(1)
}

impl CallSlots {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Takes a slot for a new call and returns its id, or `None` once the driver has stopped.
    pub(crate) fn open(&self) -> Option<u64> {
        let mut inner = self.lock();
        if inner.closed {
            return None;
        }
        inner.seq = inner.seq.wrapping_add(1);
        let seq = u64::from(inner.seq);
        let entry = inner.slots.vacant_entry();
        let key = u64::try_from(entry.key()).ok().filter(|k| *k < u64::from(u32::MAX))?;
        let call_id = (seq << 32) | (key + 1);
        entry.insert(Slot::Waiting { call_id, waker: None });
        Some(call_id)
    }

    /// The caller's side: the result once delivered, with when it was (the slot is then free),
    /// else `Pending` with the caller's waker kept in the slot.
    pub(crate) fn poll_result(&self, call_id: u64, cx: &mut Context<'_>) -> Poll<(CallResult, Instant)> {
        let mut inner = self.lock();
        let Some(key) =
            key_of(call_id).filter(|k| inner.slots.get(*k).is_some_and(|s| s.call_id() == call_id))
        else {
            // Not ours (cannot happen: only the caller frees its slot).
            return Poll::Ready((Err(CallError::Disconnected("call slot lost".into())), Instant::now()));
        };
        match &mut inner.slots[key] {
            Slot::Waiting { waker, .. } => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Slot::Done { .. } => match inner.slots.remove(key) {
                Slot::Done { result, at, .. } => Poll::Ready((result, at)),
                Slot::Waiting { .. } => unreachable!("matched as done above"),
            },
        }
    }

    /// The driver's side: delivers `result` to call `call_id` at `at` (the driver's clock
    /// reading of this wake-up: the caller's metrics take the call's end from it instead of
    /// reading the clock again) and wakes its caller (a caller that runs the pass that ends its
    /// call gets the result handed over instead: [`Completer::take`]). Returns false if the
    /// caller has gone (its slot was given back).
    pub(crate) fn complete(&self, call_id: u64, result: CallResult, at: Instant) -> bool {
        let mut wakers = Vec::new();
        let mut slots = self.completer(&mut wakers);
        slots.complete(call_id, result, at)
    }

    /// Delivers several results under one lock ([`Completer::complete`] each); their callers
    /// are woken when the completer is dropped, after the lock is released. `wakers` is the
    /// driver's, kept from one batch to the next (empty when this returns).
    pub(crate) fn completer<'a>(&'a self, wakers: &'a mut Vec<Waker>) -> Completer<'a> {
        Completer { inner: Some(self.lock()), wakers }
    }

    /// The caller gave up on call `call_id` (its future was dropped): frees the slot. Returns
    /// whether the call was still in progress (the driver must then cancel it).
    pub(crate) fn abandon(&self, call_id: u64) -> bool {
        let mut inner = self.lock();
        match key_of(call_id).filter(|k| inner.slots.get(*k).is_some_and(|s| s.call_id() == call_id)) {
            Some(key) => matches!(inner.slots.remove(key), Slot::Waiting { .. }),
            None => false,
        }
    }

    /// The driver stopped: no call starts any more, and every call still waiting fails with
    /// [`CallError::Disconnected`] carrying `reason`.
    pub(crate) fn close(&self, reason: Detail) {
        let mut wakers = Vec::new();
        let at = Instant::now();
        {
            let mut inner = self.lock();
            inner.closed = true;
            for (_, slot) in inner.slots.iter_mut() {
                if let Slot::Waiting { call_id, waker } = slot {
                    wakers.extend(waker.take());
                    let result = Err(CallError::Disconnected(reason.clone()));
                    *slot = Slot::Done { call_id: *call_id, result, at };
                }
            }
        }
        for w in wakers {
            w.wake();
        }
    }
}

/// A batch of results being delivered ([`CallSlots::completer`]).
pub(crate) struct Completer<'a> {
    inner: Option<MutexGuard<'a, Inner>>,
    wakers: &'a mut Vec<Waker>,
}

impl Completer<'_> {
    /// Frees call `call_id`'s slot for a result handed to its caller directly (the caller runs
    /// the pass that ended the call). Returns whether the call was waiting: a caller that has
    /// gone gets nothing.
    pub(crate) fn take(&mut self, call_id: u64) -> bool {
        let Some(inner) = self.inner.as_mut() else { return false };
        let Some(key) = key_of(call_id) else { return false };
        match inner.slots.get(key) {
            Some(Slot::Waiting { call_id: id, .. }) if *id == call_id => {
                inner.slots.remove(key);
                true
            }
            _ => false,
        }
    }

    /// [`CallSlots::complete`], the caller woken when the batch ends.
    pub(crate) fn complete(&mut self, call_id: u64, result: CallResult, at: Instant) -> bool {
        let Some(inner) = self.inner.as_mut() else { return false };
        let Some(slot) = key_of(call_id).and_then(|k| inner.slots.get_mut(k)) else { return false };
        match slot {
            Slot::Waiting { call_id: id, waker } if *id == call_id => {
                let waker = waker.take();
                *slot = Slot::Done { call_id, result, at };
                self.wakers.extend(waker);
                true
            }
            _ => false,
        }
    }
}

impl Drop for Completer<'_> {
    fn drop(&mut self) {
        drop(self.inner.take());
        if !self.wakers.is_empty() {
            for waker in self.wakers.drain(..) {
                waker.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_wakers::CountWakes;

    fn ok(n: u8) -> CallResult {
        Ok((Received::from(vec![n]), CallInfo::default()))
    }

    #[test]
    fn result_reaches_the_waiting_caller_and_frees_the_slot() {
        let slots = CallSlots::default();
        let (wakes, waker) = CountWakes::waker();
        let mut cx = Context::from_waker(&waker);
        let id = slots.open().unwrap();
        assert_ne!(id, 0);
        assert!(slots.poll_result(id, &mut cx).is_pending());
        let at = Instant::now() + std::time::Duration::from_secs(5);
        assert!(slots.complete(id, ok(7), at));
        assert_eq!(wakes.count(), 1, "the caller was woken");
        match slots.poll_result(id, &mut cx) {
            Poll::Ready((Ok((b, _)), when)) => {
                assert_eq!(&b[..], &[7]);
                assert_eq!(when, at, "the caller gets the driver's reading of the delivery");
            }
            other => panic!("expected the result, got {other:?}"),
        }
        assert_eq!(slots.lock().slots.len(), 0, "the slot is free");
        assert!(!slots.complete(id, ok(8), Instant::now()), "a finished call takes no second result");
    }

    #[test]
    fn a_reused_slot_gets_a_new_id_and_stale_results_are_dropped() {
        let slots = CallSlots::default();
        let first = slots.open().unwrap();
        assert!(slots.abandon(first), "abandoned while in progress: cancel it");
        let second = slots.open().unwrap();
        assert_eq!(key_of(first), key_of(second), "the slot is reused");
        assert_ne!(first, second);
        assert!(
            !slots.complete(first, ok(1), Instant::now()),
            "the old call's result does not reach the new one"
        );
        assert!(!slots.abandon(first));
        assert!(slots.complete(second, ok(2), Instant::now()));
        assert!(!slots.abandon(second), "already done: nothing to cancel");
    }

    #[test]
    fn a_batch_of_results_wakes_its_callers_after_the_lock_is_released() {
        let slots = CallSlots::default();
        let callers: Vec<_> = (0..3).map(|_| CountWakes::waker()).collect();
        let ids: Vec<u64> = callers
            .iter()
            .map(|(_, waker)| {
                let id = slots.open().unwrap();
                assert!(slots.poll_result(id, &mut Context::from_waker(waker)).is_pending());
                id
            })
            .collect();
        let gone = slots.open().unwrap();
        assert!(slots.abandon(gone));
        let mut wakers = Vec::new();
        let mut batch = slots.completer(&mut wakers);
        assert!(batch.complete(ids[0], ok(0), Instant::now()));
        // The caller that runs the pass itself is not woken: its result is handed over.
        assert!(batch.take(ids[1]));
        assert!(batch.complete(ids[2], ok(2), Instant::now()));
        assert!(!batch.complete(gone, ok(9), Instant::now()), "a caller that has gone gets nothing");
        assert!(slots.inner.try_lock().is_none(), "the whole batch under one lock");
        assert_eq!(callers.iter().map(|(w, _)| w.count()).sum::<usize>(), 0, "nobody woken under the lock");
        drop(batch);
        let woken: Vec<usize> = callers.iter().map(|(w, _)| w.count()).collect();
        assert_eq!(woken, [1, 0, 1]);
        assert!(wakers.is_empty(), "the driver's list is left empty for the next batch");
        for n in [0, 2] {
            match slots.poll_result(ids[n], &mut Context::from_waker(&callers[n].1)) {
                Poll::Ready((Ok((b, _)), _)) => assert_eq!(&b[..], &[n as u8]),
                other => panic!("expected the result, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_result_handed_to_its_caller_directly_frees_the_slot_without_a_wake() {
        let slots = CallSlots::default();
        let (wakes, waker) = CountWakes::waker();
        let id = slots.open().unwrap();
        assert!(slots.poll_result(id, &mut Context::from_waker(&waker)).is_pending());
        let gone = slots.open().unwrap();
        assert!(slots.abandon(gone));
        let mut wakers = Vec::new();
        let mut batch = slots.completer(&mut wakers);
        assert!(batch.take(id), "a waiting call's slot is taken");
        assert!(!batch.take(id), "and only once");
        assert!(!batch.take(gone), "a caller that has gone gets nothing");
        drop(batch);
        assert_eq!(wakes.count(), 0, "its caller is not woken: it runs the pass");
        assert_eq!(slots.lock().slots.len(), 0, "the slot is free");
        let next = slots.open().unwrap();
        assert_eq!(key_of(next), key_of(id), "and reused");
        assert!(!slots.complete(id, ok(1), Instant::now()), "no later result reaches it");
    }

    #[test]
    fn close_fails_waiting_calls_and_refuses_new_ones() {
        let slots = CallSlots::default();
        let (wakes, waker) = CountWakes::waker();
        let mut cx = Context::from_waker(&waker);
        let waiting = slots.open().unwrap();
        let done = slots.open().unwrap();
        assert!(slots.poll_result(waiting, &mut cx).is_pending());
        assert!(slots.complete(done, ok(3), Instant::now()));
        slots.close("gone".into());
        assert_eq!(wakes.count(), 1);
        match slots.poll_result(waiting, &mut cx) {
            Poll::Ready((Err(CallError::Disconnected(r)), _)) => assert_eq!(r, "gone"),
            other => panic!("expected Disconnected, got {other:?}"),
        }
        assert!(
            matches!(slots.poll_result(done, &mut cx), Poll::Ready((Ok(_), _))),
            "a delivered result stays"
        );
        assert!(slots.open().is_none(), "no call starts after close");
    }
}

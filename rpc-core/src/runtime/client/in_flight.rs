//! A connection's bound on calls in flight ([`ClientConfig::max_in_flight`]): a count of free
//! permits, taken with one atomic update and given back with one, where tokio's `Semaphore`
//! takes its waiters' mutex at every release (three atomic updates and ~150 instructions a
//! call). Callers that find no permit wait, in arrival order, in a tokio `Semaphore` that holds
//! only the permits handed over to them.
//!
//! How a permit is never lost between a caller that is about to wait and a release: the caller
//! first counts itself in `waiting`, then looks at `free` again; the release first adds to
//! `free`, then looks at `waiting`. Both with sequentially consistent order: at least one of the
//! two sees the other, so either the caller takes the permit itself or the release moves it to
//! the waiters. While anyone waits, a new caller does not take a free permit ahead of them.
//!
//! [`ClientConfig::max_in_flight`]: crate::ClientConfig

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use tokio::sync::Semaphore;

#[derive(Debug)]
pub(crate) struct InFlight {
    /// Permits free for the taking.
    free: AtomicUsize,
    /// Callers in [`InFlight::acquire`].
    waiting: AtomicUsize,
    /// Permits handed to waiting callers (FIFO).
    handoff: Semaphore,
}

impl InFlight {
    pub(crate) fn new(permits: usize) -> InFlight {
        InFlight { free: AtomicUsize::new(permits), waiting: AtomicUsize::new(0), handoff: Semaphore::new(0) }
    }

    /// Free permits now (a look, no update).
    pub(crate) fn available(&self) -> usize {
        self.free.load(SeqCst)
    }

    /// Takes a permit if one is free and no caller waits for one.
    pub(crate) fn try_acquire(&self) -> bool {
        self.waiting.load(SeqCst) == 0 && self.take_free()
    }

    fn take_free(&self) -> bool {
        self.free.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
    }

    /// Waits for a permit (in arrival order with the other waiters). Dropped before it
    /// returns, it takes none, and a permit handed to it meanwhile goes to the next waiter.
    pub(crate) async fn acquire(&self) {
        self.waiting.fetch_add(1, SeqCst);
        let _waiting = Waiting(self);
        if self.take_free() {
            return;
        }
        match self.handoff.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => unreachable!("the handoff semaphore is never closed"),
        }
    }

    /// Gives a permit back: to the first waiting caller if one waits.
    pub(crate) fn release(&self) {
        self.free.fetch_add(1, SeqCst);
        if self.waiting.load(SeqCst) > 0 && self.take_free() {
            self.hand_over();
        }
    }

    /// Moves a permit taken from `free` to the waiters. If they all left meanwhile, it comes
    /// back (`reclaim`); if one is still there, it takes it, or reclaims it as the last to leave.
    fn hand_over(&self) {
        self.handoff.add_permits(1);
        if self.waiting.load(SeqCst) == 0 {
            self.reclaim();
        }
    }

    /// Permits handed over to waiters that left (cancelled) go back to `free`, unless a caller
    /// started to wait meanwhile.
    fn reclaim(&self) {
        while let Ok(permit) = self.handoff.try_acquire() {
            permit.forget();
            self.free.fetch_add(1, SeqCst);
            if self.waiting.load(SeqCst) > 0 && self.take_free() {
                self.hand_over();
                return;
            }
        }
    }

    /// A waiter left, served or cancelled: the last to leave reclaims what was handed over.
    fn left(&self) {
        if self.waiting.fetch_sub(1, SeqCst) == 1 {
            self.reclaim();
        }
    }
}

/// Counts a caller in `waiting` while it is in [`InFlight::acquire`].
struct Waiting<'a>(&'a InFlight);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.left();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn permits_are_taken_and_given_back_up_to_the_bound() {
        let f = InFlight::new(2);
        assert!(f.try_acquire() && f.try_acquire());
        assert!(!f.try_acquire(), "the bound");
        assert_eq!(f.available(), 0);
        f.release();
        assert_eq!(f.available(), 1);
        assert!(f.try_acquire());
    }

    #[tokio::test]
    async fn waiters_are_served_in_order_and_a_new_caller_does_not_jump_the_queue() {
        let f = Arc::new(InFlight::new(1));
        assert!(f.try_acquire());
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (task_f, order) = (f.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                task_f.acquire().await;
                order.lock().unwrap().push(i);
                tokio::task::yield_now().await;
                task_f.release();
            }));
            // Each waits before the next starts.
            while f.waiting.load(SeqCst) < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        f.release();
        assert!(!f.try_acquire(), "callers wait: a new one does not take the permit first");
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        assert_eq!((f.available(), f.handoff.available_permits()), (1, 0), "the permit is back, free");
    }

    #[tokio::test]
    async fn a_cancelled_waiter_takes_nothing_and_loses_nothing() {
        let f = Arc::new(InFlight::new(1));
        assert!(f.try_acquire());
        let waiter = {
            let f = f.clone();
            tokio::spawn(async move { f.acquire().await })
        };
        while f.waiting.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Handed over to the waiter, which is cancelled before it runs again.
        f.release();
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(f.waiting.load(SeqCst), 0);
        assert_eq!((f.available(), f.handoff.available_permits()), (1, 0), "the permit is free again");
        assert!(f.try_acquire());
    }

    /// Many tasks on several threads take and give back permits at random: never more than
    /// the bound at once, and all are back at the end.
    #[test]
    fn the_bound_holds_under_contention_and_every_permit_comes_back() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
        rt.block_on(async {
            const BOUND: usize = 3;
            let f = Arc::new(InFlight::new(BOUND));
            let (held, waited) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let mut tasks = Vec::new();
            for t in 0..16u64 {
                let (f, held, waited) = (f.clone(), held.clone(), waited.clone());
                tasks.push(tokio::spawn(async move {
                    for i in 0..500u64 {
                        if !f.try_acquire() {
                            waited.fetch_add(1, SeqCst);
                            if (t + i) % 7 == 0 {
                                // Some give up waiting.
                                if tokio::time::timeout(Duration::from_micros(50), f.acquire()).await.is_err()
                                {
                                    continue;
                                }
                            } else {
                                f.acquire().await;
                            }
                        }
                        let now = held.fetch_add(1, SeqCst) + 1;
                        assert!(now <= BOUND, "{now} permits held at once");
                        tokio::task::yield_now().await;
                        held.fetch_sub(1, SeqCst);
                        f.release();
                    }
                }));
            }
            for t in tasks {
                tokio::time::timeout(Duration::from_secs(60), t).await.expect("no task stuck").unwrap();
            }
            assert!(waited.load(SeqCst) > 100, "callers waited: {} times", waited.load(SeqCst));
            assert_eq!(f.waiting.load(SeqCst), 0);
            assert_eq!(f.available() + f.handoff.available_permits(), BOUND, "every permit is back");
            assert_eq!(f.available(), BOUND, "and free, not stranded with the waiters");
        });
    }
}

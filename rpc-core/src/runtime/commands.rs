//! The queue from a client connection's handles to its driver: a mutex-guarded queue and the
//! driver's waker. The driver takes a batch in one lock and is woken once per batch; in a small
//! call this costs a fraction of a tokio mpsc channel, whose receive (cooperative budget,
//! block list, atomic waker) was ~600 instructions per call.
//!
//! One [`Sender`] (the connection's handle) and one [`Receiver`] (its driver). The queue is
//! unbounded as the channel was: each call sends at most a start and a cancel, and calls are
//! bounded by the client's in-flight limit.

use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

struct Inner<T> {
    queue: VecDeque<T>,
    /// The driver's waker, left when it found the queue empty; taken by the next send.
    waker: Option<Waker>,
    /// The sender is gone: the driver stops once the queue is empty.
    sender_gone: bool,
}

struct Shared<T> {
    inner: Mutex<Inner<T>>,
    /// The receiver is gone: sends fail. Set under the lock, read without it.
    receiver_gone: AtomicBool,
    /// Something may be queued (or the sender is gone): set by the sender under the lock,
    /// cleared by the receiver under the lock when it empties the queue. Lets a driver that
    /// found the queue empty earlier in the same poll look again without the lock.
    queued: AtomicBool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock()
    }
}

/// The handles' end.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The driver's end.
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A new queue.
pub(crate) fn queue<T>() -> (Sender<T>, Receiver<T>) {
    let inner = Inner { queue: VecDeque::new(), waker: None, sender_gone: false };
    let shared = Arc::new(Shared {
        inner: Mutex::new(inner),
        receiver_gone: AtomicBool::new(false),
        queued: AtomicBool::new(false),
    });
    (Sender { shared: shared.clone() }, Receiver { shared })
}

impl<T> Sender<T> {
    /// Queues `value` and wakes the driver if it waits; gives `value` back if the driver is
    /// gone.
    pub(crate) fn send(&self, value: T) -> Result<(), T> {
        let waker = {
            let mut inner = self.shared.lock();
            if self.shared.receiver_gone.load(Ordering::Relaxed) {
                return Err(value);
            }
            inner.queue.push_back(value);
            self.shared.queued.store(true, Ordering::Release);
            inner.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// Whether the driver is gone (a send would fail).
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.receiver_gone.load(Ordering::Relaxed)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut inner = self.shared.lock();
            inner.sender_gone = true;
            self.shared.queued.store(true, Ordering::Release);
            inner.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Moves up to `max` queued values to `out`, in order. `Ready(true)`: some were taken;
    /// `Ready(false)`: none, and none will come (the sender is gone); `Pending`: none, and this
    /// task is woken by the next send.
    ///
    /// `armed`: an earlier look found the queue empty and left with it the waker `cx` holds now
    /// (in the same poll, or one with the same waker), and took nothing since: then a look at
    /// the flag is enough while nothing was sent since. A send
    /// that came since takes the waker and wakes the task, so a flag read too early only defers
    /// the value to the next poll, never loses it.
    pub(crate) fn poll_take(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
        out: &mut VecDeque<T>,
        armed: bool,
    ) -> Poll<bool> {
        if armed && !self.shared.queued.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        let mut inner = self.shared.lock();
        if inner.queue.is_empty() {
            if inner.sender_gone {
                return Poll::Ready(false);
            }
            match &mut inner.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        for _ in 0..max {
            let Some(value) = inner.queue.pop_front() else { break };
            out.push_back(value);
        }
        if inner.queue.is_empty() && !inner.sender_gone {
            self.shared.queued.store(false, Ordering::Relaxed);
        }
        Poll::Ready(true)
    }
}

impl<T> Receiver<T> {
    /// Whether something may have been sent (or the sender gone) since the queue was last
    /// emptied: [`Receiver::poll_take`] with `armed` looks only then.
    pub(crate) fn may_have_news(&self) -> bool {
        self.shared.queued.load(Ordering::Acquire)
    }
}

impl<T> Drop for Receiver<T> {
    /// Later sends fail; what was queued is dropped (outside the lock).
    fn drop(&mut self) {
        let queued = {
            let mut inner = self.shared.lock();
            self.shared.receiver_gone.store(true, Ordering::Relaxed);
            inner.waker = None;
            std::mem::take(&mut inner.queue)
        };
        drop(queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_wakers::CountWakes;

    #[test]
    fn values_arrive_in_order_in_batches_and_a_waiting_driver_is_woken_once() {
        let (tx, mut rx) = queue::<u32>();
        let (wakes, waker) = CountWakes::waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = VecDeque::new();
        assert_eq!(rx.poll_take(&mut cx, 2, &mut out, false), Poll::Pending);
        for v in 0..3 {
            tx.send(v).unwrap();
        }
        assert_eq!(wakes.count(), 1, "woken by the first send only");
        assert_eq!(rx.poll_take(&mut cx, 2, &mut out, false), Poll::Ready(true));
        assert_eq!(out, [0, 1], "at most `max` at a time");
        assert_eq!(rx.poll_take(&mut cx, 2, &mut out, false), Poll::Ready(true));
        assert_eq!(out, [0, 1, 2]);
        assert_eq!(rx.poll_take(&mut cx, 2, &mut out, false), Poll::Pending);
        assert_eq!(rx.poll_take(&mut cx, 2, &mut out, true), Poll::Pending, "armed: nothing sent");
        tx.send(3).unwrap();
        assert_eq!(wakes.count(), 2, "woken again after it found the queue empty");
        assert_eq!(rx.poll_take(&mut cx, 2, &mut out, true), Poll::Ready(true), "armed: the flag says look");
        assert_eq!(out, [0, 1, 2, 3]);
    }

    #[test]
    fn the_driver_sees_the_sender_go_after_the_queue_and_sends_fail_once_it_is_gone() {
        let (tx, mut rx) = queue::<Arc<()>>();
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let mut out = VecDeque::new();
        tx.send(Arc::new(())).unwrap();
        drop(tx);
        assert_eq!(rx.poll_take(&mut cx, 8, &mut out, false), Poll::Ready(true), "what was sent comes first");
        assert_eq!(rx.poll_take(&mut cx, 8, &mut out, false), Poll::Ready(false));

        let (tx, rx) = queue::<Arc<()>>();
        let held = Arc::new(());
        tx.send(held.clone()).unwrap();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(Arc::strong_count(&held), 1, "the queued value was dropped with the receiver");
        assert!(tx.send(held.clone()).is_err());
    }
}

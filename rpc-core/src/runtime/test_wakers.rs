//! A waker that counts its wake-ups, for the runtime's unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

/// Counts the wake-ups of the wakers made from it.
#[derive(Default)]
pub(crate) struct CountWakes(AtomicUsize);

impl CountWakes {
    /// A fresh counter and a waker that counts into it.
    pub(crate) fn waker() -> (Arc<CountWakes>, Waker) {
        let count = Arc::new(CountWakes::default());
        (count.clone(), Waker::from(count))
    }

    /// The wake-ups so far.
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Waits on this thread, at most 10 s, until there were at least `n` wake-ups (a waker woken
    /// from another thread); returns the count then, for the caller to assert on.
    pub(crate) fn wait_for(&self, n: usize) -> usize {
        let start = Instant::now();
        while self.count() < n && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.count()
    }
}

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

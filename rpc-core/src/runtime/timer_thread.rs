//! The process's timer thread: where connections' timers (call deadlines, keepalive, READ and
//! done timeouts) wait, instead of in the tokio runtime's timer wheel.
//!
//! Why: a tokio runtime whose wheel holds a timer parks with a timeout. Each time it goes to
//! sleep it then reads the clock twice more, takes its timer lock twice, and arms and cancels a
//! kernel timer (`epoll_wait` with a timeout). Every connection keeps a timer armed (its calls'
//! deadlines, its keepalive), so every wake-up of a runtime serving connections paid that: about
//! 4% of a 32 B round trip over tcp (BENCHMARKS.md, session 37). Waiting here, a connection's
//! timer costs its runtime nothing: the thread sleeps until the earliest timer of all and wakes
//! that timer's connection when it passes. A connection arms its timer only when its next
//! timeout is earlier than the one armed, or the armed one fired (`driver::drive_timers`), so
//! arming (a lock; a wake-up of this thread only when the new timer is its earliest) is rare.
//!
//! Bounded: one entry per armed [`Alarm`] (a connection has one), removed when it fires, is
//! armed again or is dropped. The thread is started on first use and then stays, asleep while
//! no timer is armed (its stack: [`STACK`] bytes). If it cannot be started, [`Alarm::new`]
//! says so and the connection uses the runtime's timer wheel instead.
//!
//! The thread follows the system clock (`std::time::Instant`), not tokio's paused test clock:
//! an alarm armed for a time that has passed by the system clock completes at once, so a timer
//! never waits longer than its deadline by the system clock, paused clock or not.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Poll, Waker};
use std::time::Instant;

/// The timer thread's stack: it only takes expired entries and wakes their wakers.
const STACK: usize = 128 << 10;

/// What the connections and the thread share.
struct Shared {
    state: Mutex<State>,
    /// Signalled when an entry becomes the earliest (the thread may sleep past it).
    earlier: Condvar,
}

#[derive(Default)]
struct State {
    /// Armed alarms by (deadline, alarm id): one entry per alarm.
    queue: BTreeMap<(Instant, u64), Waiting>,
}

/// An armed alarm as the thread holds it.
struct Waiting {
    waker: Waker,
    fired: Arc<AtomicBool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

/// The thread's shared state, the thread started on first use; `None` if it could not be.
fn shared() -> Option<&'static Shared> {
    static SHARED: OnceLock<Option<&'static Shared>> = OnceLock::new();
    *SHARED.get_or_init(|| {
        let shared: &'static Shared =
            Box::leak(Box::new(Shared { state: Mutex::new(State::default()), earlier: Condvar::new() }));
        match std::thread::Builder::new().name("rpc-timers".into()).stack_size(STACK).spawn(move || run(shared)) {
            Ok(_) => Some(shared),
            Err(e) => {
                tracing::warn!(error = %e, "the timer thread could not be started; connections use the runtime's timer wheel");
                None
            }
        }
    })
}

/// The thread: wakes the alarms whose deadline passed, then sleeps until the next one (or until
/// an earlier one is armed).
fn run(shared: &'static Shared) {
    let mut due: Vec<Waker> = Vec::new();
    let mut state = shared.lock();
    loop {
        let now = Instant::now();
        while let Some(entry) = state.queue.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let waiting = entry.remove();
            // Under the lock: an alarm armed again after this sees its old entry gone.
            waiting.fired.store(true, Ordering::Release);
            due.push(waiting.waker);
        }
        if !due.is_empty() {
            drop(state);
            for waker in due.drain(..) {
                // A waker that panics must not take every other connection's timers with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
            }
            state = shared.lock();
            continue;
        }
        let next = state.queue.keys().next().map(|&(at, _)| at);
        match next {
            Some(at) => {
                shared.earlier.wait_for(&mut state, at.saturating_duration_since(now));
            }
            None => shared.earlier.wait(&mut state),
        }
    }
}

/// A connection's timer on the timer thread: armed for one deadline at a time.
pub(crate) struct Alarm {
    shared: &'static Shared,
    id: u64,
    /// The deadline of its entry, if it has one.
    armed: Option<Instant>,
    /// Set by the thread when the armed deadline passed (the entry is then gone).
    fired: Arc<AtomicBool>,
}

impl std::fmt::Debug for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alarm")
            .field("id", &self.id)
            .field("armed", &self.armed)
            .field("fired", &self.fired())
            .finish()
    }
}

impl Alarm {
    /// An alarm, not armed; `None` if the timer thread could not be started.
    pub(crate) fn new() -> Option<Alarm> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Some(Alarm {
            shared: shared()?,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            armed: None,
            fired: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Arms the alarm for `at` (replacing its earlier deadline): `waker` is woken when `at`
    /// passes. `Ready` (and nothing is armed) if it has passed already.
    pub(crate) fn arm(&mut self, at: Instant, waker: &Waker) -> Poll<()> {
        let passed = at <= Instant::now();
        let mut state = self.shared.lock();
        if let Some(old) = self.armed.take() {
            state.queue.remove(&(old, self.id));
        }
        self.fired.store(passed, Ordering::Relaxed);
        if passed {
            return Poll::Ready(());
        }
        state.queue.insert((at, self.id), Waiting { waker: waker.clone(), fired: self.fired.clone() });
        self.armed = Some(at);
        let earliest = state.queue.keys().next() == Some(&(at, self.id));
        drop(state);
        if earliest {
            self.shared.earlier.notify_one();
        }
        Poll::Pending
    }

    /// Whether the armed deadline passed (the waker was, or is being, woken).
    pub(crate) fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        if let Some(at) = self.armed.take() {
            self.shared.lock().queue.remove(&(at, self.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_wakers::CountWakes;
    use std::time::Duration;

    /// Whether the thread holds an entry of `alarm`.
    fn holds(alarm: &Alarm) -> bool {
        alarm.shared.lock().queue.keys().any(|&(_, id)| id == alarm.id)
    }

    /// Waits (at most 10 s) until `alarm` fired.
    fn wait_fired(alarm: &Alarm) -> Duration {
        let start = Instant::now();
        while !alarm.fired() {
            assert!(start.elapsed() < Duration::from_secs(10), "the alarm fired within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        start.elapsed()
    }

    #[test]
    fn an_alarm_wakes_its_waker_once_its_deadline_passes_and_leaves_nothing_behind() {
        let (wakes, waker) = CountWakes::waker();
        let mut alarm = Alarm::new().expect("the timer thread starts");
        let at = Instant::now() + Duration::from_millis(200);
        assert!(alarm.arm(at, &waker).is_pending());
        assert!(holds(&alarm) && !alarm.fired());
        wait_fired(&alarm);
        assert!(Instant::now() >= at, "not before its deadline");
        // The wake follows the flag, outside the thread's lock.
        assert_eq!(wakes.wait_for(1), 1, "woken once");
        assert!(!holds(&alarm), "a fired alarm's entry is gone");
    }

    #[test]
    fn arming_again_replaces_the_entry_and_an_earlier_deadline_wakes_the_sleeping_thread() {
        let (wakes, waker) = CountWakes::waker();
        let mut alarm = Alarm::new().expect("the timer thread starts");
        // The thread sleeps towards a deadline a minute away ...
        assert!(alarm.arm(Instant::now() + Duration::from_secs(60), &waker).is_pending());
        std::thread::sleep(Duration::from_millis(20));
        // ... and an earlier one, armed on the same alarm, replaces it and is not missed.
        assert!(alarm.arm(Instant::now() + Duration::from_millis(200), &waker).is_pending());
        let entries = alarm.shared.lock().queue.keys().filter(|&&(_, id)| id == alarm.id).count();
        assert_eq!(entries, 1, "one entry per alarm");
        let waited = wait_fired(&alarm);
        assert!(waited < Duration::from_secs(30), "woken for the earlier deadline, not the minute");
        // Armed again after firing: a fresh wait.
        assert!(alarm.arm(Instant::now() + Duration::from_secs(60), &waker).is_pending());
        assert!(!alarm.fired() && holds(&alarm));
        drop(alarm);
        assert_eq!(
            wakes.wait_for(1),
            1,
            "woken once, for the earlier deadline; the dropped alarm left nothing"
        );
    }

    #[test]
    fn a_passed_deadline_is_ready_at_once_and_a_dropped_alarm_leaves_no_entry() {
        let (wakes, waker) = CountWakes::waker();
        let mut passed = Alarm::new().expect("the timer thread starts");
        assert!(passed.arm(Instant::now(), &waker).is_ready());
        assert!(passed.fired() && !holds(&passed), "nothing armed for a passed deadline");

        let alarms: Vec<Alarm> = (0..100)
            .map(|i| {
                let mut a = Alarm::new().expect("the timer thread starts");
                assert!(a.arm(Instant::now() + Duration::from_secs(60 + i), &waker).is_pending());
                a
            })
            .collect();
        let ids: Vec<u64> = alarms.iter().map(|a| a.id).collect();
        drop(alarms);
        let state = passed.shared.lock();
        assert!(!state.queue.keys().any(|(_, id)| ids.contains(id)), "dropped alarms are removed");
        drop(state);
        assert_eq!(wakes.count(), 0);
    }
}

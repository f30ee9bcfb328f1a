//! Where a client connection's wake-ups go: to its driver task, or to the caller that is driving
//! the connection itself.
//!
//! A call made while no other is in flight does the driver's work in its own task (it posts its
//! request and, while it waits, polls the connection): one task instead of two per call, no queue
//! and no wake-up in between. The transport, the timer and the command queue are always polled
//! with one waker, this route's ([`Route::waker`]), so they never see which task polls them (nor
//! clone a new waker when it changes). A wake-up goes to the driving caller while there is one,
//! else to the driver task.
//!
//! No wake-up is lost when the role moves:
//! - `pending` says a wake-up came since the last pass over the connection began; a caller that
//!   stops driving with one pending hands it on to the driver task. A caller's pass that stops
//!   at its own result, before the rounds that would confirm the connection has nothing more
//!   (on rdma they arm the CQ, a system call), leaves one pending on purpose: the task runs
//!   those rounds after the caller has its answer, off the call's path;
//! - the driver task runs no pass while a caller drives (the caller's passes do the work);
//! - `missed` says a task was woken but could not run a pass, because another held the
//!   connection: whoever releases the connection next looks at it and wakes the route again.

use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;
use std::task::{Wake, Waker};

#[derive(Default)]
struct Inner {
    /// The driver task's waker (set at its every poll).
    task: Option<Waker>,
    /// The caller driving the connection: its call's id and its task's waker.
    caller: Option<(u64, Waker)>,
    /// Woken since the last pass began.
    pending: bool,
    /// A task was woken but found the connection held by another.
    missed: bool,
    /// Polls of the driver task, whether it ran a pass or not.
    task_polls: u64,
}

impl Inner {
    /// Wake-ups go to `caller`, the task of call `call_id` (its waker cloned only if it changed).
    fn set_caller(&mut self, call_id: u64, caller: &Waker) {
        match &self.caller {
            Some((id, w)) if *id == call_id && w.will_wake(caller) => {}
            _ => self.caller = Some((call_id, caller.clone())),
        }
    }
}

/// The wake-up route of one client connection.
#[derive(Default)]
pub(crate) struct Route {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Route")
            .field("caller", &inner.caller.as_ref().map(|(id, _)| *id))
            .field("pending", &inner.pending)
            .finish_non_exhaustive()
    }
}

impl Route {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// The waker to poll the connection with.
    pub(crate) fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(self.clone())
    }

    /// The driver task was polled: wake-ups go to `task` while no caller drives. Returns
    /// whether it is to run a pass: not while a caller drives, whose passes poll the connection
    /// (and get its wake-ups) until its call ends, when one it did not handle comes back to
    /// the task ([`Route::caller_done`]).
    pub(crate) fn task_pass(&self, task: &Waker) -> bool {
        let mut inner = self.lock();
        match &inner.task {
            Some(w) if w.will_wake(task) => {}
            _ => inner.task = Some(task.clone()),
        }
        inner.task_polls += 1;
        if inner.caller.is_some() {
            return false;
        }
        inner.pending = false;
        true
    }

    /// A pass by the caller of call `call_id` begins: wake-ups go to `caller` until
    /// [`Route::caller_done`].
    pub(crate) fn caller_pass(&self, call_id: u64, caller: &Waker) {
        let mut inner = self.lock();
        inner.set_caller(call_id, caller);
        inner.pending = false;
    }

    /// The first poll of call `call_id`, whose start left the connection armed (every source
    /// holds this route's waker; see `Conn::start_here`): if no wake-up came since the last
    /// pass began, wake-ups go to `caller` from now on and no pass is needed (`true`).
    /// Otherwise nothing changes, and the caller runs a pass ([`Route::caller_pass`]).
    pub(crate) fn caller_arm(&self, call_id: u64, caller: &Waker) -> bool {
        let mut inner = self.lock();
        if inner.pending {
            return false;
        }
        inner.set_caller(call_id, caller);
        true
    }

    /// Call `call_id`'s caller stops driving (its call ended, or its future was dropped): a
    /// wake-up that came since its last pass began goes on to the driver task.
    pub(crate) fn caller_done(&self, call_id: u64) {
        let waker = {
            let mut inner = self.lock();
            if inner.caller.as_ref().is_none_or(|(id, _)| *id != call_id) {
                return;
            }
            inner.caller = None;
            if !inner.pending {
                return;
            }
            inner.task.clone()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The driving caller's pass stopped short of confirming that the connection has nothing
    /// more (it had its result): counted as a wake-up it did not handle, which
    /// [`Route::caller_done`] hands on to the driver task.
    pub(crate) fn unfinished(&self) {
        self.lock().pending = true;
    }

    /// Wakes the driver task, whoever drives (a caller's pass ended the connection: the task
    /// ends at its next poll).
    pub(crate) fn wake_task(&self) {
        let waker = self.lock().task.clone();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The driver has ended: no waker is kept (a task's waker would keep its allocation alive
    /// as long as anything holds this route).
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.task = None;
        inner.caller = None;
    }

    /// A task woken to run a pass found the connection held by another.
    pub(crate) fn missed(&self) {
        self.lock().missed = true;
    }

    /// The connection was released: if a task missed its pass meanwhile, the route is woken
    /// again (its current target runs the pass).
    pub(crate) fn released(self: &Arc<Self>) {
        let missed = std::mem::take(&mut self.lock().missed);
        if missed {
            self.wake_by_ref();
        }
    }

    /// Times the driver task was polled (each a wake-up), whether it ran a pass or found a
    /// caller driving.
    pub(crate) fn task_polls(&self) -> u64 {
        self.lock().task_polls
    }

    /// Whether a caller drives the connection now (for tests).
    #[cfg(test)]
    fn driven_by(&self) -> Option<u64> {
        self.lock().caller.as_ref().map(|(id, _)| *id)
    }
}

impl Wake for Route {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waker = {
            let mut inner = self.lock();
            inner.pending = true;
            match &inner.caller {
                Some((_, w)) => Some(w.clone()),
                None => inner.task.clone(),
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_wakers::CountWakes;

    #[test]
    fn wake_ups_go_to_the_driving_caller_and_back_to_the_task() {
        let route = Arc::new(Route::default());
        let (task, task_waker) = CountWakes::waker();
        let (caller, caller_waker) = CountWakes::waker();
        let waker = route.waker();
        route.task_pass(&task_waker);
        waker.wake_by_ref();
        assert_eq!((task.count(), caller.count()), (1, 0), "no caller drives: the task");
        route.caller_pass(7, &caller_waker);
        assert_eq!(route.driven_by(), Some(7));
        waker.wake_by_ref();
        assert_eq!((task.count(), caller.count()), (1, 1), "the driving caller");
        // The caller ran a pass after that wake-up, then its call ended: nothing to hand on.
        route.caller_pass(7, &caller_waker);
        route.caller_done(7);
        assert_eq!((task.count(), caller.count()), (1, 1));
        waker.wake_by_ref();
        assert_eq!((task.count(), caller.count()), (2, 1), "back to the task");
    }

    #[test]
    fn a_wake_up_the_caller_did_not_handle_goes_on_to_the_task() {
        let route = Arc::new(Route::default());
        let (task, task_waker) = CountWakes::waker();
        let (caller, caller_waker) = CountWakes::waker();
        route.task_pass(&task_waker);
        route.caller_pass(3, &caller_waker);
        route.waker().wake();
        assert_eq!((task.count(), caller.count()), (0, 1));
        // Woken, the caller found its result without another pass (or was dropped).
        route.caller_done(3);
        assert_eq!((task.count(), caller.count()), (1, 1), "the pending wake-up is handed on");
        route.caller_done(3);
        assert_eq!(task.count(), 1, "only the driving caller's end counts, once");
        // Another call's end does not take the role from the driving one.
        route.caller_pass(4, &caller_waker);
        route.caller_done(5);
        assert_eq!(route.driven_by(), Some(4));
    }

    #[test]
    fn the_task_waits_while_a_caller_drives_and_gets_what_it_left_unfinished() {
        let route = Arc::new(Route::default());
        let (task, task_waker) = CountWakes::waker();
        let (caller, caller_waker) = CountWakes::waker();
        // The task's first poll comes while a caller already drives: no pass, but its waker is
        // kept for the hand-back.
        route.caller_pass(9, &caller_waker);
        assert!(!route.task_pass(&task_waker), "a caller drives: the task runs no pass");
        // The caller's pass stopped at its result without confirming the connection is idle.
        route.unfinished();
        assert_eq!((task.count(), caller.count()), (0, 0), "nobody is woken for it yet");
        route.caller_done(9);
        assert_eq!(task.count(), 1, "the task runs the rest");
        assert!(route.task_pass(&task_waker), "nobody drives: the task runs its pass");
        route.caller_done(9);
        assert_eq!(task.count(), 1, "handed on once");
    }

    #[test]
    fn a_caller_takes_an_armed_connection_only_if_no_wake_up_came() {
        let route = Arc::new(Route::default());
        let (task, task_waker) = CountWakes::waker();
        let (caller, caller_waker) = CountWakes::waker();
        route.task_pass(&task_waker);
        // Nothing came since the task's pass: the caller takes the role without a pass.
        assert!(route.caller_arm(1, &caller_waker));
        assert_eq!(route.driven_by(), Some(1));
        route.waker().wake_by_ref();
        assert_eq!((task.count(), caller.count()), (0, 1), "wake-ups go to the caller");
        route.caller_pass(1, &caller_waker);
        route.caller_done(1);
        // A wake-up came (it went to the task, nobody driving): the next caller must run a pass,
        // which takes the role and the wake-up with it.
        route.waker().wake_by_ref();
        assert_eq!(task.count(), 1);
        assert!(!route.caller_arm(2, &caller_waker), "a wake-up is pending");
        assert_eq!(route.driven_by(), None, "the role is taken by the pass, not here");
        route.caller_pass(2, &caller_waker);
        assert_eq!(route.driven_by(), Some(2));
        route.caller_done(2);
        assert_eq!(task.count(), 1, "the pass took the pending wake-up: nothing to hand on");
    }

    #[test]
    fn a_missed_pass_wakes_the_route_when_the_connection_is_released() {
        let route = Arc::new(Route::default());
        let (task, task_waker) = CountWakes::waker();
        route.task_pass(&task_waker);
        route.released();
        assert_eq!(task.count(), 0, "nothing missed: no wake-up");
        route.missed();
        route.released();
        assert_eq!(task.count(), 1);
        route.released();
        assert_eq!(task.count(), 1, "a miss is handed on once");
    }
}

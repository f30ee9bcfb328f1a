//! The tasks a server connection runs its handlers in, kept from one handler to the next.
//!
//! A handler that waits (or that `ServerConfig::inline_handlers` does not poll in the driver)
//! runs in a task of its own. Spawning one per handler costs its allocation, tokio's setting up and
//! tearing down of the task, and the free: about 1,300 instructions a call. Instead a task that
//! finished its handler stays, idle, and the connection hands it the next one: the handler
//! goes in the task's mailbox and the task is notified.
//!
//! A cancelled handler's task is aborted (its handler dropped where it stands, as a spawned
//! handler's task was) and not reused. A connection keeps at most [`IDLE_TASKS`] idle tasks;
//! dropping the pool aborts them.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;
use tracing::Span;

use super::server::{handler_answer, HandlerResult, HandlerSlot};
use crate::future_slot::ServiceFuture;

/// Idle handler tasks a connection keeps (each a few hundred bytes: tokio's task and the
/// mailbox); more finishing at once are ended.
pub(super) const IDLE_TASKS: usize = 64;

/// A handler handed to a task: its call id and spawn number (for its result), its future, its
/// server-wide slot (given back when it ends) and its call's span (entered around its polls).
pub(super) struct Job {
    pub call_id: u64,
    pub spawn: u64,
    pub fut: ServiceFuture,
    pub slot: HandlerSlot,
    pub span: Span,
}

/// Where a task waits for its next job.
#[derive(Default)]
struct Mailbox {
    job: Mutex<Option<Job>>,
    /// Notified when a job is put in; a notification that finds the task busy is kept for its
    /// next wait (`Notify::notify_one`'s permit), so none is lost.
    ready: Notify,
}

/// One handler task: its mailbox and how to abort it.
pub(super) struct HandlerTask {
    mailbox: Arc<Mailbox>,
    abort: AbortHandle,
}

impl HandlerTask {
    /// Ends the task, dropping the handler it runs (cancelled, or the connection gone).
    pub(super) fn abort(&self) {
        self.abort.abort();
    }
}

/// A connection's idle handler tasks, and where their results go.
pub(super) struct HandlerTasks {
    idle: Vec<HandlerTask>,
    results: mpsc::UnboundedSender<HandlerResult>,
}

impl HandlerTasks {
    pub(super) fn new(results: mpsc::UnboundedSender<HandlerResult>) -> Self {
        HandlerTasks { idle: Vec::new(), results }
    }

    /// Runs `job` in an idle task, or in a new one; returns the task (busy until its result is
    /// taken: then [`HandlerTasks::idle_again`]).
    pub(super) fn run(&mut self, job: Job) -> HandlerTask {
        let task = self.idle.pop().unwrap_or_else(|| self.spawn());
        let mut mailbox = task.mailbox.job.lock();
        // An idle task took its last job out before running it.
        debug_assert!(mailbox.is_none(), "a job handed to a busy task");
        *mailbox = Some(job);
        drop(mailbox);
        task.mailbox.ready.notify_one();
        task
    }

    /// `task` sent its handler's result and waits for the next: kept for it, or ended beyond
    /// [`IDLE_TASKS`].
    pub(super) fn idle_again(&mut self, task: HandlerTask) {
        if self.idle.len() < IDLE_TASKS {
            self.idle.push(task);
        } else {
            task.abort();
        }
    }

    fn spawn(&self) -> HandlerTask {
        let mailbox = Arc::new(Mailbox::default());
        let (inbox, results) = (mailbox.clone(), self.results.clone());
        let handle = tokio::spawn(async move {
            loop {
                let job = loop {
                    if let Some(job) = inbox.job.lock().take() {
                        break job;
                    }
                    inbox.ready.notified().await;
                };
                let Job { call_id, spawn, mut fut, slot, span } = job;
                let caught = std::future::poll_fn(|cx| span.in_scope(|| fut.poll(cx))).await;
                let sent = span.in_scope(|| results.send((call_id, spawn, handler_answer(caught), fut)));
                // The slot goes back once the answer is on its way, as a spawned handler's did
                // when its task ended.
                drop(slot);
                if sent.is_err() {
                    return; // the connection is gone
                }
            }
        });
        HandlerTask { mailbox, abort: handle.abort_handle() }
    }
}

#[cfg(test)]
impl HandlerTasks {
    fn idle_tasks(&self) -> usize {
        self.idle.len()
    }
}

impl Drop for HandlerTasks {
    fn drop(&mut self) {
        for task in self.idle.drain(..) {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::context;
    use crate::future_slot::HandlerBoxes;

    fn ctx() -> context::Context {
        context::Context::new_in(None, "T.m", 1, 1, &Arc::from("peer"), None, context::Metadata::new())
    }

    fn pool() -> rpc_transport::MemPool {
        rpc_transport::MemPool::heap(rpc_transport::PoolLimits::default())
    }

    /// A pool of handler tasks, their boxes and `permits` handler slots, and the receiving end
    /// of the pool's results.
    fn setup(
        permits: usize,
    ) -> (HandlerTasks, HandlerBoxes, Arc<Semaphore>, mpsc::UnboundedReceiver<HandlerResult>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (HandlerTasks::new(tx), HandlerBoxes::default(), Arc::new(Semaphore::new(permits)), rx)
    }

    /// `n` jobs at once, each a handler that answers its call id after a yield (so that all
    /// are running together); returns their tasks, busy.
    fn run_jobs(
        tasks: &mut HandlerTasks,
        boxes: &mut HandlerBoxes,
        slots: &Arc<Semaphore>,
        n: u64,
    ) -> Vec<HandlerTask> {
        (0..n)
            .map(|call_id| {
                let fut = boxes.slot(ctx(), pool()).put(async move {
                    tokio::task::yield_now().await;
                    Ok(Bytes::from(call_id.to_string()))
                });
                let slot = HandlerSlot::for_test(slots);
                tasks.run(Job { call_id, spawn: call_id, fut, slot, span: Span::none() })
            })
            .collect()
    }

    #[tokio::test]
    async fn finished_tasks_wait_for_the_next_handler_and_at_most_idle_tasks_of_them_are_kept() {
        let (mut tasks, mut boxes, slots, mut rx) = setup(1000);
        // More handlers at once than the idle tasks kept.
        let n = IDLE_TASKS as u64 + 36;
        let busy = run_jobs(&mut tasks, &mut boxes, &slots, n);
        let mut answered = Vec::new();
        for _ in 0..n {
            let (call_id, spawn, answer, fut) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("every handler answers")
                .expect("the channel is open");
            assert_eq!((spawn, answer.unwrap()), (call_id, Bytes::from(call_id.to_string())));
            boxes.give_back(fut);
            answered.push(call_id);
        }
        answered.sort_unstable();
        assert_eq!(answered, (0..n).collect::<Vec<_>>());
        // Each slot goes back once its answer is sent.
        while slots.available_permits() < 1000 {
            tokio::task::yield_now().await;
        }
        for task in busy {
            tasks.idle_again(task);
        }
        assert_eq!(tasks.idle_tasks(), IDLE_TASKS, "the rest are ended");
        // The idle ones run the next handlers: as many again at once, all answered, and the
        // same tasks are idle afterwards (none spawned: the pool held them all).
        let busy = run_jobs(&mut tasks, &mut boxes, &slots, IDLE_TASKS as u64);
        assert_eq!(tasks.idle_tasks(), 0);
        for _ in 0..IDLE_TASKS {
            let (_, _, answer, fut) = rx.recv().await.expect("the channel is open");
            assert!(answer.is_ok());
            boxes.give_back(fut);
        }
        for task in busy {
            tasks.idle_again(task);
        }
        assert_eq!(tasks.idle_tasks(), IDLE_TASKS);
        // Dropping the pool (its connection gone) ends the idle tasks: the last senders of
        // results, which they hold, go with them.
        drop(tasks);
        let closed = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        assert!(matches!(closed, Ok(None)), "every idle task ended");
    }

    #[tokio::test]
    async fn an_aborted_task_drops_its_handler_and_gives_its_slot_back() {
        let (mut tasks, mut boxes, slots, mut rx) = setup(1);
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        let fut = boxes.slot(ctx(), pool()).put(async move {
            let _dropped = dropped_tx; // dropped with the handler
            futures::future::pending::<()>().await;
            Ok(Bytes::new())
        });
        let slot = HandlerSlot::for_test(&slots);
        let task = tasks.run(Job { call_id: 7, spawn: 1, fut, slot, span: Span::none() });
        tokio::task::yield_now().await;
        assert_eq!(slots.available_permits(), 0, "held while the handler runs");
        task.abort();
        assert!(dropped_rx.await.is_err(), "the handler was dropped, not finished");
        let permit = tokio::time::timeout(Duration::from_secs(10), slots.acquire()).await;
        assert!(permit.is_ok(), "its slot came back");
        assert!(rx.try_recv().is_err(), "no answer from an aborted handler");
    }
}

//! The tasks a server connection runs its handlers in, kept from one handler to the next.
//!
//! A handler that waits (or every handler, when `ServerConfig::inline_handlers` is off) runs in
//! a task of its own. Spawning one per handler costs its allocation, tokio's setting up and
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

impl Drop for HandlerTasks {
    fn drop(&mut self) {
        for task in self.idle.drain(..) {
            task.abort();
        }
    }
}

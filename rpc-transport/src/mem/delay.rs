//! A per-connection FIFO of delayed work, so that injected completion delays keep the order of
//! a reliable connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

type Job = Box<dyn FnOnce() + Send>;

/// Runs jobs at or after their due time, strictly in submission order.
#[derive(Debug, Default)]
pub(crate) struct DelayLine {
    tx: Option<mpsc::UnboundedSender<(Instant, Job)>>,
    /// Jobs submitted and not yet run.
    queued: Arc<AtomicUsize>,
}

impl DelayLine {
    /// Whether no job waits: a job without delay would run at once.
    pub(crate) fn is_idle(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }

    /// Runs `job` after `delay`: at once if there is no delay and nothing is waiting, otherwise
    /// behind every job submitted before it. Without a tokio runtime a delay cannot be honoured
    /// and the job runs at once.
    pub(crate) fn run(&mut self, delay: Duration, job: impl FnOnce() + Send + 'static) {
        if delay.is_zero() && self.queued.load(Ordering::Acquire) == 0 {
            return job();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("mem fault plan: completion delay needs a tokio runtime; not delayed");
            return job();
        };
        let queued = &self.queued;
        let tx = self.tx.get_or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            runtime.spawn(run_jobs(rx, queued.clone()));
            tx
        });
        self.queued.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError((_, job))) = tx.send((Instant::now() + delay, Box::new(job))) {
            // The runner is gone (its runtime shut down): run the job now rather than lose it.
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.tx = None;
            job();
        }
    }
}

async fn run_jobs(mut rx: mpsc::UnboundedReceiver<(Instant, Job)>, queued: Arc<AtomicUsize>) {
    while let Some((due, job)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        job();
        queued.fetch_sub(1, Ordering::AcqRel);
    }
}

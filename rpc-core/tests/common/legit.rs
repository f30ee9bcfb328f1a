//! A legitimate client that keeps calling while an attack runs, and checks every answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use super::kv::KvClient;

/// What the legitimate client saw.
#[derive(Debug, Default, Clone)]
pub struct LegitReport {
    /// Calls answered correctly.
    pub ok: u64,
    /// Calls answered with the wrong value.
    pub wrong: u64,
    /// Calls that failed or did not answer within the per-call bound (first few kept).
    pub failed: u64,
    /// The first failures, for the report.
    pub failures: Vec<String>,
    /// The slowest call.
    pub max_latency: Duration,
}

impl LegitReport {
    /// Every call answered correctly, and at least one was made.
    pub fn all_ok(&self) -> bool {
        self.ok > 0 && self.wrong == 0 && self.failed == 0
    }

    /// One line for a table.
    pub fn summary(&self) -> String {
        if self.all_ok() {
            format!("yes ({} calls, max {:?})", self.ok, self.max_latency)
        } else {
            format!(
                "NO ({} ok, {} wrong, {} failed, max {:?}; {})",
                self.ok,
                self.wrong,
                self.failed,
                self.max_latency,
                self.failures.first().map_or("", String::as_str)
            )
        }
    }
}

/// Each call of the legitimate client must answer within this.
pub const PER_CALL: Duration = Duration::from_secs(10);

/// A running legitimate client: stop it to get its report.
#[derive(Debug)]
pub struct Legit {
    stop: Arc<AtomicBool>,
    task: JoinHandle<LegitReport>,
}

impl Legit {
    /// Starts calling `kv`: put then get of a small value every ~10 ms, and every 8th round a
    /// `big`-byte value (rendezvous when above the eager threshold).
    pub fn start(kv: KvClient, tag: &str, big: usize) -> Legit {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let tag = tag.to_string();
        let task = tokio::spawn(async move {
            let mut report = LegitReport::default();
            let mut round = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let len = if round % 8 == 7 { big } else { 100 };
                let key = format!("legit-{tag}-{}", round % 4);
                let value = Bytes::from(vec![(round % 251) as u8; len]);
                let started = Instant::now();
                let put = timeout(PER_CALL, kv.put(key.clone(), value.clone())).await;
                let got = match put {
                    Ok(Ok(_)) => timeout(PER_CALL, kv.get(key)).await,
                    Ok(Err(e)) => Ok(Err(e)),
                    Err(e) => Err(e),
                };
                report.max_latency = report.max_latency.max(started.elapsed());
                match got {
                    Ok(Ok(Some(v))) if v == value => report.ok += 1,
                    Ok(Ok(other)) => {
                        report.wrong += 1;
                        report.failures.push(format!("wrong value: {:?} bytes", other.map(|v| v.len())));
                    }
                    Ok(Err(e)) => {
                        report.failed += 1;
                        report.failures.push(format!("call failed: {e}"));
                    }
                    Err(_) => {
                        report.failed += 1;
                        report.failures.push(format!("no answer within {PER_CALL:?}"));
                    }
                }
                report.failures.truncate(4);
                round += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            report
        });
        Legit { stop, task }
    }

    /// Stops the client (after its current call) and returns its report.
    pub async fn finish(self) -> LegitReport {
        self.stop.store(true, Ordering::Relaxed);
        match timeout(PER_CALL * 3, self.task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                LegitReport { failed: 1, failures: vec![format!("legit task: {e}")], ..Default::default() }
            }
            Err(_) => LegitReport {
                failed: 1,
                failures: vec!["legit task did not stop".into()],
                ..Default::default()
            },
        }
    }
}

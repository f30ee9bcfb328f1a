//! The closed-loop load generator: `connections` client connections, `tasks` tasks on each, and
//! `outstanding` calls in flight per task; every completed call is timed into an HDR histogram
//! and immediately replaced until the budget (a call count or a duration) is spent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use rpc_core::{CallInfo, Path};
use serde::Serialize;

use crate::counters::Counters;
use crate::cpu::{CpuPerCall, CpuProbe};
use crate::target::{ProtoSettings, Target};
use crate::workload::Workload;
use crate::BenchError;

/// How many calls are in flight, and over what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Concurrency {
    /// Client connections.
    pub connections: usize,
    /// Client tasks per connection.
    pub tasks: usize,
    /// Calls in flight per task.
    pub outstanding: usize,
}

impl Concurrency {
    /// One call at a time on one connection: the latency configuration.
    pub const SERIAL: Concurrency = Concurrency { connections: 1, tasks: 1, outstanding: 1 };

    /// Calls in flight in total.
    pub fn in_flight(&self) -> usize {
        self.connections * self.tasks * self.outstanding
    }
}

/// When a phase ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// After this many calls (over all tasks).
    Calls(u64),
    /// After this long (calls issued before the end still complete).
    Time(Duration),
}

/// How often each path combination was taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PathTally {
    /// Request eager, response eager.
    pub eager_eager: u64,
    /// Request eager, response rendezvous.
    pub eager_rendezvous: u64,
    /// Request rendezvous, response eager.
    pub rendezvous_eager: u64,
    /// Request rendezvous, response rendezvous.
    pub rendezvous_rendezvous: u64,
}

impl PathTally {
    fn count(&mut self, info: CallInfo) {
        let slot = match (info.request, info.response) {
            (Path::Eager, Path::Eager) => &mut self.eager_eager,
            (Path::Eager, Path::Rendezvous) => &mut self.eager_rendezvous,
            (Path::Rendezvous, Path::Eager) => &mut self.rendezvous_eager,
            (Path::Rendezvous, Path::Rendezvous) => &mut self.rendezvous_rendezvous,
        };
        *slot += 1;
    }

    fn add(&mut self, o: &PathTally) {
        self.eager_eager += o.eager_eager;
        self.eager_rendezvous += o.eager_rendezvous;
        self.rendezvous_eager += o.rendezvous_eager;
        self.rendezvous_rendezvous += o.rendezvous_rendezvous;
    }

    /// The dominant combination, as `E/E`, `E/R`, `R/E`, `R/R` (request/response); `mixed` if
    /// none has all the calls.
    pub fn label(&self) -> &'static str {
        let all =
            self.eager_eager + self.eager_rendezvous + self.rendezvous_eager + self.rendezvous_rendezvous;
        match all {
            0 => "-",
            n if n == self.eager_eager => "E/E",
            n if n == self.eager_rendezvous => "E/R",
            n if n == self.rendezvous_eager => "R/E",
            n if n == self.rendezvous_rendezvous => "R/R",
            _ => "mixed",
        }
    }
}

/// What one measured phase produced.
#[derive(Debug)]
pub struct Measured {
    /// Latency of every call, in nanoseconds.
    pub histogram: Histogram<u64>,
    /// Calls completed.
    pub calls: u64,
    /// From the first call issued to the last completed.
    pub elapsed: Duration,
    /// Paths taken.
    pub paths: PathTally,
    /// rpc-core client counters over the point's connections (warm-up included).
    pub counters: Option<Counters>,
    /// CPU time per call of the measured phase (not the warm-up).
    pub cpu: Option<CpuPerCall>,
}

impl Measured {
    /// One completed call.
    fn record(&mut self, latency: Duration, info: CallInfo) {
        self.histogram.saturating_record(latency.as_nanos().min(u64::MAX as u128) as u64);
        self.calls += 1;
        self.paths.count(info);
    }
}

/// One point to measure.
#[derive(Debug, Clone, Copy)]
pub struct PointSpec {
    /// The call.
    pub workload: Workload,
    /// Its size in bytes.
    pub size: usize,
    /// Calls in flight.
    pub concurrency: Concurrency,
    /// Warm-up, not measured.
    pub warmup: Budget,
    /// The measured phase.
    pub budget: Budget,
}

/// Connects, warms up, measures one point, and closes its connections. `server_pid`: the
/// server's child process, whose CPU time per call is measured with this one's.
pub async fn measure<T: Target>(
    addr: &str,
    settings: &ProtoSettings,
    spec: &PointSpec,
    server_pid: Option<u32>,
) -> Result<Measured, BenchError> {
    let mut targets = Vec::with_capacity(spec.concurrency.connections);
    for _ in 0..spec.concurrency.connections.max(1) {
        targets.push(T::connect(addr, settings).await?);
    }
    let prepared = Arc::new(targets[0].prepare(spec.workload, spec.size)?);
    run_phase(&targets, &prepared, spec.concurrency, spec.warmup).await?;
    let cpu = CpuProbe::start(server_pid);
    let mut measured = run_phase(&targets, &prepared, spec.concurrency, spec.budget).await?;
    measured.cpu = cpu.per_call(measured.calls);
    for t in &targets {
        if let Some(c) = t.counters().await {
            measured.counters.get_or_insert_with(Counters::default).add(&c);
        }
    }
    Ok(measured)
}

/// Decides, call by call, whether another may be issued.
#[derive(Debug, Clone)]
struct Gate {
    issued: Arc<AtomicU64>,
    limit: u64,
    deadline: Option<Instant>,
}

impl Gate {
    fn new(budget: Budget) -> Gate {
        let (limit, deadline) = match budget {
            Budget::Calls(n) => (n, None),
            Budget::Time(d) => (u64::MAX, Some(Instant::now() + d)),
        };
        Gate { issued: Arc::new(AtomicU64::new(0)), limit, deadline }
    }

    /// Whether another call may go: one more of the call budget, or the time budget not spent,
    /// as of `now` if the caller just read the clock (a clock read is a system call in the
    /// project's VM).
    fn admit_at(&self, now: Option<Instant>) -> bool {
        match self.deadline {
            Some(at) => now.unwrap_or_else(Instant::now) < at,
            None => self.issued.fetch_add(1, Ordering::Relaxed) < self.limit,
        }
    }
}

async fn run_phase<T: Target>(
    targets: &[T],
    prepared: &Arc<T::Prepared>,
    conc: Concurrency,
    budget: Budget,
) -> Result<Measured, BenchError> {
    let gate = Gate::new(budget);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for target in targets {
        for _ in 0..conc.tasks.max(1) {
            let (t, p, g) = (target.clone(), prepared.clone(), gate.clone());
            tasks.push(tokio::spawn(drive(t, p, conc.outstanding.max(1), g)));
        }
    }
    let mut total = Measured {
        histogram: new_histogram(),
        calls: 0,
        elapsed: Duration::ZERO,
        paths: PathTally::default(),
        counters: None,
        cpu: None,
    };
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(part)) => {
                total.histogram.add(&part.histogram).map_err(|e| BenchError::Call(e.to_string()))?;
                total.calls += part.calls;
                total.paths.add(&part.paths);
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(join) => {
                first_error.get_or_insert(BenchError::Call(format!("load task died: {join}")));
            }
        }
    }
    total.elapsed = start.elapsed();
    match first_error {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// A histogram of nanoseconds with 3 significant digits that grows as needed.
pub fn new_histogram() -> Histogram<u64> {
    // Constant, valid bounds: creation cannot fail.
    let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds");
    h.auto(true);
    h
}

/// One call: its latency, its outcome and the moment it ended.
async fn timed_call<T: Target>(t: &T, p: &T::Prepared) -> (Duration, Result<CallInfo, BenchError>, Instant) {
    let start = Instant::now();
    let result = t.call(p).await;
    let end = Instant::now();
    (end - start, result, end)
}

/// One client task: keeps `outstanding` calls in flight while the gate admits more.
///
/// Each of the `outstanding` calls in flight is a lane: a loop that issues its next call as soon
/// as its last one ends, pushed once into a `FuturesUnordered`. Pushing each call instead (a node
/// allocated and the call's future moved into it) is the harness's own work, and it grows with
/// the size of a system's call future: at 64 in flight it cost 431 instructions a call with
/// rpc-core and 1,762 with tarpc.
async fn drive<T: Target>(
    target: T,
    prepared: Arc<T::Prepared>,
    outstanding: usize,
    gate: Gate,
) -> Result<Measured, BenchError> {
    let mut out = Measured {
        histogram: new_histogram(),
        calls: 0,
        elapsed: Duration::ZERO,
        paths: PathTally::default(),
        counters: None,
        cpu: None,
    };
    let (t, p, g) = (&target, &*prepared, &gate);
    if outstanding <= 1 {
        // One call at a time: one lane, recording straight into `out`.
        lane(t, p, g, |latency, info| out.record(latency, info)).await?;
        return Ok(out);
    }
    // The lanes take turns on one task: the lock is never contended (two atomic instructions a
    // call), and it lets every lane record into one histogram.
    let shared = Mutex::new(out);
    let record = |latency, info| shared.lock().unwrap_or_else(PoisonError::into_inner).record(latency, info);
    let mut lanes: FuturesUnordered<_> = (0..outstanding).map(|_| lane(t, p, g, record)).collect();
    while let Some(ended) = lanes.next().await {
        // A failed call ends the task at once (the other lanes' calls are dropped).
        ended?;
    }
    drop(lanes);
    Ok(shared.into_inner().unwrap_or_else(PoisonError::into_inner))
}

/// One call after another while the gate admits them, each recorded as it ends; the gate reuses
/// the clock reading that ended the call. Returns at the first failed call.
async fn lane<T: Target>(
    t: &T,
    p: &T::Prepared,
    gate: &Gate,
    mut record: impl FnMut(Duration, CallInfo),
) -> Result<(), BenchError> {
    let mut now = None;
    while gate.admit_at(now) {
        let (latency, result, end) = timed_call(t, p).await;
        record(latency, result?);
        now = Some(end);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target whose calls take turns on the runtime (one yield each) and fail from call
    /// `fail_at` on; it counts calls started and the most in flight at once.
    #[derive(Clone)]
    struct Fake {
        started: Arc<AtomicU64>,
        in_flight: Arc<AtomicU64>,
        most: Arc<AtomicU64>,
        fail_at: u64,
    }

    impl Fake {
        fn new(fail_at: u64) -> Fake {
            let zero = || Arc::new(AtomicU64::new(0));
            Fake { started: zero(), in_flight: zero(), most: zero(), fail_at }
        }
    }

    impl Target for Fake {
        type Prepared = ();

        async fn connect(_: &str, _: &ProtoSettings) -> Result<Self, BenchError> {
            Ok(Fake::new(u64::MAX))
        }

        fn prepare(&self, _: Workload, _: usize) -> Result<(), BenchError> {
            Ok(())
        }

        async fn call(&self, _: &()) -> Result<CallInfo, BenchError> {
            let n = self.started.fetch_add(1, Ordering::Relaxed) + 1;
            let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
            self.most.fetch_max(now, Ordering::Relaxed);
            tokio::task::yield_now().await;
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            if n >= self.fail_at {
                return Err(BenchError::Call(format!("call {n} failed")));
            }
            Ok(CallInfo::default())
        }

        async fn counters(&self) -> Option<Counters> {
            None
        }
    }

    #[tokio::test]
    async fn lanes_keep_the_calls_in_flight_and_record_exactly_the_budget() {
        for outstanding in [1, 2, 8, 64] {
            let fake = Fake::new(u64::MAX);
            let out = drive(fake.clone(), Arc::new(()), outstanding, Gate::new(Budget::Calls(1000)))
                .await
                .expect("no call fails");
            assert_eq!(out.calls, 1000, "{outstanding} in flight");
            assert_eq!(out.histogram.len(), 1000);
            assert_eq!(fake.started.load(Ordering::Relaxed), 1000, "no call beyond the budget");
            assert_eq!(
                fake.most.load(Ordering::Relaxed),
                outstanding as u64,
                "{outstanding} in flight at once"
            );
            assert_eq!(fake.in_flight.load(Ordering::Relaxed), 0);
        }
    }

    #[tokio::test]
    async fn a_failed_call_ends_the_task_with_its_error() {
        for outstanding in [1, 8] {
            let fake = Fake::new(50);
            let Err(err) =
                drive(fake.clone(), Arc::new(()), outstanding, Gate::new(Budget::Calls(1000))).await
            else {
                panic!("call 50 fails");
            };
            assert!(err.to_string().contains("failed"), "{err}");
            // The lanes stop: no more than the calls in flight when the 50th ended were started.
            assert!(fake.started.load(Ordering::Relaxed) < 50 + outstanding as u64);
        }
    }

    #[test]
    fn gate_admits_exactly_the_call_budget() {
        let g = Gate::new(Budget::Calls(3));
        let g2 = g.clone();
        assert!(g.admit_at(None) && g2.admit_at(None) && g.admit_at(None));
        assert!(!g2.admit_at(None));
        assert!(!g.admit_at(None));
    }

    #[test]
    fn gate_closes_after_the_time_budget() {
        let g = Gate::new(Budget::Time(Duration::ZERO));
        assert!(!g.admit_at(None));
        assert!(Gate::new(Budget::Time(Duration::from_secs(60))).admit_at(None));
    }

    #[test]
    fn path_labels_name_the_single_combination_or_mixed() {
        let mut t = PathTally::default();
        assert_eq!(t.label(), "-");
        t.count(CallInfo { request: Path::Rendezvous, response: Path::Eager });
        assert_eq!(t.label(), "R/E");
        t.count(CallInfo::default());
        assert_eq!(t.label(), "mixed");
    }

    #[test]
    fn histogram_takes_large_latencies() {
        let mut h = new_histogram();
        h.saturating_record(10);
        h.saturating_record(30_000_000_000);
        h.saturating_record(u64::MAX);
        assert_eq!(h.len(), 3);
        assert!(h.max() >= 29_000_000_000);
    }
}

//! Per-method metrics through the `metrics` facade, client and server: calls, errors by kind,
//! and a duration histogram. This binary installs its own recorder (one per process).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use rpc_core::{CallError, CallOptions, Client, ClientConfig, InlineHandlers, Server, ServerConfig};

/// Counter values, and histogram sample counts and largest samples, by `name{label=value,..}`.
#[derive(Default)]
struct Recorded {
    counters: Mutex<BTreeMap<String, Arc<Value>>>,
    histograms: Mutex<BTreeMap<String, Arc<Value>>>,
}

#[derive(Default)]
struct Value(AtomicU64, AtomicU64);

impl metrics::CounterFn for Value {
    fn increment(&self, v: u64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    fn absolute(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
}

impl metrics::HistogramFn for Value {
    /// Counts the sample and keeps the largest (in millionths).
    fn record(&self, v: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
        self.1.fetch_max((v * 1e6) as u64, Ordering::Relaxed);
    }
}

fn key_string(key: &Key) -> String {
    let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

#[derive(Clone)]
struct TestRecorder(Arc<Recorded>);

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.counters.lock().unwrap().entry(key_string(key)).or_default().clone())
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.0.histograms.lock().unwrap().entry(key_string(key)).or_default().clone())
    }
}

fn recorded() -> &'static Arc<Recorded> {
    static RECORDED: OnceLock<Arc<Recorded>> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorded = Arc::new(Recorded::default());
        metrics::set_global_recorder(TestRecorder(recorded.clone())).expect("the only recorder");
        recorded
    })
}

fn counter(key: &str) -> u64 {
    recorded().counters.lock().unwrap().get(key).map_or(0, |v| v.0.load(Ordering::Relaxed))
}

fn samples(key: &str) -> u64 {
    recorded().histograms.lock().unwrap().get(key).map_or(0, |v| v.0.load(Ordering::Relaxed))
}

/// The largest sample of a histogram of seconds.
fn largest(key: &str) -> Duration {
    let micros = recorded().histograms.lock().unwrap().get(key).map_or(0, |v| v.1.load(Ordering::Relaxed));
    Duration::from_micros(micros)
}

#[rpc_core::service]
pub trait Timer {
    async fn echo(&self, data: Bytes) -> Bytes;
    async fn sleep(&self, millis: u64);
    /// Blocks its thread for `millis`: a handler that finishes in its first poll (it runs in
    /// the connection's driver with `inline_handlers`).
    async fn busy(&self, millis: u64);
    /// Used by one test only (the counters are per process).
    async fn add_one(&self, v: u64) -> u64;
}

struct TimerImpl;

impl Timer for TimerImpl {
    async fn echo(&self, data: Bytes) -> Bytes {
        data
    }
    async fn sleep(&self, millis: u64) {
        tokio::time::sleep(Duration::from_millis(millis)).await;
    }
    async fn busy(&self, millis: u64) {
        std::thread::sleep(Duration::from_millis(millis));
    }
    async fn add_one(&self, v: u64) -> u64 {
        v + 1
    }
}

/// Many calls answered together (64 requests in one round of the server's driver) are each
/// reported once, with inline handlers (answered in the driver as they start) and without
/// (answered as their tasks' results come back).
#[tokio::test]
async fn calls_answered_together_are_each_reported_once() {
    recorded();
    const CALLS: u64 = 64;
    let key = "rpc_server_call_duration_seconds{method=Timer.add_one}";
    for (round, inline) in [false, true].into_iter().enumerate() {
        let config = ServerConfig::default().inline_handlers(if inline {
            InlineHandlers::Always
        } else {
            InlineHandlers::Never
        });
        let server = Server::bind("tcp://127.0.0.1:0", config, TimerServer::new(TimerImpl)).await.unwrap();
        let client =
            Client::connect(&server.local_addr().to_string(), ClientConfig::default()).await.unwrap();
        let timer = TimerClient::new(client);
        let answers = futures::future::join_all((0..CALLS).map(|v| timer.add_one(v))).await;
        for (v, answer) in answers.into_iter().enumerate() {
            assert_eq!(answer, Ok(v as u64 + 1));
        }
        let expected = CALLS * (round as u64 + 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while samples(key) < expected {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server reported {} of {expected}",
                samples(key)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stats = server.stats();
        server.shutdown().await;
        assert_eq!(samples(key), expected, "each call reported once (inline handlers: {inline})");
        assert_eq!(counter("rpc_server_calls_total{method=Timer.add_one}"), expected);
        let (ran_inline, spawned) = (stats.handlers_inline, stats.handlers_spawned);
        assert_eq!(ran_inline + spawned, CALLS, "every handler ran once: {stats:?}");
        assert_eq!(ran_inline, if inline { CALLS } else { 0 }, "handlers run in the driver: {stats:?}");
    }
}

#[tokio::test]
async fn a_handler_run_in_the_driver_is_timed_to_its_end() {
    recorded();
    let config = ServerConfig::default().inline_handlers(InlineHandlers::Always);
    let server = Server::bind("tcp://127.0.0.1:0", config, TimerServer::new(TimerImpl)).await.unwrap();
    let client = Client::connect(&server.local_addr().to_string(), ClientConfig::default()).await.unwrap();
    TimerClient::new(client).busy(30).await.unwrap();
    let key = "rpc_server_call_duration_seconds{method=Timer.busy}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // Published when the server's driver has nothing more to do.
    while samples(key) == 0 || server.stats().handlers_inline == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the server counted the call, run in its driver");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(largest(key) >= Duration::from_millis(30), "timed to its end: {:?}", largest(key));
    server.shutdown().await;
}

#[tokio::test]
async fn calls_errors_and_durations_are_counted_per_method_on_both_sides() {
    recorded();
    let server = Server::bind("tcp://127.0.0.1:0", ServerConfig::default(), TimerServer::new(TimerImpl))
        .await
        .unwrap();
    let client = Client::connect(&server.local_addr().to_string(), ClientConfig::default()).await.unwrap();
    let timer = TimerClient::new(client.clone());
    for _ in 0..3 {
        timer.echo(Bytes::from_static(b"x")).await.unwrap();
    }
    let short = timer.with_options(CallOptions::new().deadline(Duration::from_millis(50)));
    assert_eq!(short.sleep(10_000).await, Err(CallError::DeadlineExceeded));
    let err = client.call(0xdead_beef, Bytes::new(), &CallOptions::new()).await.unwrap_err();
    assert_eq!(err.kind(), "remote_unknown_method");

    assert_eq!(counter("rpc_client_calls_total{method=Timer.echo}"), 3);
    assert_eq!(samples("rpc_client_call_duration_seconds{method=Timer.echo}"), 3);
    assert_eq!(counter("rpc_client_errors_total{method=Timer.echo,kind=deadline_exceeded}"), 0);
    assert_eq!(counter("rpc_client_errors_total{method=Timer.sleep,kind=deadline_exceeded}"), 1);
    assert_eq!(counter("rpc_client_errors_total{method=dynamic,kind=remote_unknown_method}"), 1);
    assert_eq!(counter("rpc_client_calls_total{method=dynamic}"), 1, "Client::call is counted as dynamic");
    // The server counts a call when it ends: the expired handler's end may trail the client's.
    // The client's deadline fires first (it counts from the call, the server's from the
    // request's arrival), so the client's cancel can reach a loaded server before its own timer
    // runs: the call then ends there as cancelled. Either way it is counted once, as an error.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let ended = || {
        counter("rpc_server_errors_total{method=Timer.sleep,kind=deadline_exceeded}")
            + counter("rpc_server_errors_total{method=Timer.sleep,kind=cancelled}")
    };
    while ended() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the server counted the expired call");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ended(), 1);
    assert_eq!(counter("rpc_server_calls_total{method=Timer.echo}"), 3);
    assert_eq!(samples("rpc_server_call_duration_seconds{method=Timer.echo}"), 3);
    assert_eq!(counter("rpc_server_errors_total{method=unknown,kind=unknown_method}"), 1);
    server.shutdown().await;
}

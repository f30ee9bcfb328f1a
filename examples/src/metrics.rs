//! A minimal in-process `metrics` recorder that prints a table: enough to see what rpc-core
//! records without running an exporter. In a service, install a real one instead, e.g.
//! `metrics_exporter_prometheus::PrometheusBuilder::new().install()?` (an HTTP endpoint that
//! Prometheus scrapes); rpc-core records through the `metrics` facade either way.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Counters and histograms (count, sum, max) by name and labels.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    counters: Mutex<BTreeMap<String, Arc<Count>>>,
    histograms: Mutex<BTreeMap<String, Arc<Samples>>>,
}

#[derive(Debug, Default)]
struct Count(AtomicU64);

impl metrics::CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

/// Count, sum and max of a histogram's samples.
#[derive(Debug, Default)]
struct Samples(Mutex<(u64, f64, f64)>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *s = (s.0 + 1, s.1 + value, s.2.max(value));
    }
}

/// `name{label=value,..}`.
fn key_string(key: &Key) -> String {
    let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Summary {
    /// Installs a new summary as the process's recorder; returns a handle to print it.
    pub fn install() -> Result<Summary, metrics::SetRecorderError<Summary>> {
        let summary = Summary::default();
        metrics::set_global_recorder(summary.clone())?;
        Ok(summary)
    }

    /// The value of counter `name{labels}` (0 if never incremented).
    pub fn counter(&self, key: &str) -> u64 {
        let counters = self.inner.counters.lock().unwrap_or_else(|e| e.into_inner());
        counters.get(key).map_or(0, |c| c.0.load(Ordering::Relaxed))
    }

    /// One line per counter and histogram (count, mean and max, in milliseconds for durations).
    pub fn report(&self) -> String {
        let mut out = String::new();
        for (key, count) in self.inner.counters.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "{key:<72} {}", count.0.load(Ordering::Relaxed));
        }
        for (key, samples) in self.inner.histograms.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let (n, sum, max) = *samples.0.lock().unwrap_or_else(|e| e.into_inner());
            let mean = if n == 0 { 0.0 } else { sum / n as f64 };
            let _ = writeln!(out, "{key:<72} n={n} mean={:.3}ms max={:.3}ms", mean * 1e3, max * 1e3);
        }
        out
    }
}

impl Recorder for Summary {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.inner.counters.lock().unwrap_or_else(|e| e.into_inner());
        Counter::from_arc(counters.entry(key_string(key)).or_default().clone())
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut histograms = self.inner.histograms.lock().unwrap_or_else(|e| e.into_inner());
        Histogram::from_arc(histograms.entry(key_string(key)).or_default().clone())
    }
}

//! Per-call tracing: one event per side at the end of a call, in a span that names the method,
//! with one trace id from the client to the handler. Over tcp on loopback.
//!
//! Alone in its test binary: the subscriber is the test thread's own (`set_default`), and
//! `tracing` caches whether a callsite is enabled for all threads at once. Another test hitting
//! the same callsites on another thread while this one installs its subscriber can leave them
//! cached as disabled (a race in `tracing`'s interest cache), and the call then goes untraced.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::whoami::{connect, serve, WhoamiClient, WhoamiImpl, WhoamiServer};

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// One thread: the thread-local subscriber sees the client, the server and the handlers.
#[tokio::test(flavor = "current_thread")]
async fn every_call_is_traced_by_name_on_both_sides_with_one_trace_id() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (server, addr) = serve(WhoamiServer::new(WhoamiImpl)).await;
    let client = WhoamiClient::new(connect(&addr).await);
    let seen = client.whoami(Bytes::from_static(b"hi")).await.expect("call");
    let trace = seen.trace_id.expect("a traced call carries a trace id to the handler");
    drop(client);
    server.shutdown().await;

    let log = out.text();
    let finished: Vec<&str> = log.lines().filter(|l| l.contains("call finished")).collect();
    assert_eq!(finished.len(), 2, "one event per side at the end of the call:\n{log}");
    for line in &finished {
        assert!(line.contains("call{method=Whoami.whoami "), "the call span names the method: {line}");
        assert!(line.contains(&format!("call_id={}", seen.call_id)), "{line}");
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains(&format!("trace_id={trace}")), "the span records the trace id: {line}");
        assert!(line.contains("duration_us=") && line.contains("outcome=\"ok\""), "{line}");
        assert!(line.contains("request_bytes=") && line.contains("response_bytes="), "{line}");
        assert!(line.contains("path=") && line.contains("peer=127.0.0.1:"), "{line}");
    }
    assert!(!log.contains("WARN"), "a graceful shutdown warns of nothing:\n{log}");
}

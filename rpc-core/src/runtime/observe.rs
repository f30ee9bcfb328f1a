//! What every call reports when it ends, on each side: one debug-level `tracing` event inside
//! its `call` span, and `metrics` (counters and a latency histogram per method).
//!
//! Metrics go through the [`metrics`] facade: nothing is recorded until the application installs
//! a recorder (e.g. `metrics-exporter-prometheus`), and then these are:
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `rpc_client_calls_total` | counter | `method` |
//! | `rpc_client_errors_total` | counter | `method`, `kind` ([`CallError::kind`]) |
//! | `rpc_client_call_duration_seconds` | histogram | `method` |
//! | `rpc_server_calls_total` | counter | `method` |
//! | `rpc_server_errors_total` | counter | `method`, `kind` (`handler`, `bad_request`, `unknown_method`, `cancelled`, `deadline_exceeded`, ..) |
//! | `rpc_server_call_duration_seconds` | histogram | `method` |
//! | `rpc_server_inline_stalls_total` | counter | `method`: handlers whose first poll in the connection's driver held it too long ([`ServerConfig::inline_stall`](crate::ServerConfig::inline_stall)) |
//!
//! A client's call lasts from the stub's call (or [`Client::call`](crate::Client::call)) to its
//! result. A server's lasts from the request's arrival to its answer: for a handler that finished
//! at once, in the connection's driver, until the answer was handed to the transport (or, when
//! other requests of the same batch were still to be answered, until it was made: it leaves with
//! theirs); for any other, until its handler ended.
//!
//! `method` is `"Service.method"`; an id the server does not know is `"unknown"`, and calls made
//! through [`Client::call`](crate::Client::call) directly (not a generated stub) are `"dynamic"`.
//!
//! Install the recorder before creating servers and making calls: the handles of each method are
//! registered once (a server's when it starts, a stub method's on its first call) and kept, so a
//! call costs no registration or label allocation.

use std::cell::Cell;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, IntoF64};
use tokio::time::Instant;
use tracing::Span;

use crate::error::CallError;
use crate::proto::{CallInfo, MethodId, Path, WireErrorCode};

/// A client method's metric handles, registered on first use. Generated stubs keep one in a
/// `static` per method.
#[derive(Debug)]
pub struct ClientMethod {
    name: &'static str,
    handles: OnceLock<(Counter, Histogram)>,
}

impl ClientMethod {
    /// The handles of `name` (`"Service.method"`), registered when first used.
    pub const fn new(name: &'static str) -> Self {
        ClientMethod { name, handles: OnceLock::new() }
    }

    /// `"Service.method"`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    fn handles(&self) -> &(Counter, Histogram) {
        self.handles.get_or_init(|| {
            (
                metrics::counter!("rpc_client_calls_total", "method" => self.name),
                metrics::histogram!("rpc_client_call_duration_seconds", "method" => self.name),
            )
        })
    }
}

/// Calls through [`Client::call`](crate::Client::call) directly.
static DYNAMIC: ClientMethod = ClientMethod::new("dynamic");

/// How a client call names its method: a stub's (with its metric handles), or a bare id.
#[derive(Debug, Clone, Copy)]
pub(crate) enum MethodName {
    Stub(&'static ClientMethod),
    Id(MethodId),
}

impl MethodName {
    fn metrics(self) -> &'static ClientMethod {
        match self {
            MethodName::Stub(m) => m,
            MethodName::Id(_) => &DYNAMIC,
        }
    }
}

impl fmt::Display for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MethodName::Stub(m) => f.write_str(m.name),
            MethodName::Id(id) => write!(f, "{id:#010x}"),
        }
    }
}

/// A server method's name and metric handles, registered when the server starts.
#[derive(Debug)]
pub(crate) struct ServerMethod {
    pub(crate) name: &'static str,
    /// Its handlers' first poll runs in the driver ([`crate::ServerConfig::inline_handlers`] for
    /// its [`crate::MethodDesc::inline`]).
    pub(crate) inline: bool,
    calls: Counter,
    duration: Histogram,
    stalls: Counter,
}

impl ServerMethod {
    pub(crate) fn new(name: &'static str, inline: bool) -> Arc<ServerMethod> {
        Arc::new(ServerMethod {
            name,
            inline,
            calls: metrics::counter!("rpc_server_calls_total", "method" => name),
            duration: metrics::histogram!("rpc_server_call_duration_seconds", "method" => name),
            stalls: metrics::counter!("rpc_server_inline_stalls_total", "method" => name),
        })
    }

    /// One of its handlers held the connection's driver too long in its first poll.
    pub(crate) fn inline_stalled(&self) {
        self.stalls.increment(1);
    }
}

/// How a call ended at the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerOutcome {
    Ok,
    Failed(WireErrorCode),
    Cancelled,
    DeadlineExceeded,
    /// The connection closed first.
    Disconnected,
}

impl ServerOutcome {
    fn kind(self) -> &'static str {
        match self {
            ServerOutcome::Ok => "ok",
            ServerOutcome::Failed(code) => match code {
                WireErrorCode::UnknownMethod => "unknown_method",
                WireErrorCode::BadRequest => "bad_request",
                WireErrorCode::Handler => "handler",
                WireErrorCode::Overloaded => "overloaded",
                WireErrorCode::ShuttingDown => "shutting_down",
                WireErrorCode::PayloadTooLarge => "payload_too_large",
                WireErrorCode::ReadFailed => "read_failed",
                _ => "other",
            },
            ServerOutcome::Cancelled => "cancelled",
            ServerOutcome::DeadlineExceeded => "deadline_exceeded",
            ServerOutcome::Disconnected => "disconnected",
        }
    }
}

/// A call's duration, from `from` to `to`, worked out only where something records it: the
/// event when a DEBUG subscriber is on, the histogram when a recorder is installed. With neither
/// (the default) the subtraction of the two clock readings (~40 instructions) is not made, nor,
/// for a call that ends as it is reported, the reading of its end (`to` of `None`: the clock is
/// read where the duration is first recorded, within the report, and the other record takes the
/// same reading).
#[derive(Debug)]
pub(crate) struct Elapsed {
    from: Instant,
    to: Cell<Option<Instant>>,
}

impl Elapsed {
    /// From `from` to `to`, or to the time it is first recorded (`None`).
    pub(crate) fn between(from: Instant, to: Option<Instant>) -> Elapsed {
        Elapsed { from, to: Cell::new(to) }
    }

    fn duration(&self) -> Duration {
        let to = match self.to.get() {
            Some(to) => to,
            None => {
                let now = Instant::now();
                self.to.set(Some(now));
                now
            }
        };
        to.saturating_duration_since(self.from)
    }

    fn micros(&self) -> u64 {
        self.duration().as_micros() as u64
    }
}

/// The histogram's value: the duration in seconds (converted only by a live histogram).
impl IntoF64 for &Elapsed {
    fn into_f64(self) -> f64 {
        self.duration().as_secs_f64()
    }
}

/// A finished client call: the event in `span` and the metrics.
pub(crate) fn client_call_done(
    span: &Span,
    method: MethodName,
    request_bytes: usize,
    elapsed: Elapsed,
    result: &Result<(rpc_transport::Received, CallInfo), CallError>,
) {
    match result {
        Ok((response, info)) => tracing::debug!(
            parent: span,
            request_bytes,
            response_bytes = response.len(),
            request_path = %info.request,
            response_path = %info.response,
            duration_us = elapsed.micros(),
            outcome = "ok",
            "call finished"
        ),
        Err(e) => tracing::debug!(
            parent: span,
            request_bytes,
            duration_us = elapsed.micros(),
            outcome = e.kind(),
            error = %e,
            "call finished"
        ),
    }
    client_metrics(method.metrics(), &elapsed, result.as_ref().err().map(CallError::kind));
}

/// A client call whose future was dropped before it finished (cancelled by the caller).
pub(crate) fn client_call_dropped(span: &Span, method: MethodName, request_bytes: usize, elapsed: Elapsed) {
    tracing::debug!(parent: span, request_bytes, duration_us = elapsed.micros(), outcome = "cancelled", "call finished");
    client_metrics(method.metrics(), &elapsed, Some("cancelled"));
}

fn client_metrics(method: &ClientMethod, elapsed: &Elapsed, error: Option<&'static str>) {
    let (calls, duration) = method.handles();
    calls.increment(1);
    duration.record(elapsed);
    if let Some(kind) = error {
        // Errors are the slow path: registered when they happen.
        metrics::counter!("rpc_client_errors_total", "method" => method.name, "kind" => kind).increment(1);
    }
}

/// A finished server call: the event in `span` and the metrics.
pub(crate) fn server_call_done(
    span: &Span,
    method: &ServerMethod,
    request_bytes: usize,
    response: Option<(usize, Path)>,
    elapsed: Elapsed,
    outcome: ServerOutcome,
) {
    match response {
        Some((response_bytes, response_path)) => tracing::debug!(
            parent: span,
            request_bytes,
            response_bytes,
            %response_path,
            duration_us = elapsed.micros(),
            outcome = outcome.kind(),
            "call finished"
        ),
        None => {
            tracing::debug!(
                parent: span,
                request_bytes,
                duration_us = elapsed.micros(),
                outcome = outcome.kind(),
                "call finished"
            )
        }
    }
    method.calls.increment(1);
    method.duration.record(&elapsed);
    if outcome != ServerOutcome::Ok {
        metrics::counter!("rpc_server_errors_total", "method" => method.name, "kind" => outcome.kind())
            .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_elapsed_time_is_worked_out_when_recorded_and_never_negative() {
        let from = Instant::now();
        let to = from + Duration::from_micros(1_500);
        let elapsed = Elapsed::between(from, Some(to));
        assert_eq!(elapsed.micros(), 1_500);
        assert_eq!((&elapsed).into_f64(), 0.0015);
        // A reading taken before the start (a clock read by another task first) is zero.
        let backwards = Elapsed::between(to, Some(from));
        assert_eq!(backwards.micros(), 0);
        assert_eq!((&backwards).into_f64(), 0.0);
        // Until it is recorded: the clock is read then, once; a second record takes that reading.
        let until_now = Elapsed::between(from, None);
        let before = from.elapsed();
        let recorded = until_now.duration();
        assert!(recorded >= before && recorded <= from.elapsed(), "{recorded:?} after {before:?}");
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(until_now.duration(), recorded);
        assert_eq!((&until_now).into_f64(), recorded.as_secs_f64());
    }
}

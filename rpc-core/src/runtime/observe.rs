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
//!
//! `method` is `"Service.method"` (an id the server does not know is `"unknown"`).

use std::borrow::Cow;
use std::time::Duration;

use tracing::Span;

use crate::error::CallError;
use crate::proto::{CallInfo, Path, WireErrorCode};

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

/// A finished client call: the event in `span` and the metrics.
pub(crate) fn client_call_done(
    span: &Span,
    method: Cow<'static, str>,
    request_bytes: usize,
    elapsed: Duration,
    result: &Result<(bytes::Bytes, CallInfo), CallError>,
) {
    let duration_us = elapsed.as_micros() as u64;
    match result {
        Ok((response, info)) => tracing::debug!(
            parent: span,
            request_bytes,
            response_bytes = response.len(),
            request_path = %info.request,
            response_path = %info.response,
            duration_us,
            outcome = "ok",
            "call finished"
        ),
        Err(e) => tracing::debug!(
            parent: span,
            request_bytes,
            duration_us,
            outcome = e.kind(),
            error = %e,
            "call finished"
        ),
    }
    let label = method;
    metrics::counter!("rpc_client_calls_total", "method" => label.clone()).increment(1);
    if let Err(e) = result {
        metrics::counter!("rpc_client_errors_total", "method" => label.clone(), "kind" => e.kind())
            .increment(1);
    }
    metrics::histogram!("rpc_client_call_duration_seconds", "method" => label).record(elapsed.as_secs_f64());
}

/// A client call whose future was dropped before it finished (cancelled by the caller).
pub(crate) fn client_call_dropped(
    span: &Span,
    method: Cow<'static, str>,
    request_bytes: usize,
    elapsed: Duration,
) {
    let duration_us = elapsed.as_micros() as u64;
    tracing::debug!(parent: span, request_bytes, duration_us, outcome = "cancelled", "call finished");
    let label = method;
    metrics::counter!("rpc_client_calls_total", "method" => label.clone()).increment(1);
    metrics::counter!("rpc_client_errors_total", "method" => label.clone(), "kind" => "cancelled")
        .increment(1);
    metrics::histogram!("rpc_client_call_duration_seconds", "method" => label).record(elapsed.as_secs_f64());
}

/// A finished server call: the event in `span` and the metrics.
pub(crate) fn server_call_done(
    span: &Span,
    method: &'static str,
    request_bytes: usize,
    response: Option<(usize, Path)>,
    elapsed: Duration,
    outcome: ServerOutcome,
) {
    let duration_us = elapsed.as_micros() as u64;
    match response {
        Some((response_bytes, response_path)) => tracing::debug!(
            parent: span,
            request_bytes,
            response_bytes,
            %response_path,
            duration_us,
            outcome = outcome.kind(),
            "call finished"
        ),
        None => {
            tracing::debug!(parent: span, request_bytes, duration_us, outcome = outcome.kind(), "call finished")
        }
    }
    metrics::counter!("rpc_server_calls_total", "method" => method).increment(1);
    if outcome != ServerOutcome::Ok {
        metrics::counter!("rpc_server_errors_total", "method" => method, "kind" => outcome.kind())
            .increment(1);
    }
    metrics::histogram!("rpc_server_call_duration_seconds", "method" => method).record(elapsed.as_secs_f64());
}

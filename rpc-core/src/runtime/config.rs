//! Configuration of clients, servers and calls.

use std::time::Duration;

use crate::proto::ProtoConfig;

/// Client settings.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Protocol settings (eager threshold, receive depth, calls in flight, size limit).
    pub proto: ProtoConfig,
    /// Deadline applied to calls whose [`CallOptions`] set none. Default: none.
    pub default_deadline: Option<Duration>,
}

impl ClientConfig {
    /// Sets [`ClientConfig::proto`].
    pub fn proto(mut self, proto: ProtoConfig) -> Self {
        self.proto = proto;
        self
    }
    /// Sets [`ClientConfig::default_deadline`].
    pub fn default_deadline(mut self, d: Duration) -> Self {
        self.default_deadline = Some(d);
        self
    }
}

/// Server settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Protocol settings of each accepted connection.
    pub proto: ProtoConfig,
    /// Handlers running at once, over all connections; further requests wait. Default 1024.
    pub max_concurrent_handlers: usize,
    /// How long a graceful shutdown waits for calls in progress before aborting them. Default 30 s.
    pub shutdown_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            proto: ProtoConfig::default(),
            max_concurrent_handlers: 1024,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

impl ServerConfig {
    /// Sets [`ServerConfig::proto`].
    pub fn proto(mut self, proto: ProtoConfig) -> Self {
        self.proto = proto;
        self
    }
    /// Sets [`ServerConfig::max_concurrent_handlers`] (at least 1).
    pub fn max_concurrent_handlers(mut self, n: usize) -> Self {
        self.max_concurrent_handlers = n.max(1);
        self
    }
    /// Sets [`ServerConfig::shutdown_timeout`].
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
}

/// Per-call options, set without changing the service trait:
/// `client.with_options(CallOptions::new().deadline(d)).method(..)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallOptions {
    /// Time allowed for the call, from when it is issued. Travels to the server as a relative
    /// duration; the server cancels the handler when it passes. Default: the client's default.
    pub deadline: Option<Duration>,
}

impl CallOptions {
    /// Options with nothing set.
    pub fn new() -> Self {
        CallOptions::default()
    }
    /// Sets [`CallOptions::deadline`].
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }
}

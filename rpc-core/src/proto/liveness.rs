//! Keepalive: a silent peer is detected within `idle_timeout`, on every transport.
//!
//! Every frame received proves the peer alive. When nothing has arrived for
//! `keepalive_interval`, a Ping goes out (the peer answers with a Pong at once, from its
//! protocol core, whatever its application is doing); when nothing has arrived for
//! `idle_timeout`, the peer is declared dead ([`ProtoError::PeerSilent`]) and the connection is
//! closed, failing its calls. Idle connections cost one small frame per interval each way.

use std::time::{Duration, Instant};

use super::error::ProtoError;

#[derive(Debug)]
pub(crate) struct Liveness {
    interval: Duration,
    idle_timeout: Duration,
    last_rx: Instant,
    next_ping: Option<Instant>,
    /// A Ping is due (sent when a credit allows).
    pub ping_due: bool,
    /// The peer pinged us: a Pong is due.
    pub pong_due: bool,
}

impl Liveness {
    pub fn new(interval: Duration, idle_timeout: Duration, now: Instant) -> Liveness {
        Liveness {
            interval,
            idle_timeout,
            last_rx: now,
            next_ping: now.checked_add(interval),
            ping_due: false,
            pong_due: false,
        }
    }

    /// Something arrived from the peer.
    pub fn on_received(&mut self, now: Instant) {
        self.last_rx = self.last_rx.max(now);
        self.next_ping = self.last_rx.checked_add(self.interval);
    }

    /// When [`Liveness::check`] must next run.
    pub fn next_timeout(&self) -> Option<Instant> {
        let idle = self.last_rx.checked_add(self.idle_timeout);
        self.next_ping.into_iter().chain(idle).min()
    }

    /// Declares the peer dead after `idle_timeout` of silence; schedules a Ping after
    /// `keepalive_interval`.
    pub fn check(&mut self, now: Instant) -> Result<(), ProtoError> {
        let silent = now.saturating_duration_since(self.last_rx);
        if silent >= self.idle_timeout {
            return Err(ProtoError::PeerSilent { idle: silent });
        }
        if self.next_ping.is_some_and(|at| now >= at) {
            self.ping_due = true;
            self.next_ping = now.checked_add(self.interval);
        }
        Ok(())
    }
}

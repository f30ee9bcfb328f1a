//! Keepalive: a silent peer is detected within `idle_timeout`, on every transport.
//!
//! Every frame received proves the peer alive. When nothing has arrived for
//! `keepalive_interval`, a Ping goes out (the peer answers with a Pong at once, from its
//! protocol core, whatever its application is doing); when nothing has arrived for
//! `idle_timeout`, the peer is declared dead ([`ProtoError::PeerSilent`]) and the connection is
//! closed, failing its calls. Idle connections cost one small frame per interval each way.
//!
//! Silence is measured only over time we were listening. The driver runs [`Liveness::check`] at
//! least every `keepalive_interval` (a ping or the idle deadline is always armed); when it runs
//! much later than that, our own process was starved (a runtime busy with CPU-bound tasks, a
//! paused VM), frames may not have been sent to us nor read by us meanwhile, and that gap is not
//! held against the peer: it gets a ping and a full `idle_timeout` from now.

use std::time::{Duration, Instant};

use super::error::ProtoError;

#[derive(Debug)]
pub(crate) struct Liveness {
    interval: Duration,
    idle_timeout: Duration,
    last_rx: Instant,
    /// The last time we ran (a check or a received frame): a later run proves we were starved.
    last_run: Instant,
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
            last_run: now,
            next_ping: now.checked_add(interval),
            ping_due: false,
            pong_due: false,
        }
    }

    /// Something arrived from the peer.
    pub fn on_received(&mut self, now: Instant) {
        self.last_rx = self.last_rx.max(now);
        self.last_run = self.last_run.max(now);
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
        // We should have run again by `last_run + interval`; anything beyond is our own stall.
        let stalled = now.saturating_duration_since(self.last_run).saturating_sub(self.interval);
        if !stalled.is_zero() {
            self.last_rx = (self.last_rx + stalled).min(now);
            self.next_ping = Some(now);
        }
        self.last_run = self.last_run.max(now);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_in_our_own_running_is_not_held_against_the_peer() {
        let (interval, idle) = (Duration::from_secs(2), Duration::from_secs(10));
        let t0 = Instant::now();
        let mut l = Liveness::new(interval, idle, t0);
        // Checked on time every 2 s: the peer is silent for 10 s and is declared dead.
        for s in [2, 4, 6, 8] {
            l.check(t0 + Duration::from_secs(s)).unwrap();
        }
        assert!(l.check(t0 + Duration::from_secs(10)).is_err());
        // Our process stalls 30 s right after a frame: the peer gets a ping and a full idle
        // timeout from when we run again.
        let mut l = Liveness::new(interval, idle, t0);
        l.check(t0 + Duration::from_secs(30)).expect("a stall of ours is not the peer's silence");
        assert!(l.ping_due, "a ping goes out at once");
        l.ping_due = false;
        for s in [32, 34, 36] {
            l.check(t0 + Duration::from_secs(s)).unwrap();
        }
        assert!(l.check(t0 + Duration::from_secs(30 + 10)).is_err(), "then silence counts again");
    }
}

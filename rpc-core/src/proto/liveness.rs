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

use super::deadlines::earliest;
use super::error::ProtoError;

#[derive(Debug)]
pub(crate) struct Liveness {
    interval: Duration,
    idle_timeout: Duration,
    last_rx: Instant,
    /// The last time we ran (a check or a received frame): a later run proves we were starved.
    last_run: Instant,
    next_ping: Option<Instant>,
    /// The earlier of `next_ping` and the idle deadline (`last_rx + idle_timeout`), kept up to
    /// date by every change of either (the driver asks for it after every input).
    due: Option<Instant>,
    /// Whether `next_ping` and `due` are what a frame received at `last_rx` made them (nothing
    /// since changed them): then another frame at the same time changes nothing (a batch of
    /// frames handled under one reading of the clock).
    settled_at_rx: bool,
    /// A Ping is due (sent when a credit allows).
    pub ping_due: bool,
    /// The peer pinged us: a Pong is due.
    pub pong_due: bool,
}

impl Liveness {
    pub fn new(interval: Duration, idle_timeout: Duration, now: Instant) -> Liveness {
        let mut live = Liveness {
            interval,
            idle_timeout,
            last_rx: now,
            last_run: now,
            next_ping: now.checked_add(interval),
            due: None,
            settled_at_rx: false,
            ping_due: false,
            pong_due: false,
        };
        live.due = live.compute_due();
        live
    }

    /// The earlier of the next ping and the idle deadline, computed.
    fn compute_due(&self) -> Option<Instant> {
        earliest(self.next_ping, self.last_rx.checked_add(self.idle_timeout))
    }

    /// Something arrived from the peer.
    pub fn on_received(&mut self, now: Instant) {
        // `last_run` is at least `last_rx` already (both move together, and `check` keeps
        // `last_rx` at most `now`).
        if self.settled_at_rx && now == self.last_rx {
            return;
        }
        self.settled_at_rx = true;
        self.last_rx = self.last_rx.max(now);
        self.last_run = self.last_run.max(now);
        self.next_ping = self.last_rx.checked_add(self.interval);
        // The ping is due `interval` after the last frame and the idle deadline `idle_timeout`
        // after it: when the ping comes first, it is the answer (an idle deadline beyond the
        // clock is no deadline).
        self.due = match self.next_ping {
            Some(_) if self.interval <= self.idle_timeout => self.next_ping,
            _ => self.compute_due(),
        };
    }

    /// When [`Liveness::check`] must next run.
    #[inline]
    pub fn next_timeout(&self) -> Option<Instant> {
        debug_assert_eq!(self.due, self.compute_due(), "the kept deadline is the computed one");
        self.due
    }

    /// Declares the peer dead after `idle_timeout` of silence; schedules a Ping after
    /// `keepalive_interval`.
    pub fn check(&mut self, now: Instant) -> Result<(), ProtoError> {
        let result = self.run_check(now);
        self.due = self.compute_due();
        result
    }

    fn run_check(&mut self, now: Instant) -> Result<(), ProtoError> {
        self.settled_at_rx = false;
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
    use proptest::prelude::*;

    proptest! {
        /// The deadline kept for `next_timeout` is always what it was computed from before it was
        /// kept: the earlier of the next ping and the idle deadline, over frames and checks at
        /// random times, with an idle timeout shorter or longer than the interval, or beyond the
        /// clock.
        #[test]
        fn the_kept_deadline_is_the_computed_one(
            interval_ms in 1u64..5_000,
            idle in prop_oneof![(1u64..20_000).prop_map(Duration::from_millis), Just(Duration::MAX)],
            steps in proptest::collection::vec((any::<bool>(), 0u64..30_000), 1..60),
        ) {
            let t0 = Instant::now();
            let mut l = Liveness::new(Duration::from_millis(interval_ms), idle, t0);
            let mut now = t0;
            for (receive, ms) in steps {
                now += Duration::from_millis(ms);
                match receive {
                    true => l.on_received(now),
                    false => {
                        let _ = l.check(now);
                    }
                }
                let idle_at = l.last_rx.checked_add(l.idle_timeout);
                prop_assert_eq!(l.next_timeout(), l.next_ping.into_iter().chain(idle_at).min());
            }
        }
    }

    proptest! {
        /// A frame at the time of the one before (a batch under one reading of the clock) is
        /// skipped, and leaves the state the full update would: over frames and checks at
        /// times often equal.
        #[test]
        fn a_frame_at_the_same_time_changes_nothing_the_full_update_would(
            interval_ms in 1u64..50,
            idle_ms in 1u64..200,
            steps in proptest::collection::vec((any::<bool>(), prop_oneof![Just(0u64), 0u64..100]), 1..80),
        ) {
            let t0 = Instant::now();
            let (interval, idle) = (Duration::from_millis(interval_ms), Duration::from_millis(idle_ms));
            let (mut l, mut full) = (Liveness::new(interval, idle, t0), Liveness::new(interval, idle, t0));
            let mut now = t0;
            for (receive, ms) in steps {
                now += Duration::from_millis(ms);
                match receive {
                    true => {
                        l.on_received(now);
                        full.settled_at_rx = false;
                        full.on_received(now);
                    }
                    false => {
                        prop_assert_eq!(l.check(now).is_ok(), full.check(now).is_ok());
                    }
                }
                prop_assert_eq!(
                    (l.last_rx, l.last_run, l.next_ping, l.due, l.ping_due),
                    (full.last_rx, full.last_run, full.next_ping, full.due, full.ping_due)
                );
            }
        }
    }

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

//! The per-path and protocol counters of rpc-core connections, in a form that serializes and
//! travels from the server process to the harness.

use rpc_core::ConnStats;
use serde::{Deserialize, Serialize};

/// Counters of one side (client or server), summed over its connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Calls completed.
    pub calls_completed: u64,
    /// Payloads sent inline (eager).
    pub eager_sent: u64,
    /// Payloads advertised for READ (rendezvous).
    pub rendezvous_sent: u64,
    /// Payloads received inline.
    pub eager_received: u64,
    /// Payloads pulled with a READ.
    pub rendezvous_received: u64,
    /// Frames sent.
    pub frames_sent: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Credit-only frames sent.
    pub credit_frames: u64,
    /// Frames that had to wait for credits before they could be sent.
    pub credit_stalls: u64,
    /// READs issued.
    pub reads_issued: u64,
    /// Bytes pulled with READs.
    pub bytes_read: u64,
    /// Regions registered for the peer.
    pub regions_registered: u64,
    /// Keys revoked.
    pub keys_revoked: u64,
    /// Cancels.
    pub cancels: u64,
    /// Deadlines expired.
    pub deadlines_expired: u64,
    /// Receive buffers posted (transport), including the initial ones.
    pub recvs_posted: u64,
    /// Messages that found no receive posted (transport; must stay 0).
    pub recv_unexpected: u64,
    /// READs the peer issued here that were served (transport).
    pub reads_served: u64,
    /// READs the peer issued here that were refused (transport).
    pub reads_refused: u64,
    /// Regions whose bytes were pushed to the peer at registration (tcp transport).
    #[serde(default)]
    pub regions_pushed: u64,
    /// READs completed from bytes the peer pushed, without a request (tcp transport).
    #[serde(default)]
    pub reads_served_from_push: u64,
    /// Times the connection drivers were polled (their wake-ups).
    #[serde(default)]
    pub driver_polls: u64,
    /// Handler tasks spawned (server side).
    #[serde(default)]
    pub handlers_spawned: u64,
    /// Posts of SENDs to the transport: write system calls (tcp), `ibv_post_send` calls (rdma).
    #[serde(default)]
    pub send_posts: u64,
    /// Passes over the connection run by the calling tasks (client side).
    #[serde(default)]
    pub caller_passes: u64,
    /// Empty completion-queue polls inside busy-poll windows (rdma with a window): where a
    /// busy-polling run spent its spare turns.
    #[serde(default)]
    pub busy_poll_spins: u64,
    /// Handlers whose first poll in the connection's driver held it past
    /// `ServerConfig::inline_stall` (server side).
    #[serde(default)]
    pub inline_stalls: u64,
    /// Looks at the socket after a SEND whose write took long (tcp transport), and those that
    /// found the peer's bytes.
    #[serde(default)]
    pub tcp_looks: u64,
    /// Looks that found the peer's bytes (tcp transport).
    #[serde(default)]
    pub tcp_looks_found: u64,
}

impl From<&ConnStats> for Counters {
    fn from(s: &ConnStats) -> Counters {
        let (p, t) = (&s.proto, &s.transport);
        Counters {
            calls_completed: p.calls_completed,
            eager_sent: p.eager_sent,
            rendezvous_sent: p.rendezvous_sent,
            eager_received: p.eager_received,
            rendezvous_received: p.rendezvous_received,
            frames_sent: p.frames_sent,
            frames_received: p.frames_received,
            credit_frames: p.credit_frames,
            credit_stalls: p.credit_stalls,
            reads_issued: p.reads_issued,
            bytes_read: p.bytes_read,
            regions_registered: p.regions_registered,
            keys_revoked: p.keys_revoked,
            cancels: p.cancels,
            deadlines_expired: p.deadlines_expired,
            recvs_posted: t.recvs_posted,
            recv_unexpected: t.recv_unexpected,
            reads_served: t.reads_served,
            reads_refused: t.reads_refused,
            regions_pushed: t.regions_pushed,
            reads_served_from_push: t.reads_served_from_push,
            driver_polls: s.driver_polls,
            handlers_spawned: s.handlers_spawned,
            send_posts: t.send_posts,
            caller_passes: s.caller_passes,
            busy_poll_spins: t.busy_poll_spins,
            inline_stalls: s.inline_stalls,
            tcp_looks: t.tcp_looks,
            tcp_looks_found: t.tcp_looks_found,
        }
    }
}

impl Counters {
    /// Field-by-field sum.
    pub fn add(&mut self, o: &Counters) {
        let pairs: [(&mut u64, u64); 29] = [
            (&mut self.calls_completed, o.calls_completed),
            (&mut self.eager_sent, o.eager_sent),
            (&mut self.rendezvous_sent, o.rendezvous_sent),
            (&mut self.eager_received, o.eager_received),
            (&mut self.rendezvous_received, o.rendezvous_received),
            (&mut self.frames_sent, o.frames_sent),
            (&mut self.frames_received, o.frames_received),
            (&mut self.credit_frames, o.credit_frames),
            (&mut self.credit_stalls, o.credit_stalls),
            (&mut self.reads_issued, o.reads_issued),
            (&mut self.bytes_read, o.bytes_read),
            (&mut self.regions_registered, o.regions_registered),
            (&mut self.keys_revoked, o.keys_revoked),
            (&mut self.cancels, o.cancels),
            (&mut self.deadlines_expired, o.deadlines_expired),
            (&mut self.recvs_posted, o.recvs_posted),
            (&mut self.recv_unexpected, o.recv_unexpected),
            (&mut self.reads_served, o.reads_served),
            (&mut self.reads_refused, o.reads_refused),
            (&mut self.regions_pushed, o.regions_pushed),
            (&mut self.reads_served_from_push, o.reads_served_from_push),
            (&mut self.driver_polls, o.driver_polls),
            (&mut self.handlers_spawned, o.handlers_spawned),
            (&mut self.send_posts, o.send_posts),
            (&mut self.caller_passes, o.caller_passes),
            (&mut self.busy_poll_spins, o.busy_poll_spins),
            (&mut self.inline_stalls, o.inline_stalls),
            (&mut self.tcp_looks, o.tcp_looks),
            (&mut self.tcp_looks_found, o.tcp_looks_found),
        ];
        for (mine, theirs) in pairs {
            *mine += theirs;
        }
    }

    /// The rows printed at the end of a run: `(name, value)`.
    pub fn rows(&self) -> [(&'static str, u64); 25] {
        [
            ("calls completed", self.calls_completed),
            ("eager sent", self.eager_sent),
            ("rendezvous sent", self.rendezvous_sent),
            ("eager received", self.eager_received),
            ("rendezvous received", self.rendezvous_received),
            ("receives posted", self.recvs_posted),
            ("recv unexpected", self.recv_unexpected),
            ("credit frames", self.credit_frames),
            ("credit stalls", self.credit_stalls),
            ("READs issued", self.reads_issued),
            ("READs served", self.reads_served),
            ("READs refused", self.reads_refused),
            ("READs from push", self.reads_served_from_push),
            ("regions registered", self.regions_registered),
            ("regions pushed", self.regions_pushed),
            ("keys revoked", self.keys_revoked),
            ("cancels", self.cancels),
            ("driver polls", self.driver_polls),
            ("caller passes", self.caller_passes),
            ("busy-poll spins", self.busy_poll_spins),
            ("handlers spawned", self.handlers_spawned),
            ("inline stalls", self.inline_stalls),
            ("SEND posts", self.send_posts),
            ("looks after SEND", self.tcp_looks),
            ("looks that found", self.tcp_looks_found),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_sums_every_field() {
        let one = Counters {
            eager_sent: 1,
            credit_stalls: 2,
            reads_refused: 3,
            driver_polls: 4,
            handlers_spawned: 5,
            caller_passes: 6,
            busy_poll_spins: 7,
            inline_stalls: 8,
            ..Counters::default()
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(sum.eager_sent, 2);
        assert_eq!(sum.driver_polls, 8);
        assert_eq!(sum.caller_passes, 12);
        assert_eq!(sum.busy_poll_spins, 14);
        assert_eq!(sum.inline_stalls, 16);
        assert_eq!(sum.handlers_spawned, 10);
        assert_eq!(sum.credit_stalls, 4);
        assert_eq!(sum.reads_refused, 6);
        assert_eq!(sum.calls_completed, 0);
    }

    #[test]
    fn counters_round_trip_through_json() {
        let c = Counters { keys_revoked: 7, recv_unexpected: 1, ..Counters::default() };
        let back: Counters = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
}

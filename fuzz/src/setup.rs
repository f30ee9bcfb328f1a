//! Connection setup for the state-machine targets: our config and the peer's limits, in the
//! ranges a real connection can have.

use rpc_core::proto::{Hello, PeerLimits, ProtoConfig};

use crate::input::Setup;

/// Our largest accepted payload is at most this (READ destinations are allocated by the harness).
pub const MAX_PAYLOAD: u64 = 64 * 1024;

/// Our protocol config.
pub fn config(s: &Setup) -> ProtoConfig {
    ProtoConfig::default()
        .eager_threshold(64 + usize::from(s.eager_threshold % 4096))
        .recv_depth(4 + u32::from(s.recv_depth % 61))
        .max_in_flight(1 + u32::from(s.max_in_flight % 32))
        .max_message_size(u64::from(s.max_message).min(MAX_PAYLOAD))
}

/// What the peer announced, as the runtime's handshake accepts it: at least 2 receives (the
/// transports allow at most 65536), a receive size of at least 1 byte.
pub fn peer(s: &Setup) -> PeerLimits {
    let hello = Hello { eager_threshold: u32::from(s.peer_eager), max_message_size: u64::from(s.peer_max_message) };
    peer_limits(2 + u32::from(s.peer_recv_depth % 63), u32::from(s.peer_recv_size).max(1), hello)
}

/// The one place the fuzz crate builds a [`PeerLimits`] (its fields grow with the protocol).
pub fn peer_limits(recv_depth: u32, recv_size: u32, hello: Hello) -> PeerLimits {
    PeerLimits { recv_depth, recv_size, hello }
}

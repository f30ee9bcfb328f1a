//! Connection setup for the state-machine targets: our config and the peer's limits, in the
//! ranges a real connection can have.

use rpc_core::proto::{Hello, PeerLimits, ProtoConfig, HEADER_LEN, MAX_ERROR_MESSAGE};

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

/// The smallest receive buffer a peer can have: a header and the largest error body, which is
/// what [`ProtoConfig::recv_size`] gives for the smallest eager threshold.
pub const MIN_PEER_RECV_SIZE: u32 = (HEADER_LEN + 2 + MAX_ERROR_MESSAGE) as u32;

/// What the peer announced: at least 2 receives (as the runtime's handshake requires; the
/// transports allow at most 65536) of at least [`MIN_PEER_RECV_SIZE`] bytes. (The handshake does
/// not check the size yet: with less, our frames do not fit and the transport refuses to send
/// them, which closes the connection.)
pub fn peer(s: &Setup) -> PeerLimits {
    let hello =
        Hello { eager_threshold: u32::from(s.peer_eager), max_message_size: u64::from(s.peer_max_message) };
    let recv_size = u32::from(s.peer_recv_size).max(MIN_PEER_RECV_SIZE);
    peer_limits(2 + u32::from(s.peer_recv_depth % 63), recv_size, hello)
}

/// The one place the fuzz crate builds a [`PeerLimits`] (its fields grow with the protocol).
pub fn peer_limits(recv_depth: u32, recv_size: u32, hello: Hello) -> PeerLimits {
    PeerLimits { recv_depth, recv_size, hello, max_reads_in_flight: 8, max_read_size: MAX_PAYLOAD }
}

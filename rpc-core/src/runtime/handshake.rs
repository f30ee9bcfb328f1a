//! Connection setup: our hello goes out as the transport's private data; the peer's comes back.

use bytes::Bytes;
use rpc_transport::{ConnParams, Connection};

use super::config::ServerConfig;
use crate::error::ConnectError;
use crate::proto::{Hello, PeerLimits, ProtoConfig, SPARE_RECEIVES};

/// Transport parameters for a connection with this protocol config: `recv_depth` receives for
/// the peer's credits, and the spare; the backends' settings as given.
pub(crate) fn conn_params(
    proto: &ProtoConfig,
    rdma: &rpc_transport::RdmaSettings,
    tcp: &rpc_transport::TcpSettings,
) -> ConnParams {
    ConnParams {
        recv_depth: proto.recv_depth.saturating_add(SPARE_RECEIVES),
        recv_size: proto.recv_size(),
        private_data: Bytes::from(proto.hello().encode()),
        pool: proto.pool,
        key_policy: proto.key_policy,
        rdma: rdma.clone(),
        tcp: tcp.clone(),
        ..ConnParams::default()
    }
}

/// Transport parameters of a server's listener.
pub(crate) fn listen_params(config: &ServerConfig) -> ConnParams {
    ConnParams {
        handshake_timeout: config.handshake_timeout,
        max_pending_handshakes: config.max_pending_handshakes,
        ..conn_params(&config.proto, &config.rdma, &config.tcp)
    }
}

/// What the peer told us at setup. Our credits are the receives it posted less its spare.
pub(crate) fn peer_limits(conn: &dyn Connection) -> Result<PeerLimits, ConnectError> {
    let info = conn.info();
    let hello = Hello::decode(&info.peer_private_data).map_err(|e| ConnectError::Handshake(e.to_string()))?;
    if info.peer_recv_depth < 2 + SPARE_RECEIVES {
        return Err(ConnectError::Handshake(format!("peer posted only {} receives", info.peer_recv_depth)));
    }
    Ok(PeerLimits {
        recv_depth: info.peer_recv_depth - SPARE_RECEIVES,
        recv_size: info.peer_recv_size,
        hello,
        max_reads_in_flight: info.max_reads_in_flight,
        max_read_size: info.max_read_size,
    })
}

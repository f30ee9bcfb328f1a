//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`, off by default; also
//! built for this crate's tests): the crate-private decoders and the tcp reader behind small
//! wrappers. Not an API: it changes with the code it exposes.

pub use crate::tcp::fuzzing::{
    tcp_decode_hello, tcp_encode_hello, TcpFrame, TcpHello, TcpReaderHarness, TcpReaderRun, TCP_HELLO_FIXED,
    TCP_STATUS_OK,
};

// The rdma hello is pure decoding with no verbs dependency: compiled here without the `rdma`
// feature, so that its fuzz target needs no rdma-core. Items only the rdma backend uses are
// unused in this copy. With the feature, the backend's own module is used.
#[cfg(not(feature = "rdma"))]
#[allow(dead_code)]
#[path = "rdma/hello.rs"]
mod rdma_hello;
#[cfg(feature = "rdma")]
use crate::rdma::hello as rdma_hello;

use bytes::Bytes;

/// Largest encoded rdma hello.
pub const RDMA_HELLO_MAX: usize = rdma_hello::HELLO_MAX;

/// The fields of an rdma hello (a public mirror of the backend's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaHello {
    /// Receives posted.
    pub recv_depth: u32,
    /// Receive buffer size.
    pub recv_size: u32,
    /// READs the sender serves at once.
    pub max_dest_rd_atomic: u32,
    /// READs the sender issues at once.
    pub max_rd_atomic: u32,
    /// The caller's private data.
    pub private_data: Vec<u8>,
}

impl RdmaHello {
    /// Parses a peer's rdma hello.
    pub fn decode(msg: &[u8]) -> Result<RdmaHello, String> {
        let h = rdma_hello::Hello::decode(msg).map_err(|e| e.to_string())?;
        Ok(RdmaHello {
            recv_depth: h.recv_depth,
            recv_size: h.recv_size,
            max_dest_rd_atomic: h.max_dest_rd_atomic,
            max_rd_atomic: h.max_rd_atomic,
            private_data: h.private_data.to_vec(),
        })
    }

    /// Encodes as the backend sends it.
    pub fn encode(&self) -> Vec<u8> {
        rdma_hello::Hello {
            recv_depth: self.recv_depth,
            recv_size: self.recv_size,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            max_rd_atomic: self.max_rd_atomic,
            private_data: Bytes::copy_from_slice(&self.private_data),
        }
        .encode()
    }
}

#[cfg(test)]
mod tests;

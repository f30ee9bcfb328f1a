//! The rpc-core service the harness calls: one method per [`Workload`](crate::workload::Workload).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// What the benchmark server answers. Every handler answers at once (no `.await`, a download a
/// slice of one shared buffer): each method is marked `#[rpc(inline)]`, so with `ServerConfig`'s
/// default the server polls their handlers in the connection's driver (for small calls: one
/// whose request or recent answers go over the eager threshold runs in a task).
#[rpc_core::service]
pub trait Bench {
    /// Returns its argument (echo).
    #[rpc(inline)]
    async fn echo(&self, data: Bytes) -> Bytes;
    /// Takes a large request, returns its length (upload).
    #[rpc(inline)]
    async fn upload(&self, data: Bytes) -> u64;
    /// Returns `len` bytes (download).
    #[rpc(inline)]
    async fn download(&self, len: u64) -> Bytes;
    /// Returns `n + 1` (wrapping): a call whose argument and result hold no `Bytes`, for
    /// `rpc-bench counts`.
    #[rpc(inline)]
    async fn increment(&self, n: u64) -> u64;
}

/// The server side: download answers slice one shared buffer, so the handler allocates nothing.
#[derive(Debug, Clone, Default)]
pub struct BenchImpl {
    blob: Arc<Mutex<Bytes>>,
}

impl BenchImpl {
    /// A server with no buffer yet (it grows to the largest download asked for).
    pub fn new() -> BenchImpl {
        BenchImpl::default()
    }

    /// `len` bytes of the shared buffer, growing it if needed.
    pub fn blob(&self, len: usize) -> Bytes {
        let mut blob = self.blob.lock().unwrap_or_else(|e| e.into_inner());
        if blob.len() < len {
            *blob = Bytes::from(vec![0xa5u8; len]);
        }
        blob.slice(..len)
    }
}

/// Downloads larger than this are refused (a peer may ask for anything).
pub const MAX_DOWNLOAD: u64 = 1 << 30;

impl Bench for BenchImpl {
    async fn echo(&self, data: Bytes) -> Bytes {
        data
    }
    async fn upload(&self, data: Bytes) -> u64 {
        data.len() as u64
    }
    async fn download(&self, len: u64) -> Bytes {
        self.blob(len.min(MAX_DOWNLOAD) as usize)
    }
    async fn increment(&self, n: u64) -> u64 {
        n.wrapping_add(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_grows_and_slices() {
        let b = BenchImpl::new();
        assert_eq!(b.blob(10).len(), 10);
        assert_eq!(b.blob(100).len(), 100);
        assert_eq!(b.blob(5).len(), 5);
    }
}

//! The harness's error type.

/// Why a benchmark run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A call failed or returned something other than what the workload expects.
    #[error("call failed: {0}")]
    Call(String),
    /// Connecting or binding failed.
    #[error("connecting to {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The server child process misbehaved.
    #[error("server process: {0}")]
    ServerProcess(String),
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
    /// Writing results failed.
    #[error("writing {path}: {reason}")]
    Output {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// `rpc-bench doctor` found this machine not ready for rdma:// (the report says why).
    #[error("doctor: {0}")]
    NotReady(String),
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl BenchError {
    /// A connect error for `addr`.
    pub fn connect(addr: &str, reason: impl std::fmt::Display) -> BenchError {
        BenchError::Connect { addr: addr.to_string(), reason: reason.to_string() }
    }

    /// An output error for `path`.
    pub fn output(path: &std::path::Path, reason: impl std::fmt::Display) -> BenchError {
        BenchError::Output { path: path.display().to_string(), reason: reason.to_string() }
    }
}

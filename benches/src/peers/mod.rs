//! Servers of every system, started the same way in a child process or in this one.

pub mod raw_tcp;
pub mod raw_transport;
pub mod tarpc;

use std::net::SocketAddr;

use tokio::task::JoinHandle;

use crate::counters::Counters;
use crate::service::{BenchImpl, BenchServer};
use crate::target::{ProtoSettings, System};
use crate::BenchError;

/// A server of one system, serving until stopped.
#[derive(Debug)]
pub enum RunningServer {
    /// rpc-core's own server.
    Rpc(rpc_core::Server),
    /// An accept loop (tarpc, raw TCP, raw transport).
    Task {
        /// The bound address, `tcp://IP:PORT`.
        addr: String,
        /// The accept loop.
        task: JoinHandle<()>,
    },
}

/// The socket address of a `tcp://IP:PORT` address (tarpc and raw TCP speak TCP only).
pub fn tcp_socket(addr: &str) -> Result<SocketAddr, BenchError> {
    let rest = addr.strip_prefix("tcp://").unwrap_or(addr);
    rest.parse().map_err(|_| BenchError::Usage(format!("{addr:?}: tarpc and raw-tcp need tcp://IP:PORT")))
}

impl RunningServer {
    /// Binds `listen` and starts serving on the current runtime.
    pub async fn start(
        system: System,
        listen: &str,
        settings: &ProtoSettings,
    ) -> Result<RunningServer, BenchError> {
        match system {
            System::RpcCore => {
                let service = BenchServer::new(BenchImpl::new());
                let server = rpc_core::Server::bind(listen, settings.server_config(), service)
                    .await
                    .map_err(|e| BenchError::connect(listen, e))?;
                Ok(RunningServer::Rpc(server))
            }
            System::Tarpc => {
                let (addr, task) = tarpc::serve(tcp_socket(listen)?).await?;
                Ok(RunningServer::Task { addr: format!("tcp://{addr}"), task })
            }
            System::RawTcp => {
                let (addr, task) = raw_tcp::serve(tcp_socket(listen)?).await?;
                Ok(RunningServer::Task { addr: format!("tcp://{addr}"), task })
            }
            System::RawTransport => {
                let (addr, task) = raw_transport::serve(listen).await?;
                Ok(RunningServer::Task { addr, task })
            }
        }
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> String {
        match self {
            RunningServer::Rpc(s) => s.local_addr().to_string(),
            RunningServer::Task { addr, .. } => addr.clone(),
        }
    }

    /// The server's rpc-core counters over all its connections (`None` for other systems).
    pub fn counters(&self) -> Option<Counters> {
        match self {
            RunningServer::Rpc(s) => Some(Counters::from(&s.stats())),
            RunningServer::Task { .. } => None,
        }
    }

    /// Stops serving (rpc-core drains calls in progress first).
    pub async fn stop(self) {
        match self {
            RunningServer::Rpc(s) => s.shutdown().await,
            RunningServer::Task { task, .. } => task.abort(),
        }
    }
}

//! Backend selection by address: `mem://name`, `tcp://host:port`, `rdma://host:port`.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::{BoxFuture, ConnParams, Connection, Listener, TransportError};

/// A transport address; the scheme chooses the backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Address {
    /// In-process fabric, by name (`mem://name`), on the process-wide default fabric.
    Mem(String),
    /// TCP (`tcp://127.0.0.1:7000`).
    Tcp(SocketAddr),
    /// RDMA verbs, connection setup over rdma_cm at this IP and port (`rdma://10.0.2.15:7471`).
    Rdma(SocketAddr),
}

impl FromStr for Address {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| TransportError::InvalidAddress { addr: s.to_string(), reason };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad("expected scheme://..."))?;
        let sock = || rest.parse::<SocketAddr>().map_err(|_| bad("expected ip:port"));
        match scheme {
            "mem" if !rest.is_empty() => Ok(Address::Mem(rest.to_string())),
            "mem" => Err(bad("empty mem name")),
            "tcp" => Ok(Address::Tcp(sock()?)),
            "rdma" => Ok(Address::Rdma(sock()?)),
            _ => Err(bad("unknown scheme (mem, tcp, rdma)")),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Mem(n) => write!(f, "mem://{n}"),
            Address::Tcp(a) => write!(f, "tcp://{a}"),
            Address::Rdma(a) => write!(f, "rdma://{a}"),
        }
    }
}

/// Connects to `addr` with the backend its scheme names.
pub fn connect(
    addr: &Address,
    params: ConnParams,
) -> BoxFuture<'static, Result<Box<dyn Connection>, TransportError>> {
    let addr = addr.clone();
    Box::pin(async move {
        match addr {
            Address::Mem(name) => crate::mem::MemFabric::global().connect(&name, params).await,
            Address::Tcp(sa) => crate::tcp::connect(sa, params).await,
            Address::Rdma(_) => rdma_connect(addr, params).await,
        }
    })
}

/// Binds a listener on `addr` with the backend its scheme names.
pub fn listen(
    addr: &Address,
    params: ConnParams,
) -> BoxFuture<'static, Result<Box<dyn Listener>, TransportError>> {
    let addr = addr.clone();
    Box::pin(async move {
        match addr {
            Address::Mem(name) => crate::mem::MemFabric::global().listen(&name, params),
            Address::Tcp(sa) => crate::tcp::listen(sa, params).await,
            Address::Rdma(_) => rdma_listen(addr, params).await,
        }
    })
}

#[cfg(not(feature = "rdma"))]
async fn rdma_connect(_: Address, _: ConnParams) -> Result<Box<dyn Connection>, TransportError> {
    Err(TransportError::Unavailable("built without the `rdma` cargo feature".into()))
}

#[cfg(not(feature = "rdma"))]
async fn rdma_listen(_: Address, _: ConnParams) -> Result<Box<dyn Listener>, TransportError> {
    Err(TransportError::Unavailable("built without the `rdma` cargo feature".into()))
}

#[cfg(feature = "rdma")]
async fn rdma_connect(addr: Address, params: ConnParams) -> Result<Box<dyn Connection>, TransportError> {
    let Address::Rdma(sa) = addr else { unreachable!("dispatched on scheme") };
    crate::rdma::connect(sa, params).await
}

#[cfg(feature = "rdma")]
async fn rdma_listen(addr: Address, params: ConnParams) -> Result<Box<dyn Listener>, TransportError> {
    let Address::Rdma(sa) = addr else { unreachable!("dispatched on scheme") };
    crate::rdma::listen(sa, params).await
}

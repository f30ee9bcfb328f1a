//! A service whose handler reports what it saw of its call (its context), and the tcp server and
//! client the ergonomics tests run it over.

use bytes::Bytes;
use rpc_core::{Client, ClientConfig, Server, ServerConfig};
use serde::{Deserialize, Serialize};

/// What a handler saw of its call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Seen {
    pub method: String,
    pub call_id: u64,
    pub peer: String,
    pub remaining_ms: Option<u64>,
    pub user: Option<String>,
    pub trace_id: Option<String>,
    pub pad_len: u64,
}

#[rpc_core::service]
pub trait Whoami {
    /// Reports the handler's context; `pad` makes the request as large as the test wants.
    async fn whoami(&self, pad: Bytes) -> Seen;
}

pub struct WhoamiImpl;

impl Whoami for WhoamiImpl {
    async fn whoami(&self, pad: Bytes) -> Seen {
        let ctx = rpc_core::context::current().expect("a handler runs inside its call's context");
        Seen {
            method: ctx.method().to_string(),
            call_id: ctx.call_id(),
            peer: ctx.peer().to_string(),
            remaining_ms: ctx.remaining().map(|d| d.as_millis() as u64),
            user: ctx.metadata().get("user").map(str::to_string),
            trace_id: ctx.trace_id().map(str::to_string),
            pad_len: pad.len() as u64,
        }
    }
}

/// A server of `service` on a loopback tcp port, and its address.
pub async fn serve<S: rpc_core::Service>(service: S) -> (Server, String) {
    let server = Server::bind("tcp://127.0.0.1:0", ServerConfig::default(), service).await.expect("bind");
    let addr = server.local_addr().to_string();
    (server, addr)
}

/// A client of the server at `addr`, default configuration.
pub async fn connect(addr: &str) -> Client {
    Client::connect(addr, ClientConfig::default()).await.expect("connect")
}

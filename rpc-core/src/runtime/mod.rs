//! The tokio runtime around the protocol core: one driver task per connection (the only owner
//! of the connection and its state machine, so the hot path takes no locks), client handles that
//! talk to it over a queue, and a server that runs handlers concurrently.

mod call_slots;
mod client;
mod commands;
mod config;
mod driver;
mod handshake;
pub(crate) mod observe;
mod server;

pub use client::Client;
pub use config::{CallOptions, ClientConfig, Reconnect, ServerConfig};
pub use driver::ConnStats;
pub use server::{Server, ServerResources};

//! The tokio runtime around the protocol core: one driver task per connection, client handles
//! that talk to it over a queue, and a server that runs handlers concurrently. A server's driver
//! owns its connection and state machine outright; a client's shares them, behind a lock no one
//! holds across an await, with the task of a call made while no other is in flight, which then
//! drives the connection itself (`wake_route`), so a lone call needs no second task.

mod call_slots;
mod client;
mod commands;
mod config;
pub(crate) mod driver;
mod handler_tasks;
mod handshake;
pub(crate) mod observe;
mod server;
#[cfg(test)]
mod test_wakers;
mod timer_thread;
mod wake_route;

pub use client::Client;
pub use config::{CallOptions, ClientConfig, InlineHandlers, Reconnect, ServerConfig};
pub use driver::ConnStats;
pub use server::{Server, ServerResources};

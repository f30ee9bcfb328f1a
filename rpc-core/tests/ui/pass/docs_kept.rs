//! Generated public items are documented and the user's docs are kept: with `missing_docs` denied, a
//! dropped doc or an undocumented generated item fails the build. The expansion is warning-free.
#![deny(
    missing_docs,
    missing_debug_implementations,
    unused,
    rust_2018_idioms,
    nonstandard_style,
    unreachable_pub
)]

//! Crate docs.

/// A documented service.
#[rpc_core::service]
pub trait Greeter {
    /// Says hello to `name`.
    async fn hello(&self, name: String) -> String;
    /// Says goodbye.
    async fn bye(&self);
}

/// An implementation.
#[derive(Debug)]
pub struct English;

impl Greeter for English {
    async fn hello(&self, name: String) -> String {
        format!("hello {name}")
    }

    async fn bye(&self) {}
}

fn main() {
    let server: GreeterServer<English> = GreeterServer::new(English);
    assert_eq!(rpc_core::Service::name(&server), "Greeter");
    assert_eq!(futures::executor::block_on(English.hello("you".into())), "hello you");
}

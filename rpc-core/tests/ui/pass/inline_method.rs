//! `#[rpc(inline)]` marks a method's `MethodDesc` and nothing else: the trait as emitted carries no
//! `#[rpc]` attribute (it would not compile: there is no such attribute outside the macro), and
//! the implementation is written as for any other method.

#[rpc_core::service]
pub trait Kv {
    /// Answers at once.
    #[rpc(inline)]
    async fn get(&self, key: u8) -> u8;
    async fn put(&self, key: u8, value: u8);
}

struct Store;

impl Kv for Store {
    async fn get(&self, key: u8) -> u8 {
        key
    }

    async fn put(&self, _key: u8, _value: u8) {}
}

fn main() {
    let server = KvServer::new(Store);
    let methods = rpc_core::Service::methods(&server);
    let inline: Vec<_> = methods.iter().map(|m| (m.name, m.inline)).collect();
    assert_eq!(inline, [("get", true), ("put", false)]);
}

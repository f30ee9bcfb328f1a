//! Names the user picks don't collide with the expansion's own: arguments called `inner`, `payload`,
//! `method`, `client` or `opts`, a type called `S`, raw identifiers, `mut` bindings, supertraits, a
//! restricted visibility and a service declared inside a function.

use futures::executor::block_on;
use rpc_core::Service;

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
pub struct S(u32);

mod services {
    use super::S;

    #[rpc_core::service]
    pub(crate) trait Names: std::fmt::Debug {
        async fn r#type(&self, inner: S, payload: u8, method: u16, client: u32, opts: u64) -> S;
        async fn adjust(&self, mut value: u32) -> u32;
    }
}

use services::{Names, NamesClient, NamesServer};

#[derive(Debug)]
struct Impl;

impl Names for Impl {
    async fn r#type(&self, inner: S, payload: u8, method: u16, client: u32, opts: u64) -> S {
        S(inner.0 + u32::from(payload) + u32::from(method) + client + opts as u32)
    }

    async fn adjust(&self, mut value: u32) -> u32 {
        value += 1;
        value
    }
}

fn main() {
    assert_eq!(block_on(Impl.r#type(S(1), 2, 3, 4, 5)), S(15));
    assert_eq!(block_on(Impl.adjust(1)), 2);
    assert_eq!(NamesClient::TYPE, rpc_core::__private::method_id("Names.type(inner:S,payload:u8,method:u16,client:u32,opts:u64)->S"));
    let server = NamesServer::new(Impl);
    assert_eq!(server.methods()[0].name, "type");
    // The dispatcher's own locals don't capture the user's `inner`/`payload`/`method` arguments.
    let args = rpc_core::codec::encode(&(S(10), 1u8, 2u16, 3u32, 4u64)).unwrap();
    let reply = block_on(server.call(NamesClient::TYPE, args.into())).unwrap();
    assert_eq!(rpc_core::codec::decode::<S>(&reply).unwrap(), S(20));

    fn local_service() -> &'static str {
        #[rpc_core::service]
        trait Local {
            async fn run(&self);
        }
        struct Runner;
        impl Local for Runner {
            async fn run(&self) {}
        }
        LocalServer::new(Runner).name()
    }
    assert_eq!(local_service(), "Local");
}

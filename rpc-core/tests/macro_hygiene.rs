//! The `#[service]` expansion names everything by absolute path: it compiles in a
//! `#![no_implicit_prelude]` module, reaching rpc-core under another name through `crate = ".."`.
//! (That the expansion then never names `::rpc_core` is checked on its tokens by rpc-macros' unit
//! test `crate_argument_replaces_every_rpc_core_path`, since `::rpc_core` can't be hidden here.)

// Cargo doesn't link a package into its own tests under a second name, so rename it here.
extern crate rpc_core as renamed_rpc;

mod no_prelude {
    #![no_implicit_prelude]

    /// A store.
    #[::renamed_rpc::service(crate = "::renamed_rpc")]
    pub trait Store {
        /// Loads a value.
        async fn load(&self, key: ::std::string::String) -> ::std::option::Option<::std::vec::Vec<u8>>;
        /// Forgets everything.
        async fn clear(&self);
        /// How many values there are.
        async fn count(&self) -> u64;
    }

    /// An empty store.
    pub struct Empty;

    impl Store for Empty {
        async fn load(&self, _key: ::std::string::String) -> ::std::option::Option<::std::vec::Vec<u8>> {
            ::std::option::Option::None
        }

        async fn clear(&self) {}

        async fn count(&self) -> u64 {
            0
        }
    }
}

use futures::executor::block_on;
use no_prelude::{Empty, Store, StoreClient, StoreServer};
use renamed_rpc::Service;

#[test]
fn expansion_compiles_without_the_prelude_and_with_a_renamed_crate() {
    let server = StoreServer::new(Empty);
    assert_eq!(server.name(), "Store");
    let names: Vec<&str> = server.methods().iter().map(|m| m.name).collect();
    assert_eq!(names, ["load", "clear", "count"]);
    assert_eq!(
        StoreClient::LOAD,
        renamed_rpc::__private::method_id(
            "Store.load(key:::std::string::String)->::std::option::Option<::std::vec::Vec<u8>>"
        )
    );
    assert_eq!(block_on(Empty.count()), 0);
    assert_eq!(block_on(Empty.load("k".to_string())), None);
}

#[test]
fn server_refuses_ids_of_no_method() {
    let server = StoreServer::new(Empty);
    let unknown = StoreClient::LOAD ^ StoreClient::CLEAR ^ StoreClient::COUNT;
    let reply = block_on(server.call(unknown, renamed_rpc::__private::Received::new()));
    assert!(reply.is_err());
}

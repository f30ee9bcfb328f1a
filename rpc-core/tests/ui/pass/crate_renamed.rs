//! `crate = ".."` makes the expansion reach rpc-core through another path (here the crate renamed, as
//! a `Cargo.toml` rename would).

extern crate rpc_core as renamed_rpc;

use renamed_rpc::Service;

#[renamed_rpc::service(crate = "::renamed_rpc")]
pub trait Echo {
    async fn echo(&self, text: String) -> String;
}

struct Parrot;

impl Echo for Parrot {
    async fn echo(&self, text: String) -> String {
        text
    }
}

fn main() {
    assert_eq!(EchoClient::ECHO, renamed_rpc::__private::method_id("Echo.echo(text:String)->String"));
    assert_eq!(EchoServer::new(Parrot).name(), "Echo");
    assert_eq!(futures::executor::block_on(Parrot.echo("hi".into())), "hi");
}

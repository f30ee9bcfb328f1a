#[rpc_core::service]
trait Kv {
    async fn new(&self);
}

fn main() {}

#[rpc_core::service]
trait Kv {
    type Key;
    async fn ping(&self);
}

fn main() {}

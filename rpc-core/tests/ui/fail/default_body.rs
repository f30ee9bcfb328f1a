#[rpc_core::service]
trait Kv {
    async fn ping(&self) {}
}

fn main() {}

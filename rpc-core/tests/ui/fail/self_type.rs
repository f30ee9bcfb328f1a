#[rpc_core::service]
trait Kv {
    async fn fork(&self) -> Self;
}

fn main() {}

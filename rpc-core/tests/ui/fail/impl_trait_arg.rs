#[rpc_core::service]
trait Kv {
    async fn get(&self, key: impl Into<String>) -> Vec<u8>;
}

fn main() {}

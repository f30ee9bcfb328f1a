#[rpc_core::service]
trait Kv {
    async fn get(&self, key: &str) -> Vec<u8>;
}

fn main() {}

#[rpc_core::service]
trait Kv {
    async fn get<K: serde::Serialize>(&self, key: K) -> Vec<u8>;
}

fn main() {}

#[rpc_core::service]
trait Kv<K> {
    async fn get(&self, key: K) -> Vec<u8>;
}

fn main() {}

#[rpc_core::service]
trait Kv {
    async fn get(key: String) -> Vec<u8>;
}

fn main() {}

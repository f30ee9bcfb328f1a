#[rpc_core::service]
trait Kv {
    async fn get(&self, key: String) -> &'static [u8];
}

fn main() {}

#[rpc_core::service]
trait Kv {
    async fn put(&mut self, key: String);
}

fn main() {}

#[rpc_core::service]
trait ObjectStore {
    async fn put(&self, key: String, value: Vec<u8>);
    async fn clone(&self, from: String, to: String);
}

fn main() {}

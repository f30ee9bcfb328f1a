#[rpc_core::service]
trait Kv {
    async fn get(&self, key: std::borrow::Cow<'a, str>) -> Vec<u8>;
}

fn main() {}

#[rpc_core::service]
trait Kv {
    fn get(&self, key: String) -> Vec<u8>;
}

fn main() {}

#[rpc_core::service]
struct Kv {
    entries: Vec<u8>,
}

fn main() {}

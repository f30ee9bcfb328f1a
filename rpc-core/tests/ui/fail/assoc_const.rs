#[rpc_core::service]
trait Kv {
    const VERSION: u32;
    async fn ping(&self);
}

fn main() {}

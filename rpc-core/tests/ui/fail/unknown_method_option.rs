#[rpc_core::service]
trait Kv {
    #[rpc(inline, fast)]
    async fn ping(&self);
}

fn main() {}

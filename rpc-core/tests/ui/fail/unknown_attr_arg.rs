#[rpc_core::service(foo)]
trait Kv {
    async fn ping(&self);
}

fn main() {}

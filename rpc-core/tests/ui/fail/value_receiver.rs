#[rpc_core::service]
trait Kv {
    async fn close(self);
}

fn main() {}

#[rpc_core::service]
trait Math {
    async fn add(&self, (a, b): (u8, u8)) -> u8;
}

fn main() {}

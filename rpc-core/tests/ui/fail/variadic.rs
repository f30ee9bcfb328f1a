#[rpc_core::service]
trait Log {
    async fn log(&self, format: String, _: ...);
}

fn main() {}

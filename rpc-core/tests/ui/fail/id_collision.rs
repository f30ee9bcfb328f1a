// "Clash.write_qqrd" and "Clash.fetch_qpfhai" have the same 32-bit FNV-1a hash.
#[rpc_core::service]
trait Clash {
    async fn write_qqrd(&self);
    async fn fetch_qpfhai(&self);
}

fn main() {}

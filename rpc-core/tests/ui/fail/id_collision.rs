// "Clash.m_hdtrw()->()" and "Clash.m_vckxa()->()" have the same 32-bit FNV-1a hash.
#[rpc_core::service]
trait Clash {
    async fn m_hdtrw(&self);
    async fn m_vckxa(&self);
}

fn main() {}

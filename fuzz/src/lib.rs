//! Harnesses of the fuzz targets in `fuzz_targets/`: each target is a thin wrapper over one of
//! these, so that a crashing input can be replayed from a test.

pub mod client;
pub mod enc;
pub mod input;
pub mod seeds;
pub mod server;
pub mod setup;
pub mod tracker;
pub mod wire;

#[cfg(test)]
mod tests;

/// Runs the harness of `target` on one input (what the fuzz target of that name does).
pub fn run(target: &str, data: &[u8]) {
    match target {
        "proto_decode" => wire::proto_decode(data),
        "client_proto" => client::run(data),
        "server_proto" => server::run(data),
        "tcp_reader" => wire::tcp_reader(data),
        "tcp_wire" => wire::tcp_wire(data),
        "rdma_hello" => wire::rdma_hello(data),
        other => panic!("no fuzz target {other}"),
    }
}

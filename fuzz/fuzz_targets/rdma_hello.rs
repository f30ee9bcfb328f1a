//! The rdma backend's in-band hello decoder (built without the rdma feature).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rpc_fuzz::run("rdma_hello", data));

//! The tcp hello and frame-header decoders.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rpc_fuzz::run("tcp_wire", data));

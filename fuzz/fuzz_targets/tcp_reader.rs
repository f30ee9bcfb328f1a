//! The tcp reader task over an in-memory stream of frames (see rpc_fuzz::wire::tcp_reader).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rpc_fuzz::run("tcp_reader", data));

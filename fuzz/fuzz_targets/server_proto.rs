//! The server state machine fed arbitrary frames, completions, timers and handler results (see rpc_fuzz::server).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rpc_fuzz::run("server_proto", data));

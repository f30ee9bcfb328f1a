//! The client state machine fed arbitrary frames, completions, timers and application calls (see rpc_fuzz::client).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rpc_fuzz::run("client_proto", data));

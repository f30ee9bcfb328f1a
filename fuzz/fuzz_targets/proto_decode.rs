//! The protocol header, region descriptors, wire errors and hello: whatever decodes re-encodes to its bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rpc_fuzz::run("proto_decode", data));

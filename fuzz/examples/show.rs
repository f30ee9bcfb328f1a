//! Prints a fuzz input as the harness of its target reads it, then replays it:
//! `cargo run --example show -- <target> <file>` (from `fuzz/`).

use arbitrary::{Arbitrary, Unstructured};
use rpc_fuzz::input::{ClientStep, ServerStep, Setup};
use rpc_fuzz::wire::{Chunk, ReaderSetup};

fn show<'a, S: Arbitrary<'a> + std::fmt::Debug, T: Arbitrary<'a> + std::fmt::Debug>(data: &'a [u8]) {
    let mut u = Unstructured::new(data);
    let Ok(setup) = S::arbitrary(&mut u) else { return };
    println!("{setup:?}");
    while !u.is_empty() {
        match T::arbitrary(&mut u) {
            Ok(step) => println!("  {step:?}"),
            Err(_) => break,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, target, file] = &args[..] else {
        eprintln!("usage: show <target> <file>");
        std::process::exit(2);
    };
    let data = std::fs::read(file).expect("read the input");
    match target.as_str() {
        "client_proto" => show::<Setup, ClientStep>(&data),
        "server_proto" => show::<Setup, ServerStep>(&data),
        "tcp_reader" => show::<ReaderSetup, Chunk>(&data),
        _ => println!("{data:?}"),
    }
    rpc_fuzz::run(target, &data);
    println!("passes");
}

//! The seed encoder agrees with `arbitrary`, the seeds pass their harness and are checked in,
//! and every input kept under `fuzz/regressions/<target>/` still passes.

use std::path::PathBuf;

use arbitrary::{Arbitrary, Unstructured};

use crate::enc::{input, Put};
use crate::input::*;
use crate::seeds::{seeds, setup, TARGETS};
use crate::wire::{Chunk, ReaderSetup};

fn decode_all<'a, S: Arbitrary<'a>, T: Arbitrary<'a>>(data: &'a [u8]) -> (S, Vec<T>) {
    let mut u = Unstructured::new(data);
    let s = S::arbitrary(&mut u).expect("setup");
    let mut steps = Vec::new();
    while !u.is_empty() {
        steps.push(T::arbitrary(&mut u).expect("step"));
    }
    (s, steps)
}

fn round_trips<'a, S, T>(setup: &S, steps: &[T], buf: &'a mut Vec<u8>)
where
    S: Put + Arbitrary<'a> + PartialEq + std::fmt::Debug,
    T: Put + Arbitrary<'a> + PartialEq + std::fmt::Debug,
{
    *buf = input(setup, steps);
    let (s, t): (S, Vec<T>) = decode_all(buf);
    assert_eq!(&s, setup);
    assert_eq!(t, steps);
}

fn frames() -> Vec<Frame> {
    let bodies = [
        Body::Empty,
        Body::Payload(300),
        Body::Bytes(Blob(vec![1, 2, 3])),
        Body::Desc { addr: u64::MAX, len: DescLen::Small(9), rkey: 4 },
        Body::Desc { addr: 1, len: DescLen::Raw(u64::MAX), rkey: 4 },
        Body::Error { code: 77, message: Blob(b"no".to_vec()) },
    ];
    let args = [Arg::Zero, Arg::Millis(9), Arg::Raw(u64::MAX)];
    bodies
        .into_iter()
        .zip(args.into_iter().cycle())
        .map(|(body, arg)| Frame { kind: 2, flags: 3, credits: 4, call_id: 5, method: 6, done: 7, arg, body })
        .collect()
}

#[test]
fn client_steps_encode_as_arbitrary_reads_them() {
    let mut steps = vec![
        ClientStep::Start { method: 1, len: 2, timeout: None },
        ClientStep::StartBadId { pick: 3 },
        ClientStep::Cancel { pick: 4 },
        ClientStep::RecvRaw(Blob(vec![9; 300])), // cut at 255
        ClientStep::Registered { pick: 5, ok: true },
        ClientStep::SendDone { pick: 6, ok: false },
        ClientStep::Advance(7),
        ClientStep::AdvanceSecs(8),
    ];
    steps[3] = ClientStep::RecvRaw(Blob(vec![9; 255]));
    for t in [Timeout::Micros(1), Timeout::Millis(2), Timeout::Secs(3), Timeout::Max] {
        steps.push(ClientStep::Start { method: 0, len: 0, timeout: Some(t) });
    }
    for outcome in [
        ReadOutcome::Ok,
        ReadOutcome::Flushed,
        ReadOutcome::InvalidKey,
        ReadOutcome::OutOfBounds,
        ReadOutcome::Failed,
    ] {
        steps.push(ClientStep::ReadDone { pick: 1, outcome });
    }
    steps.extend(frames().into_iter().map(ClientStep::Recv));
    round_trips(&setup(), &steps, &mut Vec::new());
}

#[test]
fn server_steps_encode_as_arbitrary_reads_them() {
    let mut steps = vec![
        ServerStep::RecvRaw(Blob(vec![1])),
        ServerStep::Respond { pick: 1, reply: Reply::Ok(5) },
        ServerStep::Respond { pick: 200, reply: Reply::Err { code: 1, len: 2 } },
        ServerStep::Registered { pick: 2, ok: false },
        ServerStep::ReadDone { pick: 3, outcome: ReadOutcome::OutOfBounds },
        ServerStep::SendDone { pick: 4, ok: true },
        ServerStep::Advance(5),
        ServerStep::AdvanceSecs(6),
        ServerStep::Shutdown,
    ];
    steps.extend(frames().into_iter().map(ServerStep::Recv));
    round_trips(&setup(), &steps, &mut Vec::new());
}

#[test]
fn reader_chunks_encode_as_arbitrary_reads_them() {
    let setup = ReaderSetup {
        recv_depth: 1,
        recv_size: 2,
        region_len: 3,
        reads: [Some(4), None, Some(5)],
        push_window: 6,
        pushed: 7,
    };
    let chunks = [
        Chunk::Raw(Blob(vec![1, 2])),
        Chunk::Send(3),
        Chunk::ReadReq { id: 1, offset: -2, len: 3, key_flip: 4 },
        Chunk::ReadResp { pick: 1, status: 2, len: Some(3) },
        Chunk::ReadResp { pick: 1, status: 0, len: None },
        Chunk::Push { key: 8, len: 9 },
        Chunk::Revoke(10),
        Chunk::Window { key: 11, len: Some(12) },
        Chunk::Window { key: 13, len: None },
    ];
    round_trips(&setup, &chunks, &mut Vec::new());
}

#[test]
fn seeds_pass_their_harness() {
    for target in TARGETS {
        let seeds = seeds(target);
        assert!(!seeds.is_empty(), "{target} has no seed");
        for (name, data) in seeds {
            eprintln!("{target}/{name}");
            crate::run(target, &data);
        }
    }
}

fn dir(kind: &str, target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(kind).join(target)
}

#[test]
fn checked_in_seeds_are_current() {
    let write = std::env::var_os("FUZZ_WRITE_SEEDS").is_some();
    for target in TARGETS {
        let dir = dir("seeds", target);
        for (name, data) in seeds(target) {
            let path = dir.join(name);
            if write {
                std::fs::create_dir_all(&dir).expect("create seed dir");
                std::fs::write(&path, &data).expect("write seed");
            }
            let on_disk = std::fs::read(&path).unwrap_or_default();
            assert!(on_disk == data, "{} is stale: rerun with FUZZ_WRITE_SEEDS=1", path.display());
        }
    }
}

#[test]
fn kept_regressions_pass() {
    let mut replayed = 0;
    for target in TARGETS {
        let Ok(entries) = std::fs::read_dir(dir("regressions", target)) else { continue };
        for entry in entries {
            let path = entry.expect("dir entry").path();
            eprintln!("replaying {}", path.display());
            crate::run(target, &std::fs::read(&path).expect("read input"));
            replayed += 1;
        }
    }
    eprintln!("{replayed} regression inputs replayed");
}

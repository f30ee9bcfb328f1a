//! The sans-I/O protocol with no I/O: header encode/decode, and one whole call (eager and
//! rendezvous) through a minimal in-memory fabric that executes the operations each end asks for.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rpc_core::proto::{
    ClientEvent, ClientProto, Header, Kind, Op, PeerLimits, ProtoConfig, ServerEvent, ServerProto, HEADER_LEN,
};
use rpc_core::transport::{RKey, RegionDesc, SendBuf};

/// The regions one end registered, by key.
#[derive(Default)]
struct Regions {
    by_key: HashMap<RKey, Bytes>,
    next: RKey,
}

impl Regions {
    fn register(&mut self, data: Bytes) -> RegionDesc {
        self.next += 1;
        let desc = RegionDesc { addr: data.as_ptr() as u64, len: data.len() as u64, rkey: self.next };
        self.by_key.insert(desc.rkey, data);
        desc
    }

    fn read(&self, remote: &RegionDesc) -> Vec<u8> {
        let data = self.by_key.get(&remote.rkey).expect("READ of a registered region");
        let off = (remote.addr - data.as_ptr() as u64) as usize;
        data[off..off + remote.len as usize].to_vec()
    }
}

/// A client end and a server end wired back to back.
struct Pair {
    client: ClientProto,
    server: ServerProto,
    c: Regions,
    s: Regions,
    now: Instant,
    next_id: u64,
    /// A frame made one piece again, as a receive buffer holds it.
    scratch: Vec<u8>,
}

/// `frame`'s bytes in one piece, in `scratch` (as the peer's receive buffer would hold them).
fn assembled<'a>(frame: &SendBuf, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    scratch.resize(frame.len(), 0);
    frame.copy_to_slice(scratch);
    scratch
}

fn limits(cfg: &ProtoConfig) -> PeerLimits {
    PeerLimits {
        recv_depth: cfg.recv_depth,
        recv_size: cfg.recv_size(),
        hello: cfg.hello(),
        max_reads_in_flight: 16,
        max_read_size: 1 << 30,
    }
}

impl Pair {
    fn new(threshold: usize) -> Pair {
        let cfg = ProtoConfig::default().eager_threshold(threshold);
        let now = Instant::now();
        Pair {
            client: ClientProto::new(&cfg, &limits(&cfg), now),
            server: ServerProto::new(&cfg, &limits(&cfg), now),
            c: Regions::default(),
            s: Regions::default(),
            now,
            next_id: 0,
            scratch: Vec::new(),
        }
    }

    /// Moves the client's operations; returns whether there were any.
    fn client_ops(&mut self) -> bool {
        let mut moved = false;
        while let Some(op) = self.client.poll_op() {
            moved = true;
            match op {
                Op::Send { wr_id, frame } => {
                    let frame = assembled(&frame, &mut self.scratch);
                    self.server.handle_recv(frame, self.now).expect("server takes the frame");
                    self.client.handle_send_complete(wr_id, Ok(())).expect("send completes");
                }
                Op::Register { call_id, data } => {
                    let d = self.c.register(data);
                    self.client.handle_registered(call_id, Ok(d));
                }
                Op::Deregister { region } => {
                    let rkey = region.rkey;
                    self.c.by_key.remove(&rkey);
                }
                Op::Read { wr_id, remote } => {
                    let data = self.s.read(&remote);
                    self.client.handle_read_complete(wr_id, Ok(data.into()));
                }
            }
        }
        moved
    }

    /// Moves the server's operations and runs its requests (an echo); returns whether anything moved.
    fn server_ops(&mut self) -> bool {
        let mut moved = false;
        while let Some(ServerEvent::Request { call_id, payload, .. }) = self.server.poll_event() {
            moved = true;
            self.server.respond(call_id, Ok(payload.into_bytes()));
        }
        while let Some(op) = self.server.poll_op() {
            moved = true;
            match op {
                Op::Send { wr_id, frame } => {
                    let frame = assembled(&frame, &mut self.scratch);
                    self.client.handle_recv(frame, self.now).expect("client takes the frame");
                    self.server.handle_send_complete(wr_id, Ok(())).expect("send completes");
                }
                Op::Register { call_id, data } => {
                    let d = self.s.register(data);
                    self.server.handle_registered(call_id, Ok(d));
                }
                Op::Deregister { region } => {
                    let rkey = region.rkey;
                    self.s.by_key.remove(&rkey);
                }
                Op::Read { wr_id, remote } => {
                    let data = self.c.read(&remote);
                    self.server.handle_read_complete(wr_id, Ok(data.into()));
                }
            }
        }
        moved
    }

    /// One echo call, start to completion.
    fn call(&mut self, payload: Bytes) -> Bytes {
        self.next_id += 1;
        let id = self.next_id;
        self.client.start_call(id, 7, payload, None, self.now).expect("call starts");
        loop {
            let moved = self.client_ops() | self.server_ops();
            if let Some(ClientEvent::Completed { result, .. }) = self.client.poll_event() {
                // Let the done report and revocations flow before the next call.
                while self.client_ops() | self.server_ops() {}
                return result.expect("call succeeds").into_bytes();
            }
            assert!(moved, "the protocol stalled");
        }
    }
}

fn header(c: &mut Criterion) {
    let mut h = Header::new(Kind::Request);
    h.call_id = 42;
    h.method_id = 0xdead_beef;
    h.credits = 3;
    h.body_len = 32;
    let mut buf = [0u8; HEADER_LEN];
    h.encode(&mut buf);
    let mut frame = buf.to_vec();
    frame.extend_from_slice(&[0u8; 32]);
    let mut g = c.benchmark_group("header");
    g.bench_function("encode", |b| {
        b.iter(|| {
            let mut out = [0u8; HEADER_LEN];
            black_box(&h).encode(&mut out);
            black_box(out)
        })
    });
    g.bench_function("decode", |b| b.iter(|| Header::decode(black_box(&frame)).expect("valid header")));
    g.finish();
}

fn call(c: &mut Criterion) {
    let mut g = c.benchmark_group("proto_call");
    for (name, size) in
        [("eager", 32usize), ("eager", 4096), ("rendezvous", 64 << 10), ("rendezvous", 1 << 20)]
    {
        let mut pair = Pair::new(8192);
        let payload = Bytes::from(vec![7u8; size]);
        assert_eq!(pair.call(payload.clone()).len(), size, "echo returns the payload");
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new(name, size), &payload, |b, p| b.iter(|| pair.call(p.clone())));
    }
    g.finish();
}

criterion_group!(benches, header, call);
criterion_main!(benches);

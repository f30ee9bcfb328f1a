//! Two protocol ends wired together in memory, with a virtual clock: the "fabric" executes the
//! operations each end asks for (SEND into the peer's posted receives, register, revoke, READ).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rpc_transport::{RKey, ReadError, Received, RegionDesc, SendBuf, WrId};

use crate::proto::*;
use crate::runtime::driver::ProtoEnd;

/// One end's side of the fabric.
#[derive(Default)]
pub struct Side {
    pub regions: HashMap<RKey, Bytes>,
    pub revoked: Vec<RKey>,
    next_rkey: RKey,
    pub inbox: VecDeque<Bytes>,
    pub posted: u32,
    pub unexpected: u32,
    pub reads: VecDeque<(u64, RegionDesc)>,
    /// Every frame delivered to this side, in order.
    pub delivered: Vec<Bytes>,
}

impl Side {
    fn new(depth: u32) -> Side {
        Side { posted: depth, next_rkey: 0x100, ..Side::default() }
    }

    fn register(&mut self, data: Bytes) -> RegionDesc {
        self.next_rkey += 1;
        let desc = RegionDesc { addr: data.as_ptr() as u64, len: data.len() as u64, rkey: self.next_rkey };
        self.regions.insert(desc.rkey, data);
        desc
    }

    pub fn serve_read(&self, remote: &RegionDesc) -> Result<Bytes, ReadError> {
        let data = self.regions.get(&remote.rkey).ok_or(ReadError::InvalidKey(remote.rkey))?;
        let off = remote.addr.checked_sub(data.as_ptr() as u64);
        let end = off.and_then(|o| o.checked_add(remote.len));
        match (off, end) {
            (Some(o), Some(e)) if e <= data.len() as u64 => Ok(data.slice(o as usize..e as usize)),
            _ => Err(ReadError::OutOfBounds { addr: remote.addr, len: remote.len }),
        }
    }
}

pub struct Pair {
    pub client: ClientProto,
    pub server: ServerProto,
    pub c: Side,
    pub s: Side,
    pub now: Instant,
    pub client_events: Vec<ClientEvent>,
    pub server_events: Vec<ServerEvent>,
    /// While set, READs are queued but not served.
    pub hold_reads: bool,
    /// SENDs each side has posted so far.
    pub client_sends: usize,
    pub server_sends: usize,
    /// Operations are taken as the runtime's driver takes them (`poll_op_into`: SENDs in a
    /// batch, posted once no other operation comes, or before a revocation), not one by one
    /// with `poll_op`.
    pub batched: bool,
}

pub fn config(threshold: usize, depth: u32) -> ProtoConfig {
    ProtoConfig::default().eager_threshold(threshold).recv_depth(depth)
}

pub fn limits(cfg: &ProtoConfig) -> PeerLimits {
    PeerLimits {
        recv_depth: cfg.recv_depth,
        recv_size: cfg.recv_size(),
        hello: cfg.hello(),
        max_reads_in_flight: 16,
        max_read_size: 1 << 30,
    }
}

impl Pair {
    pub fn new(client_cfg: ProtoConfig, server_cfg: ProtoConfig) -> Pair {
        let now = Instant::now();
        Pair {
            client: ClientProto::new(&client_cfg, &limits(&server_cfg), now),
            server: ServerProto::new(&server_cfg, &limits(&client_cfg), now),
            c: Side::new(client_cfg.recv_depth),
            s: Side::new(server_cfg.recv_depth),
            now,
            client_events: Vec::new(),
            server_events: Vec::new(),
            hold_reads: false,
            client_sends: 0,
            server_sends: 0,
            batched: false,
        }
    }

    pub fn with(threshold: usize, depth: u32) -> Pair {
        Pair::new(config(threshold, depth), config(threshold, depth))
    }

    /// Runs both ends until nothing moves.
    pub fn pump(&mut self) {
        while self.step() {}
    }

    fn step(&mut self) -> bool {
        let mut moved = self.client_ops() > 0;
        moved |= self.server_ops() > 0;
        moved |= self.deliver_to_server(usize::MAX) > 0;
        moved |= self.deliver_to_client(usize::MAX) > 0;
        if !self.hold_reads {
            moved |= self.serve_reads();
        }
        while let Some(e) = self.client.poll_event() {
            moved = true;
            self.client_events.push(e);
        }
        while let Some(e) = self.server.poll_event() {
            moved = true;
            self.server_events.push(e);
        }
        moved
    }

    /// Carries out every operation the client asks for now (its SENDs go into the server's
    /// inbox, not handled yet); returns how many operations there were, and counts the SENDs
    /// in `client_sends`.
    pub fn client_ops(&mut self) -> usize {
        run_ops(&mut self.client, &mut self.c, &mut self.s, &mut self.client_sends, self.batched)
    }

    /// [`Pair::client_ops`] for the server (SENDs counted in `server_sends`).
    pub fn server_ops(&mut self) -> usize {
        run_ops(&mut self.server, &mut self.s, &mut self.c, &mut self.server_sends, self.batched)
    }

    /// The server handles at most `n` frames of its inbox, oldest first (each receive
    /// re-posted, as the driver does before it next polls); returns how many.
    pub fn deliver_to_server(&mut self, n: usize) -> usize {
        let mut handled = 0;
        while handled < n {
            let Some(frame) = self.s.inbox.pop_front() else { break };
            self.server.handle_recv(&frame, self.now).expect("server rejected a frame");
            self.s.posted += 1; // the driver re-posts before the next poll_op
            handled += 1;
        }
        handled
    }

    /// [`Pair::deliver_to_server`] for the client.
    pub fn deliver_to_client(&mut self, n: usize) -> usize {
        let mut handled = 0;
        while handled < n {
            let Some(frame) = self.c.inbox.pop_front() else { break };
            self.client.handle_recv(&frame, self.now).expect("client rejected a frame");
            self.c.posted += 1;
            handled += 1;
        }
        handled
    }

    /// Serves every queued READ against the peer's current region table.
    pub fn serve_reads(&mut self) -> bool {
        let mut moved = false;
        while let Some((wr_id, remote)) = self.c.reads.pop_front() {
            moved = true;
            let r = self.s.serve_read(&remote);
            self.client.handle_read_complete(wr_id, r);
        }
        while let Some((wr_id, remote)) = self.s.reads.pop_front() {
            moved = true;
            let r = self.c.serve_read(&remote);
            self.server.handle_read_complete(wr_id, r);
        }
        moved
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.client.handle_timeout(self.now).expect("client timeout fatal");
        self.server.handle_timeout(self.now).expect("server timeout fatal");
        self.pump();
    }

    pub fn call(&mut self, call_id: u64, payload: Bytes) {
        self.client.start_call(call_id, 7, payload, None, self.now).expect("start_call");
    }

    /// Takes the requests the server has been given so far: `(call_id, payload, path)`.
    pub fn take_requests(&mut self) -> Vec<(u64, Bytes, Path)> {
        while let Some(e) = self.server.poll_event() {
            self.server_events.push(e);
        }
        let mut out = Vec::new();
        for e in std::mem::take(&mut self.server_events) {
            match e {
                ServerEvent::Request { call_id, payload, path, .. } => {
                    out.push((call_id, payload.into_bytes(), path))
                }
                other => self.server_events.push(other),
            }
        }
        out
    }

    /// Takes the completed calls so far: `(call_id, result, info)`.
    pub fn take_completions(&mut self) -> Vec<(u64, Result<Bytes, CallFailure>, CallInfo)> {
        while let Some(e) = self.client.poll_event() {
            self.client_events.push(e);
        }
        self.client_events
            .drain(..)
            .map(|ClientEvent::Completed { call_id, result, info }| {
                (call_id, result.map(Received::into_bytes), info)
            })
            .collect()
    }
}

/// Carries out every operation `end` asks for now: its SENDs go into `peer`'s inbox (counted in
/// `sends`), its regions into `own`'s table. Returns how many operations there were. `batched`:
/// as the runtime's driver does (`driver::post_ops`), else one by one.
fn run_ops(
    end: &mut impl ProtoEnd,
    own: &mut Side,
    peer: &mut Side,
    sends: &mut usize,
    batched: bool,
) -> usize {
    let mut ops = 0;
    let mut batch = Vec::new();
    loop {
        while let Some(op) = if batched { end.next_op_into(&mut batch) } else { end.next_op() } {
            match op {
                // One by one: posted at once.
                Op::Send { wr_id, frame } => batch.push((wr_id, frame)),
                Op::Register { call_id, data } => {
                    ops += 1;
                    let d = own.register(data);
                    end.handle_registered(call_id, Ok(d));
                }
                Op::Deregister { region } => {
                    // The SENDs asked for before it go first.
                    ops += 1;
                    ops += post(end, &mut batch, peer, sends);
                    revoke(own, region.rkey)
                }
                Op::Read { wr_id, remote } => {
                    ops += 1;
                    own.reads.push_back((wr_id, remote));
                }
            }
            if !batched {
                ops += post(end, &mut batch, peer, sends);
            }
        }
        if batch.is_empty() {
            return ops;
        }
        ops += post(end, &mut batch, peer, sends);
        // A SEND completed may have let the end send more (its send window).
        if !end.has_ops() {
            return ops;
        }
    }
}

/// Posts `batch` (into `peer`'s inbox) and completes its SENDs; returns how many there were.
fn post(
    end: &mut impl ProtoEnd,
    batch: &mut Vec<(WrId, SendBuf)>,
    peer: &mut Side,
    sends: &mut usize,
) -> usize {
    let n = batch.len();
    for (wr_id, frame) in batch.drain(..) {
        *sends += 1;
        deliver(peer, frame.into_bytes());
        end.handle_send(wr_id, Ok(())).expect("send completion");
    }
    n
}

fn deliver(to: &mut Side, frame: Bytes) {
    if to.posted == 0 {
        to.unexpected += 1;
    } else {
        to.posted -= 1;
    }
    to.delivered.push(frame.clone());
    to.inbox.push_back(frame);
}

fn revoke(side: &mut Side, rkey: RKey) {
    assert!(side.regions.remove(&rkey).is_some(), "revoked a key twice or an unknown key {rkey:#x}");
    side.revoked.push(rkey);
}

/// A payload whose bytes depend on `seed` and the position.
pub fn payload(len: usize, seed: u8) -> Bytes {
    Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>())
}

//! The client end fed arbitrary frames from the server, completions and application calls.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use rpc_core::proto::{ClientEvent, ClientProto, Kind, StartError};

use crate::input::{payload, ClientStep, Setup, Timeout};
use crate::setup::{config, peer};
use crate::tracker::Tracker;

/// Decodes `data` as a setup and steps, and runs them.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(setup) = Setup::arbitrary(&mut u) else { return };
    let steps = std::iter::from_fn(|| if u.is_empty() { None } else { ClientStep::arbitrary(&mut u).ok() });
    run_steps(&setup, steps);
}

/// Runs `steps` against a client end set up as `setup` says, checking every invariant.
pub fn run_steps(setup: &Setup, steps: impl IntoIterator<Item = ClientStep>) {
    let mut h = Harness::new(setup);
    for step in steps {
        if !h.step(step) || !h.drain() {
            return; // the connection died (die() checked that every region was revoked)
        }
    }
    h.finish();
}

struct Harness {
    proto: ClientProto,
    ops: Tracker,
    /// Our receive buffers' size: the transport never delivers a longer frame (it fails the
    /// connection instead).
    recv_size: usize,
    now: Instant,
    next_id: u64,
    /// Every call id started, in order (for picks).
    started: Vec<u64>,
    /// Calls started that have neither completed nor been cancelled.
    live: BTreeSet<u64>,
    peer_max_message: u64,
}

impl Harness {
    fn new(setup: &Setup) -> Harness {
        let cfg = config(setup);
        let peer = peer(setup);
        let now = Instant::now();
        Harness {
            proto: ClientProto::new(&cfg, &peer, now),
            ops: Tracker::new(
                &[Kind::Request, Kind::Cancel, Kind::Credit, Kind::Ping, Kind::Pong],
                peer,
                cfg.max_message_size,
            ),
            recv_size: cfg.recv_size() as usize,
            now,
            next_id: 1,
            started: Vec::new(),
            live: BTreeSet::new(),
            peer_max_message: peer.hello.max_message_size,
        }
    }

    /// Applies one input; `false` once the connection is dead.
    fn step(&mut self, step: ClientStep) -> bool {
        match step {
            ClientStep::Start { method, len, timeout } => {
                let id = self.next_id;
                self.next_id += 1;
                let timeout = timeout.map(|t| match t {
                    Timeout::Micros(us) => Duration::from_micros(u64::from(us)),
                    Timeout::Millis(ms) => Duration::from_millis(u64::from(ms)),
                    Timeout::Secs(s) => Duration::from_secs(u64::from(s)),
                    Timeout::Max => Duration::MAX,
                });
                let len = usize::from(len);
                match self.proto.start_call(id, u32::from(method), payload(len), timeout, self.now) {
                    Ok(()) => {
                        assert!(
                            len as u64 <= self.peer_max_message,
                            "started a call larger than the peer accepts"
                        );
                        self.started.push(id);
                        self.live.insert(id);
                    }
                    Err(StartError::TooLarge { .. }) => assert!(len as u64 > self.peer_max_message),
                    Err(StartError::TooManyInFlight(max)) => assert!(self.live.len() >= max as usize),
                    Err(e) => panic!("a fresh call id refused: {e}"),
                }
            }
            ClientStep::StartBadId { pick } => {
                let id = match self.live.iter().nth(usize::from(pick) % self.live.len().max(1)) {
                    Some(&id) if pick != 0 => id,
                    _ => 0,
                };
                let r = self.proto.start_call(id, 1, payload(1), None, self.now);
                assert!(r.is_err(), "call id {id} accepted while it may not be used");
            }
            ClientStep::Cancel { pick } => {
                let id = match self.started.len() {
                    0 => u64::from(pick) + 1,
                    n => self.started[usize::from(pick) % n],
                };
                let was_live = self.live.remove(&id);
                assert_eq!(
                    self.proto.cancel(id),
                    was_live,
                    "cancel({id}) disagrees on whether it was in progress"
                );
            }
            ClientStep::Recv(frame) => return self.deliver(&frame.encode()),
            ClientStep::RecvRaw(bytes) => return self.deliver(&bytes.0),
            ClientStep::Registered { pick, ok } => {
                if let Some((call_id, result)) = self.ops.take_register(pick, ok) {
                    self.proto.handle_registered(call_id, result);
                }
            }
            ClientStep::ReadDone { pick, outcome } => {
                if let Some((wr_id, result)) = self.ops.take_read(pick, outcome) {
                    self.proto.handle_read_complete(wr_id, result);
                }
            }
            ClientStep::SendDone { pick, ok } => {
                if let Some((wr_id, result)) = self.ops.take_send(pick, ok) {
                    if self.proto.handle_send_complete(wr_id, result).is_err() {
                        return self.die();
                    }
                }
            }
            ClientStep::Advance(ms) => return self.advance(Duration::from_millis(u64::from(ms))),
            ClientStep::AdvanceSecs(s) => return self.advance(Duration::from_secs(u64::from(s))),
        }
        true
    }

    fn deliver(&mut self, frame: &[u8]) -> bool {
        if frame.len() > self.recv_size {
            return self.die();
        }
        match self.proto.handle_recv(frame, self.now) {
            Ok(()) => {
                self.ops.on_received(frame);
                true
            }
            Err(_) => self.die(),
        }
    }

    /// Moves the clock; `false` if a timeout was fatal (a silent peer, an overdue READ or done
    /// report): the connection dies.
    fn advance(&mut self, by: Duration) -> bool {
        self.now += by;
        match self.proto.handle_timeout(self.now) {
            Ok(()) => true,
            Err(_) => self.die(),
        }
    }

    /// Takes every operation and event, as the driver does after each input; runs the timers
    /// when they are due, and checks that they are then no longer due.
    fn drain(&mut self) -> bool {
        if self.proto.poll_timeout().is_some_and(|at| at <= self.now)
            && self.proto.handle_timeout(self.now).is_err()
        {
            return self.die();
        }
        if let Some(at) = self.proto.poll_timeout() {
            assert!(at > self.now, "a timer still due after handle_timeout: the driver would spin");
        }
        while let Some(op) = self.proto.poll_op() {
            self.ops.on_op(op);
        }
        self.take_events();
        assert_eq!(self.proto.calls_in_flight(), self.live.len(), "calls in flight disagree");
        self.ops.check_regions(self.proto.regions_advertised());
        true
    }

    fn take_events(&mut self) {
        while let Some(ClientEvent::Completed { call_id, .. }) = self.proto.poll_event() {
            assert!(self.live.remove(&call_id), "Completed for call {call_id}, which is not in progress");
        }
    }

    /// The connection died: every call in progress completes once, with an error. As in the
    /// runtime, the connection is closed first: no operation is posted any more.
    fn die(&mut self) -> bool {
        self.proto.fail_all("fuzz: connection closed");
        self.ops.revoke_after_close(|| self.proto.poll_op());
        self.take_events();
        assert!(self.live.is_empty(), "calls lost when the connection died: {:?}", self.live);
        false
    }

    fn finish(mut self) {
        if self.drain() {
            self.die();
        }
    }
}

//! The server end fed arbitrary frames from the client, completions and handler results.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use rpc_core::proto::{Kind, ServerEvent, ServerProto, WireError, WireErrorCode};

use crate::input::{payload, Reply, ServerStep, Setup};
use crate::setup::{config, peer};
use crate::tracker::Tracker;

/// Decodes `data` as a setup and steps, and runs them.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(setup) = Setup::arbitrary(&mut u) else { return };
    let steps = std::iter::from_fn(|| if u.is_empty() { None } else { ServerStep::arbitrary(&mut u).ok() });
    run_steps(&setup, steps);
}

/// Runs `steps` against a server end set up as `setup` says, checking every invariant.
pub fn run_steps(setup: &Setup, steps: impl IntoIterator<Item = ServerStep>) {
    let mut h = Harness::new(setup);
    for step in steps {
        if !h.step(step) || !h.drain() {
            return; // the connection died (die() checked that every region was revoked)
        }
    }
    h.finish();
}

struct Harness {
    proto: ServerProto,
    ops: Tracker,
    /// Our receive buffers' size: the transport never delivers a longer frame (it fails the
    /// connection instead).
    recv_size: usize,
    now: Instant,
    /// Calls whose handler runs: a Request event came, and no Cancel nor response since.
    running: BTreeSet<u64>,
}

impl Harness {
    fn new(setup: &Setup) -> Harness {
        let cfg = config(setup);
        let peer = peer(setup);
        let now = Instant::now();
        Harness {
            proto: ServerProto::new(&cfg, &peer, now),
            ops: Tracker::new(
                &[Kind::Response, Kind::Credit, Kind::Ping, Kind::Pong],
                peer,
                cfg.max_message_size,
            ),
            recv_size: cfg.recv_size() as usize,
            now,
            running: BTreeSet::new(),
        }
    }

    fn step(&mut self, step: ServerStep) -> bool {
        match step {
            ServerStep::Recv(frame) => return self.deliver(&frame.encode()),
            ServerStep::RecvRaw(bytes) => return self.deliver(&bytes.0),
            ServerStep::Respond { pick, reply } => {
                let id = match self.running.iter().nth(usize::from(pick) % self.running.len().max(1)) {
                    Some(&id) if pick < 128 => id,
                    _ => u64::from(pick & 0x7f),
                };
                let result = match reply {
                    Reply::Ok(len) => Ok(payload(usize::from(len))),
                    Reply::Err { code, len } => {
                        Err(WireError::new(WireErrorCode::Other(code), "e".repeat(usize::from(len))))
                    }
                };
                let expected = self.running.remove(&id);
                assert_eq!(
                    self.proto.respond(id, result),
                    expected,
                    "respond({id}) disagrees on whether it runs"
                );
            }
            ServerStep::Registered { pick, ok } => {
                if let Some((call_id, result)) = self.ops.take_register(pick, ok) {
                    self.proto.handle_registered(call_id, result);
                }
            }
            ServerStep::ReadDone { pick, outcome } => {
                if let Some((wr_id, result)) = self.ops.take_read(pick, outcome) {
                    self.proto.handle_read_complete(wr_id, result);
                }
            }
            ServerStep::SendDone { pick, ok } => {
                if let Some((wr_id, result)) = self.ops.take_send(pick, ok) {
                    if self.proto.handle_send_complete(wr_id, result).is_err() {
                        return self.die();
                    }
                }
            }
            ServerStep::Advance(ms) => return self.advance(Duration::from_millis(u64::from(ms))),
            ServerStep::AdvanceSecs(s) => return self.advance(Duration::from_secs(u64::from(s))),
            ServerStep::Shutdown => self.proto.begin_shutdown(),
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
        assert!(self.proto.calls_in_flight() >= self.running.len(), "running handlers not counted in flight");
        self.ops.check_regions(self.proto.regions_advertised());
        true
    }

    fn take_events(&mut self) {
        while let Some(event) = self.proto.poll_event() {
            match event {
                ServerEvent::Request { call_id, .. } => {
                    assert!(self.running.insert(call_id), "a second Request event for running call {call_id}")
                }
                ServerEvent::Cancel { call_id, .. } => {
                    self.running.remove(&call_id);
                }
            }
        }
    }

    /// The connection died; as in the runtime, it is closed first: no operation is posted any more.
    fn die(&mut self) -> bool {
        self.proto.fail_all();
        self.ops.revoke_after_close(|| self.proto.poll_op());
        self.running.clear();
        self.take_events();
        assert_eq!(self.proto.calls_in_flight(), 0, "calls left after the connection died");
        false
    }

    fn finish(mut self) {
        if self.drain() {
            self.die();
        }
    }
}

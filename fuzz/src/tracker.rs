//! What both state-machine targets check of the operations a protocol end asks for, and the
//! transport they model: completions come only for operations posted, each exactly once, in any
//! order the input picks.

use std::collections::BTreeSet;

use bytes::Bytes;
use rpc_core::proto::{
    Header, Kind, Op, PeerLimits, DESC_LEN, FLAG_ERROR, FLAG_RENDEZVOUS, HEADER_LEN, MAX_ERROR_MESSAGE,
};
use rpc_transport::{Detail, ReadError, RegionDesc};

use crate::input::{payload, ReadOutcome};

/// The operations posted and not yet completed, and the invariants on all of them.
#[derive(Debug)]
pub struct Tracker {
    /// Frame kinds this end may send.
    kinds: &'static [Kind],
    peer: PeerLimits,
    /// Our largest accepted payload: the bound of every READ we issue.
    max_message: u64,
    /// Credits we hold towards the peer (mirrors the protocol's own count).
    credits: i64,
    /// Frames the protocol accepted from the peer: the most credits it may ever return.
    frames_received: u64,
    credits_returned: u64,
    /// SENDs posted (wr_id).
    pub sends: Vec<u64>,
    /// Registrations asked for (call id, length).
    pub registers: Vec<(u64, usize)>,
    /// READs issued (wr_id, region).
    pub reads: Vec<(u64, RegionDesc)>,
    /// Keys registered and not yet revoked.
    pub rkeys: BTreeSet<u32>,
    next_rkey: u32,
}

impl Tracker {
    /// A tracker for an end that may send `kinds`.
    pub fn new(kinds: &'static [Kind], peer: PeerLimits, max_message: u64) -> Tracker {
        Tracker {
            kinds,
            peer,
            max_message,
            credits: i64::from(peer.recv_depth),
            frames_received: 0,
            credits_returned: 0,
            sends: Vec::new(),
            registers: Vec::new(),
            reads: Vec::new(),
            rkeys: BTreeSet::new(),
            next_rkey: 1,
        }
    }

    /// The protocol accepted `frame` from the peer.
    pub fn on_received(&mut self, frame: &[u8]) {
        let h = Header::decode(frame).expect("a frame the protocol accepted decodes");
        self.frames_received += 1;
        self.credits += i64::from(h.credits);
        assert!(
            self.credits <= i64::from(self.peer.recv_depth),
            "accepted more credits than the peer has receives"
        );
    }

    /// Checks one operation the protocol asked for and records it as posted.
    pub fn on_op(&mut self, op: Op) {
        match op {
            Op::Send { wr_id, frame } => self.on_send(wr_id, &frame.into_bytes()),
            Op::Register { call_id, data } => {
                assert!(
                    data.len() as u64 <= self.peer.hello.max_message_size,
                    "registered a payload of {} bytes for a peer that accepts {}",
                    data.len(),
                    self.peer.hello.max_message_size
                );
                self.registers.push((call_id, data.len()));
            }
            Op::Deregister { region: rpc_transport::RegionDesc { rkey, .. } } => {
                assert!(self.rkeys.remove(&rkey), "revoked key {rkey:#x}, which is not registered (twice?)");
            }
            Op::Read { wr_id, remote } => {
                assert!(
                    remote.len > 0 && remote.len <= self.max_message,
                    "READ of {} bytes (limit {})",
                    remote.len,
                    self.max_message
                );
                assert!(
                    self.reads.iter().all(|r| r.0 != wr_id),
                    "a second READ with wr_id {wr_id} while the first is in flight"
                );
                self.reads.push((wr_id, remote));
            }
        }
    }

    fn on_send(&mut self, wr_id: u64, frame: &[u8]) {
        let h = Header::decode(frame).unwrap_or_else(|e| panic!("sent a frame that does not decode: {e}"));
        assert!(self.kinds.contains(&h.kind), "this end sent a {:?} frame", h.kind);
        assert!(self.credits > 0, "sent a frame without a credit");
        self.credits -= 1;
        self.credits_returned += u64::from(h.credits);
        assert!(
            self.credits_returned <= self.frames_received,
            "returned {} credits for {} frames received",
            self.credits_returned,
            self.frames_received
        );
        let eager_payload = matches!(h.kind, Kind::Request | Kind::Response) && h.flags == 0;
        let largest = if eager_payload {
            self.peer.recv_size as usize
        } else if h.flags & FLAG_ERROR != 0 {
            HEADER_LEN + 2 + MAX_ERROR_MESSAGE
        } else if h.flags & FLAG_RENDEZVOUS != 0 {
            HEADER_LEN + DESC_LEN
        } else {
            HEADER_LEN
        };
        assert!(frame.len() <= largest, "{:?} frame of {} bytes (at most {largest})", h.kind, frame.len());
        assert!(
            frame.len() <= self.peer.recv_size as usize,
            "a frame larger than the peer's receive buffers"
        );
        assert!(!self.sends.contains(&wr_id), "SEND wr_id {wr_id} reused while in flight");
        self.sends.push(wr_id);
    }

    /// Takes the registration `pick` selects; with `ok`, the region it registered.
    pub fn take_register(&mut self, pick: u8, ok: bool) -> Option<(u64, Result<RegionDesc, Detail>)> {
        let (call_id, len) = take(&mut self.registers, pick)?;
        if !ok {
            return Some((call_id, Err("injected registration failure".into())));
        }
        let rkey = self.next_rkey;
        self.next_rkey += 1;
        self.rkeys.insert(rkey);
        Some((call_id, Ok(RegionDesc { addr: u64::from(rkey) << 32, len: len as u64, rkey })))
    }

    /// Takes the READ `pick` selects, completed as `outcome` says.
    pub fn take_read(&mut self, pick: u8, outcome: ReadOutcome) -> Option<(u64, Result<Bytes, ReadError>)> {
        let (wr_id, remote) = take(&mut self.reads, pick)?;
        let result = match outcome {
            ReadOutcome::Ok => Ok(payload(remote.len as usize)),
            ReadOutcome::Flushed => Err(ReadError::Flushed),
            ReadOutcome::InvalidKey => Err(ReadError::InvalidKey(remote.rkey)),
            ReadOutcome::OutOfBounds => Err(ReadError::OutOfBounds { addr: remote.addr, len: remote.len }),
            ReadOutcome::Failed => Err(ReadError::Failed("injected".into())),
        };
        Some((wr_id, result))
    }

    /// Takes the SEND `pick` selects.
    pub fn take_send(&mut self, pick: u8, ok: bool) -> Option<(u64, Result<(), String>)> {
        let wr_id = take(&mut self.sends, pick)?;
        Some((wr_id, if ok { Ok(()) } else { Err("injected send failure".into()) }))
    }

    /// Every key registered and not revoked is a region the protocol still counts as advertised
    /// (none leaks, none is revoked while counted).
    pub fn check_regions(&self, advertised: usize) {
        if self.registers.is_empty() {
            assert_eq!(
                self.rkeys.len(),
                advertised,
                "registered keys {:?} vs regions advertised",
                self.rkeys
            );
        }
    }

    /// After the connection closed: the runtime posts only the revocations the protocol still
    /// asks for; every region must be revoked then.
    pub fn revoke_after_close(&mut self, mut next_op: impl FnMut() -> Option<Op>) {
        while let Some(op) = next_op() {
            if matches!(op, Op::Deregister { .. }) {
                self.on_op(op);
            }
        }
        if self.registers.is_empty() {
            assert!(
                self.rkeys.is_empty(),
                "regions left registered after the connection died: {:?}",
                self.rkeys
            );
        }
    }
}

fn take<T>(v: &mut Vec<T>, pick: u8) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    let i = usize::from(pick) % v.len();
    Some(v.remove(i))
}

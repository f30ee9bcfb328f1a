//! The fuzz inputs of the state-machine targets, derived with `arbitrary`.
//!
//! An input is a [`Setup`] followed by steps decoded one after the other until the bytes run
//! out. Every type reads its fields left to right (no lengths taken from the end of the data),
//! so that `crate::enc` can write seed inputs; `crate::enc`'s tests check that the two agree.

use arbitrary::{Arbitrary, Result, Unstructured};
use bytes::Bytes;
use rpc_core::proto::{Header, Kind, HEADER_LEN};

/// Up to 255 bytes, length first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Blob(pub Vec<u8>);

impl<'a> Arbitrary<'a> for Blob {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let n = usize::from(u8::arbitrary(u)?).min(u.len());
        Ok(Blob(u.bytes(n)?.to_vec()))
    }
}

/// Connection setup: our config and what the peer announced (mapped into valid ranges by
/// [`crate::setup`]).
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// Our eager threshold (64 + this).
    pub eager_threshold: u16,
    /// Our receive depth.
    pub recv_depth: u8,
    /// Our calls in flight.
    pub max_in_flight: u8,
    /// Our largest accepted payload (bounded: READ destinations are allocated).
    pub max_message: u16,
    /// Receives the peer posted.
    pub peer_recv_depth: u8,
    /// The peer's receive buffer size.
    pub peer_recv_size: u16,
    /// The peer's eager threshold.
    pub peer_eager: u16,
    /// The peer's largest accepted payload.
    pub peer_max_message: u32,
}

/// An advertised region's length.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescLen {
    /// Up to 64 KiB.
    Small(u16),
    /// Any.
    Raw(u64),
}

/// A relative deadline in a request header's `arg`.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// None.
    Zero,
    /// Milliseconds.
    Millis(u16),
    /// Any number of microseconds.
    Raw(u64),
}

/// A frame body.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// No body.
    Empty,
    /// Inline payload of this many bytes.
    Payload(u16),
    /// These bytes.
    Bytes(Blob),
    /// A region descriptor.
    Desc {
        /// Address.
        addr: u64,
        /// Length.
        len: DescLen,
        /// Key.
        rkey: u32,
    },
    /// A wire error.
    Error {
        /// Its code.
        code: u16,
        /// Its message.
        message: Blob,
    },
}

/// A frame from the peer, built with a valid header (except for what its fields say).
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Kind byte (1..=4 are known).
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Credits returned.
    pub credits: u8,
    /// Call id.
    pub call_id: u8,
    /// Method id.
    pub method: u8,
    /// Finished-READ report.
    pub done: u8,
    /// Deadline argument.
    pub arg: Arg,
    /// The body.
    pub body: Body,
}

impl Frame {
    /// The frame as received: a 40-byte header (body length filled in), then the body.
    pub fn encode(&self) -> Vec<u8> {
        let body: Vec<u8> = match &self.body {
            Body::Empty => Vec::new(),
            Body::Payload(n) => (0..*n).map(|i| i as u8).collect(),
            Body::Bytes(b) => b.0.clone(),
            Body::Desc { addr, len, rkey } => {
                let len = match len {
                    DescLen::Small(n) => u64::from(*n),
                    DescLen::Raw(n) => *n,
                };
                rpc_core::proto::encode_desc(&rpc_transport::RegionDesc { addr: *addr, len, rkey: *rkey })
                    .to_vec()
            }
            Body::Error { code, message } => {
                let mut v = code.to_le_bytes().to_vec();
                v.extend_from_slice(&message.0);
                v
            }
        };
        let mut h = Header::new(Kind::Credit);
        h.flags = u16::from(self.flags);
        h.credits = u16::from(self.credits);
        h.call_id = u64::from(self.call_id);
        h.method_id = u32::from(self.method);
        h.body_len = body.len() as u32;
        h.done = u64::from(self.done);
        h.arg = match self.arg {
            Arg::Zero => 0,
            Arg::Millis(ms) => u64::from(ms) * 1000,
            Arg::Raw(us) => us,
        };
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        head[3] = self.kind; // any kind byte, known or not
        let mut out = head.to_vec();
        out.extend_from_slice(&body);
        out
    }
}

/// How an issued READ completes.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Filled.
    Ok,
    /// Flushed by a dying connection.
    Flushed,
    /// Refused: bad key.
    InvalidKey,
    /// Refused: out of bounds.
    OutOfBounds,
    /// Failed otherwise.
    Failed,
}

/// A call's timeout as the application gives it.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// Microseconds.
    Micros(u32),
    /// Milliseconds.
    Millis(u16),
    /// Seconds.
    Secs(u32),
    /// `Duration::MAX` ("forever").
    Max,
}

/// One input to the client end.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum ClientStep {
    /// The application starts a call (ids are handed out 1, 2, 3...).
    Start {
        /// Method.
        method: u8,
        /// Payload length.
        len: u16,
        /// Timeout.
        timeout: Option<Timeout>,
    },
    /// The application starts a call with an id it may not use (0, or one in progress).
    StartBadId {
        /// 0, or picks a call in progress.
        pick: u8,
    },
    /// The application cancels a call (picked among those started).
    Cancel {
        /// Which.
        pick: u8,
    },
    /// A frame from the server.
    Recv(Frame),
    /// Raw bytes from the server.
    RecvRaw(Blob),
    /// A registration completes (picked among those asked for).
    Registered {
        /// Which.
        pick: u8,
        /// Success.
        ok: bool,
    },
    /// A READ completes (picked among those issued).
    ReadDone {
        /// Which.
        pick: u8,
        /// How.
        outcome: ReadOutcome,
    },
    /// A SEND completes (picked among those posted).
    SendDone {
        /// Which.
        pick: u8,
        /// Success (a failure is fatal for the connection).
        ok: bool,
    },
    /// Time passes by this many milliseconds, then the timers run.
    Advance(u16),
    /// Time passes by this many seconds, then the timers run.
    AdvanceSecs(u16),
}

/// What a handler returns.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// A result of this many bytes.
    Ok(u16),
    /// An application error.
    Err {
        /// Code.
        code: u16,
        /// Message length.
        len: u16,
    },
}

/// One input to the server end.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum ServerStep {
    /// A frame from the client.
    Recv(Frame),
    /// Raw bytes from the client.
    RecvRaw(Blob),
    /// A handler finishes (picked among those running; or a stale id).
    Respond {
        /// Which.
        pick: u8,
        /// What it returns.
        reply: Reply,
    },
    /// A registration completes.
    Registered {
        /// Which.
        pick: u8,
        /// Success.
        ok: bool,
    },
    /// A READ completes.
    ReadDone {
        /// Which.
        pick: u8,
        /// How.
        outcome: ReadOutcome,
    },
    /// A SEND completes.
    SendDone {
        /// Which.
        pick: u8,
        /// Success.
        ok: bool,
    },
    /// Time passes by this many milliseconds.
    Advance(u16),
    /// Time passes by this many seconds.
    AdvanceSecs(u16),
    /// The server begins its shutdown.
    Shutdown,
}

/// A payload of `len` bytes (its content does not matter to the protocol).
pub fn payload(len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>())
}

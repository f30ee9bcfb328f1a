//! Writes inputs in the byte format `arbitrary` reads them from, for seed corpora; the tests
//! check that each encoding decodes back to the value.

use crate::input::{
    Arg, Blob, Body, ClientStep, DescLen, Frame, ReadOutcome, Reply, ServerStep, Setup, Timeout,
};
use crate::wire::{Chunk, ReaderSetup};

/// A value `arbitrary` can read back from these bytes.
pub trait Put {
    /// Appends the encoding.
    fn put(&self, out: &mut Vec<u8>);
}

/// Encodes a setup and its steps as one fuzz input.
pub fn input<S: Put, T: Put>(setup: &S, steps: &[T]) -> Vec<u8> {
    let mut out = Vec::new();
    setup.put(&mut out);
    for s in steps {
        s.put(&mut out);
    }
    out
}

/// The enum tag that `arbitrary`'s derive maps to variant `idx` of `count`.
fn tag(out: &mut Vec<u8>, idx: u64, count: u64) {
    let t = (idx << 32).div_ceil(count) as u32;
    out.extend_from_slice(&t.to_le_bytes());
}

macro_rules! put_int {
    ($($t:ty),*) => {$(
        impl Put for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
put_int!(u8, u16, u32, u64, i16);

impl Put for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl<T: Put> Put for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        self.is_some().put(out);
        if let Some(v) = self {
            v.put(out);
        }
    }
}

impl<T: Put, const N: usize> Put for [T; N] {
    fn put(&self, out: &mut Vec<u8>) {
        self.iter().for_each(|v| v.put(out));
    }
}

impl Put for Blob {
    fn put(&self, out: &mut Vec<u8>) {
        let n = self.0.len().min(255);
        (n as u8).put(out);
        out.extend_from_slice(&self.0[..n]);
    }
}

impl Put for Setup {
    fn put(&self, out: &mut Vec<u8>) {
        self.eager_threshold.put(out);
        self.recv_depth.put(out);
        self.max_in_flight.put(out);
        self.max_message.put(out);
        self.peer_recv_depth.put(out);
        self.peer_recv_size.put(out);
        self.peer_eager.put(out);
        self.peer_max_message.put(out);
    }
}

impl Put for DescLen {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            DescLen::Small(n) => {
                tag(out, 0, 2);
                n.put(out)
            }
            DescLen::Raw(n) => {
                tag(out, 1, 2);
                n.put(out)
            }
        }
    }
}

impl Put for Arg {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Arg::Zero => tag(out, 0, 3),
            Arg::Millis(ms) => {
                tag(out, 1, 3);
                ms.put(out)
            }
            Arg::Raw(us) => {
                tag(out, 2, 3);
                us.put(out)
            }
        }
    }
}

impl Put for Body {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Body::Empty => tag(out, 0, 5),
            Body::Payload(n) => {
                tag(out, 1, 5);
                n.put(out)
            }
            Body::Bytes(b) => {
                tag(out, 2, 5);
                b.put(out)
            }
            Body::Desc { addr, len, rkey } => {
                tag(out, 3, 5);
                addr.put(out);
                len.put(out);
                rkey.put(out);
            }
            Body::Error { code, message } => {
                tag(out, 4, 5);
                code.put(out);
                message.put(out);
            }
        }
    }
}

impl Put for Frame {
    fn put(&self, out: &mut Vec<u8>) {
        for b in [self.kind, self.flags, self.credits, self.call_id, self.method, self.done] {
            b.put(out);
        }
        self.arg.put(out);
        self.body.put(out);
    }
}

impl Put for ReadOutcome {
    fn put(&self, out: &mut Vec<u8>) {
        let idx = match self {
            ReadOutcome::Ok => 0,
            ReadOutcome::Flushed => 1,
            ReadOutcome::InvalidKey => 2,
            ReadOutcome::OutOfBounds => 3,
            ReadOutcome::Failed => 4,
        };
        tag(out, idx, 5);
    }
}

impl Put for Timeout {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Timeout::Micros(v) => {
                tag(out, 0, 4);
                v.put(out)
            }
            Timeout::Millis(v) => {
                tag(out, 1, 4);
                v.put(out)
            }
            Timeout::Secs(v) => {
                tag(out, 2, 4);
                v.put(out)
            }
            Timeout::Max => tag(out, 3, 4),
        }
    }
}

impl Put for ClientStep {
    fn put(&self, out: &mut Vec<u8>) {
        const N: u64 = 10;
        match self {
            ClientStep::Start { method, len, timeout } => {
                tag(out, 0, N);
                method.put(out);
                len.put(out);
                timeout.put(out);
            }
            ClientStep::StartBadId { pick } => {
                tag(out, 1, N);
                pick.put(out)
            }
            ClientStep::Cancel { pick } => {
                tag(out, 2, N);
                pick.put(out)
            }
            ClientStep::Recv(f) => {
                tag(out, 3, N);
                f.put(out)
            }
            ClientStep::RecvRaw(b) => {
                tag(out, 4, N);
                b.put(out)
            }
            ClientStep::Registered { pick, ok } => {
                tag(out, 5, N);
                pick.put(out);
                ok.put(out)
            }
            ClientStep::ReadDone { pick, outcome } => {
                tag(out, 6, N);
                pick.put(out);
                outcome.put(out)
            }
            ClientStep::SendDone { pick, ok } => {
                tag(out, 7, N);
                pick.put(out);
                ok.put(out)
            }
            ClientStep::Advance(ms) => {
                tag(out, 8, N);
                ms.put(out)
            }
            ClientStep::AdvanceSecs(s) => {
                tag(out, 9, N);
                s.put(out)
            }
        }
    }
}

impl Put for Reply {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Ok(len) => {
                tag(out, 0, 2);
                len.put(out)
            }
            Reply::Err { code, len } => {
                tag(out, 1, 2);
                code.put(out);
                len.put(out)
            }
        }
    }
}

impl Put for ServerStep {
    fn put(&self, out: &mut Vec<u8>) {
        const N: u64 = 9;
        match self {
            ServerStep::Recv(f) => {
                tag(out, 0, N);
                f.put(out)
            }
            ServerStep::RecvRaw(b) => {
                tag(out, 1, N);
                b.put(out)
            }
            ServerStep::Respond { pick, reply } => {
                tag(out, 2, N);
                pick.put(out);
                reply.put(out)
            }
            ServerStep::Registered { pick, ok } => {
                tag(out, 3, N);
                pick.put(out);
                ok.put(out)
            }
            ServerStep::ReadDone { pick, outcome } => {
                tag(out, 4, N);
                pick.put(out);
                outcome.put(out)
            }
            ServerStep::SendDone { pick, ok } => {
                tag(out, 5, N);
                pick.put(out);
                ok.put(out)
            }
            ServerStep::Advance(ms) => {
                tag(out, 6, N);
                ms.put(out)
            }
            ServerStep::AdvanceSecs(s) => {
                tag(out, 7, N);
                s.put(out)
            }
            ServerStep::Shutdown => tag(out, 8, N),
        }
    }
}

impl Put for ReaderSetup {
    fn put(&self, out: &mut Vec<u8>) {
        self.recv_depth.put(out);
        self.recv_size.put(out);
        self.region_len.put(out);
        self.reads.put(out);
        self.push_window.put(out);
        self.pushed.put(out);
    }
}

impl Put for Chunk {
    fn put(&self, out: &mut Vec<u8>) {
        const N: u64 = 7;
        match self {
            Chunk::Raw(b) => {
                tag(out, 0, N);
                b.put(out)
            }
            Chunk::Send(len) => {
                tag(out, 1, N);
                len.put(out)
            }
            Chunk::ReadReq { id, offset, len, key_flip } => {
                tag(out, 2, N);
                id.put(out);
                offset.put(out);
                len.put(out);
                key_flip.put(out);
            }
            Chunk::ReadResp { pick, status, len } => {
                tag(out, 3, N);
                pick.put(out);
                status.put(out);
                len.put(out);
            }
            Chunk::Push { key, len } => {
                tag(out, 4, N);
                key.put(out);
                len.put(out);
            }
            Chunk::Revoke(key) => {
                tag(out, 5, N);
                key.put(out)
            }
            Chunk::Window { key, len } => {
                tag(out, 6, N);
                key.put(out);
                len.put(out);
            }
        }
    }
}

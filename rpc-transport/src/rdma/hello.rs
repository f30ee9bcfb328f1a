//! The in-band hello: the first SEND on each new connection.
//!
//! sideway 0.4 can neither set rdma_cm private data on connect/accept nor read it from an event,
//! so the parameters that a verbs application would put there travel as the first message on the
//! QP instead (no second TCP port needed, works the same on RoCE and iWARP). Each side posts one
//! extra receive for it ahead of its `recv_depth` receives, so the hello never consumes a
//! receive the protocol's credits count on. The active side sends first; the passive side answers
//! after it got the active side's hello (which also satisfies iWARP's rule that the initiator
//! sends the first message). On iWARP, if the peer's hello is slow to come, the active side
//! sends up to [`HELLO_NUDGES`] zero-length RDMA WRITEs (see
//! [`super::RdmaConfig::hello_nudge_after`]: works around soft-iWARP leaving a first message
//! unread); they take no receive and no credit.
//!
//! Layout (little endian): magic `b"RPCRDMA1"`, `recv_depth: u32`, `recv_size: u32`,
//! `max_dest_rd_atomic: u32` (READs this side serves at once), `max_rd_atomic: u32` (READs this
//! side issues at once), `private_len: u16`, then the private data.
//!
//! Every field is bounded as the tcp hello's: `recv_depth` and `recv_size` within the limits of
//! every backend (at most 65536 receives of at most 64 MiB), the READ depths within
//! `1..=`[`MAX_RD_ATOMIC`] (a QP attribute is a `u8`), private data at most 256 bytes. None of
//! them sizes our memory anyway: our send slabs are sized from our own receive size (see
//! `post.rs`).

use bytes::Bytes;

use crate::soft::check_sizes;
use crate::{TransportError, MAX_PRIVATE_DATA};

const MAGIC: &[u8; 8] = b"RPCRDMA1";
const FIXED_LEN: usize = 8 + 4 * 4 + 2;
/// Largest encoded hello; the hello receive slot is at least this large.
pub(crate) const HELLO_MAX: usize = FIXED_LEN + MAX_PRIVATE_DATA;
/// Most zero-length RDMA WRITEs (*nudges*, see [`super::RdmaConfig::hello_nudge_after`]) a
/// connecting iWARP side sends while it waits for the peer's hello.
pub const HELLO_NUDGES: u32 = 3;
/// Largest READ depth a hello may announce: `max_rd_atomic` / `max_dest_rd_atomic` are `u8`
/// attributes of a verbs QP.
pub(crate) const MAX_RD_ATOMIC: u32 = 255;

/// What each side tells the other at setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) recv_depth: u32,
    pub(crate) recv_size: u32,
    pub(crate) max_dest_rd_atomic: u32,
    pub(crate) max_rd_atomic: u32,
    pub(crate) private_data: Bytes,
}

impl Hello {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let pd_len = self.private_data.len().min(MAX_PRIVATE_DATA);
        let mut out = Vec::with_capacity(FIXED_LEN + pd_len);
        out.extend_from_slice(MAGIC);
        for v in [self.recv_depth, self.recv_size, self.max_dest_rd_atomic, self.max_rd_atomic] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(pd_len as u16).to_le_bytes());
        out.extend_from_slice(&self.private_data[..pd_len]);
        out
    }

    /// Parses a peer's hello; anything malformed is a handshake error, never a panic.
    pub(crate) fn decode(msg: &[u8]) -> Result<Hello, TransportError> {
        let bad = |why: &str| TransportError::Handshake(format!("bad rdma hello from peer: {why}"));
        if msg.len() < FIXED_LEN {
            return Err(bad("too short"));
        }
        if &msg[..8] != MAGIC {
            return Err(bad("wrong magic (not an rpc rdma peer?)"));
        }
        let u32_at = |i: usize| u32::from_le_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let pd_len = u16::from_le_bytes([msg[24], msg[25]]) as usize;
        if pd_len > MAX_PRIVATE_DATA || msg.len() != FIXED_LEN + pd_len {
            return Err(bad("private data length mismatch"));
        }
        let hello = Hello {
            recv_depth: u32_at(8),
            recv_size: u32_at(12),
            max_dest_rd_atomic: u32_at(16),
            max_rd_atomic: u32_at(20),
            private_data: Bytes::copy_from_slice(&msg[FIXED_LEN..]),
        };
        check_sizes(hello.recv_depth, hello.recv_size, pd_len).map_err(|why| bad(&why))?;
        for (name, depth) in
            [("max_dest_rd_atomic", hello.max_dest_rd_atomic), ("max_rd_atomic", hello.max_rd_atomic)]
        {
            if depth == 0 || depth > MAX_RD_ATOMIC {
                return Err(bad(&format!("{name} {depth} outside 1..={MAX_RD_ATOMIC}")));
            }
        }
        Ok(hello)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Hello {
        Hello {
            recv_depth: 64,
            recv_size: 8320,
            max_dest_rd_atomic: 16,
            max_rd_atomic: 8,
            private_data: Bytes::from_static(b"hi there"),
        }
    }

    #[test]
    fn round_trips() {
        let h = sample();
        let enc = h.encode();
        assert!(enc.len() <= HELLO_MAX);
        assert_eq!(Hello::decode(&enc).unwrap(), h);
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        let enc = sample().encode();
        for cut in 0..enc.len() {
            assert!(Hello::decode(&enc[..cut]).is_err(), "prefix of {cut} bytes accepted");
        }
        let mut wrong = enc.clone();
        wrong[0] ^= 1;
        assert!(Hello::decode(&wrong).is_err());
        let mut long = enc;
        long.push(0);
        assert!(Hello::decode(&long).is_err());
    }

    #[test]
    fn rejects_every_out_of_range_field() {
        let cases = [
            ("zero recv_depth", Hello { recv_depth: 0, ..sample() }, "recv_depth"),
            ("recv_depth over 65536", Hello { recv_depth: (1 << 16) + 1, ..sample() }, "recv_depth"),
            ("recv_depth u32::MAX", Hello { recv_depth: u32::MAX, ..sample() }, "recv_depth"),
            ("zero recv_size", Hello { recv_size: 0, ..sample() }, "recv_size"),
            ("recv_size over 64 MiB", Hello { recv_size: (64 << 20) + 1, ..sample() }, "recv_size"),
            ("recv_size u32::MAX", Hello { recv_size: u32::MAX, ..sample() }, "recv_size"),
            ("zero max_dest_rd_atomic", Hello { max_dest_rd_atomic: 0, ..sample() }, "max_dest_rd_atomic"),
            ("max_dest_rd_atomic 256", Hello { max_dest_rd_atomic: 256, ..sample() }, "max_dest_rd_atomic"),
            ("zero max_rd_atomic", Hello { max_rd_atomic: 0, ..sample() }, "max_rd_atomic"),
            ("max_rd_atomic u32::MAX", Hello { max_rd_atomic: u32::MAX, ..sample() }, "max_rd_atomic"),
        ];
        for (what, hello, field) in cases {
            match Hello::decode(&hello.encode()) {
                Err(TransportError::Handshake(why)) => assert!(why.contains(field), "{what}: {why}"),
                other => panic!("{what}: accepted or wrong error: {other:?}"),
            }
        }
        let limits = Hello {
            recv_depth: 1 << 16,
            recv_size: 64 << 20,
            max_dest_rd_atomic: MAX_RD_ATOMIC,
            max_rd_atomic: 1,
            private_data: Bytes::from(vec![7; MAX_PRIVATE_DATA]),
        };
        assert_eq!(Hello::decode(&limits.encode()).unwrap(), limits, "the limits themselves are valid");
    }
}

//! The bytes of a SEND, owned by the operation until its completion.

use std::fmt;

use bytes::{Bytes, BytesMut};

use crate::Buf;

/// Longest head a [`SendBuf::Headed`] message carries (bytes copied into the `SendBuf` itself).
pub const MAX_HEAD: usize = 48;

/// What [`crate::Connection::post_send`] sends: owned by the operation until its completion
/// (verbs semantics: the NIC reads the memory after the post returns).
///
/// A frame written into a buffer of the connection's pool is posted as that [`Buf`]
/// ([`SendBuf::Owned`]): nothing is frozen or allocated, and the buffer returns to the pool when
/// the SEND completes. Shared [`Bytes`] ([`SendBuf::Shared`]) are kept alive by the operation the
/// same way. A short head followed by shared bytes ([`SendBuf::Headed`]: a frame header and its
/// body) is sent as a gather list, without first assembling the two: the transport copies both
/// pieces where it copies a message anyway (inline on verbs, into the socket on tcp, into the
/// peer's receive buffer on mem).
pub enum SendBuf {
    /// A buffer of the message alone (its length is the message's); normally from
    /// [`crate::Connection::pool`], which `rdma` sends from as it is.
    Owned(Buf),
    /// Shared bytes (pool memory among them is recognised by address on `rdma`).
    Shared(Bytes),
    /// A head of at most [`MAX_HEAD`] bytes followed by `body` (see [`SendBuf::headed`]).
    Headed {
        /// The head, held in the `SendBuf` itself.
        head: Head,
        /// What follows the head.
        body: Bytes,
    },
}

/// The head of a [`SendBuf::Headed`] message: at most [`MAX_HEAD`] bytes, held by value.
#[derive(Clone, Copy)]
pub struct Head {
    len: u8,
    bytes: [u8; MAX_HEAD],
}

impl Head {
    /// The head's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl SendBuf {
    /// `head` followed by `body`, sent without assembling them ([`SendBuf::Headed`]); a head
    /// longer than [`MAX_HEAD`] is assembled with the body into one buffer instead.
    pub fn headed(head: &[u8], body: Bytes) -> SendBuf {
        if head.len() > MAX_HEAD {
            return SendBuf::Shared(joined(head, &body));
        }
        let mut bytes = [0u8; MAX_HEAD];
        bytes[..head.len()].copy_from_slice(head);
        SendBuf::Headed { head: Head { len: head.len() as u8, bytes }, body }
    }

    /// The message's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            SendBuf::Owned(buf) => buf.len(),
            SendBuf::Shared(bytes) => bytes.len(),
            SendBuf::Headed { head, body } => head.len as usize + body.len(),
        }
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message's bytes in one piece, unless it is [`SendBuf::Headed`] (then see
    /// [`SendBuf::parts`]).
    pub fn contiguous(&self) -> Option<&[u8]> {
        match self {
            SendBuf::Owned(buf) => Some(buf),
            SendBuf::Shared(bytes) => Some(bytes),
            SendBuf::Headed { .. } => None,
        }
    }

    /// The message as two pieces, in order: the head and the body of a [`SendBuf::Headed`];
    /// otherwise the whole message and an empty slice.
    pub fn parts(&self) -> [&[u8]; 2] {
        match self {
            SendBuf::Owned(buf) => [buf, &[]],
            SendBuf::Shared(bytes) => [bytes, &[]],
            SendBuf::Headed { head, body } => [head.as_slice(), body],
        }
    }

    /// Copies the message into `out`, which must be exactly [`SendBuf::len`] bytes long.
    ///
    /// # Panics
    /// If `out` has another length.
    pub fn copy_to_slice(&self, out: &mut [u8]) {
        let [first, second] = self.parts();
        out[..first.len()].copy_from_slice(first);
        out[first.len()..].copy_from_slice(second);
    }

    /// The message as [`Bytes`] (an owned buffer is frozen: no copy; a headed message is
    /// assembled: one copy).
    pub fn into_bytes(self) -> Bytes {
        match self {
            SendBuf::Owned(buf) => buf.freeze(),
            SendBuf::Shared(bytes) => bytes,
            SendBuf::Headed { head, body } => joined(head.as_slice(), &body),
        }
    }

    /// The message's bytes, one after the other (for comparisons and tests).
    fn iter(&self) -> impl Iterator<Item = &u8> {
        let [first, second] = self.parts();
        first.iter().chain(second)
    }
}

/// `head` then `body`, copied into one new buffer.
fn joined(head: &[u8], body: &[u8]) -> Bytes {
    let mut whole = BytesMut::with_capacity(head.len() + body.len());
    whole.extend_from_slice(head);
    whole.extend_from_slice(body);
    whole.freeze()
}

impl From<Buf> for SendBuf {
    fn from(buf: Buf) -> SendBuf {
        SendBuf::Owned(buf)
    }
}

impl From<Bytes> for SendBuf {
    fn from(bytes: Bytes) -> SendBuf {
        SendBuf::Shared(bytes)
    }
}

impl From<Vec<u8>> for SendBuf {
    fn from(v: Vec<u8>) -> SendBuf {
        SendBuf::Shared(Bytes::from(v))
    }
}

impl From<&'static [u8]> for SendBuf {
    fn from(s: &'static [u8]) -> SendBuf {
        SendBuf::Shared(Bytes::from_static(s))
    }
}

/// Equal when the bytes are (however they are split).
impl PartialEq for SendBuf {
    fn eq(&self, other: &SendBuf) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for SendBuf {}

impl PartialEq<[u8]> for SendBuf {
    fn eq(&self, other: &[u8]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl fmt::Debug for SendBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            SendBuf::Owned(_) => "Owned",
            SendBuf::Shared(_) => "Shared",
            SendBuf::Headed { .. } => "Headed",
        };
        f.debug_struct("SendBuf").field("kind", &kind).field("len", &self.len()).finish()
    }
}

impl fmt::Debug for Head {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Head").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemPool, PoolLimits};

    #[test]
    fn an_owned_buffer_is_sent_as_it_is_and_frozen_only_on_request() {
        let pool = MemPool::heap(PoolLimits::default());
        let mut buf = pool.alloc(100).unwrap();
        buf.copy_from_slice(&[3; 100]);
        let ptr = buf.as_ptr();
        let msg = SendBuf::from(buf);
        let whole = msg.contiguous().expect("one piece");
        assert_eq!((whole.as_ptr(), whole.len()), (ptr, 100), "the buffer's own memory");
        assert_eq!(msg, SendBuf::from(vec![3u8; 100]), "equal by content");
        let bytes = msg.into_bytes();
        assert_eq!(bytes.as_ptr(), ptr, "frozen without a copy");
        assert!(pool.contains(&bytes));
        assert_eq!(SendBuf::from(&b"ab"[..]), b"ab"[..]);
    }

    #[test]
    fn a_headed_message_keeps_its_body_where_it_lies_until_assembled() {
        let body = Bytes::from_static(b" world");
        let msg = SendBuf::headed(b"hello", body.clone());
        assert!(matches!(msg, SendBuf::Headed { .. }));
        assert_eq!(msg.len(), 11);
        assert!(msg.contiguous().is_none());
        let [head, rest] = msg.parts();
        assert_eq!(head, b"hello");
        assert_eq!(rest.as_ptr(), body.as_ptr(), "the body is not copied");
        assert_eq!(msg, SendBuf::from(&b"hello world"[..]), "equal by content, however split");
        assert_ne!(msg, SendBuf::from(&b"hello worle"[..]));
        let mut out = [0u8; 11];
        msg.copy_to_slice(&mut out);
        assert_eq!(&out, b"hello world");
        assert_eq!(msg.into_bytes(), Bytes::from_static(b"hello world"));
        // An empty body, and a head too long to hold: assembled at once.
        assert_eq!(SendBuf::headed(b"hi", Bytes::new()), b"hi"[..]);
        let long = SendBuf::headed(&[1; MAX_HEAD + 1], body);
        assert!(matches!(long, SendBuf::Shared(_)));
        assert_eq!(long.len(), MAX_HEAD + 7);
    }
}

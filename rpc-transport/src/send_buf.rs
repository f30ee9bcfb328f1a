//! The bytes of a SEND, owned by the operation until its completion.

use std::fmt;
use std::ops::Deref;

use bytes::Bytes;

use crate::Buf;

/// What [`crate::Connection::post_send`] sends: owned by the operation until its completion
/// (verbs semantics: the NIC reads the memory after the post returns).
///
/// A frame written into a buffer of the connection's pool is posted as that [`Buf`]
/// ([`SendBuf::Owned`]): nothing is frozen or allocated, and the buffer returns to the pool when
/// the SEND completes. Shared [`Bytes`] ([`SendBuf::Shared`]) are kept alive by the operation the
/// same way. Derefs to the message's bytes.
pub enum SendBuf {
    /// A buffer of the message alone (its length is the message's); normally from
    /// [`crate::Connection::pool`], which `rdma` sends from as it is.
    Owned(Buf),
    /// Shared bytes (pool memory among them is recognised by address on `rdma`).
    Shared(Bytes),
}

impl SendBuf {
    /// The message as [`Bytes`] (an owned buffer is frozen: no copy).
    pub fn into_bytes(self) -> Bytes {
        match self {
            SendBuf::Owned(buf) => buf.freeze(),
            SendBuf::Shared(bytes) => bytes,
        }
    }
}

impl Deref for SendBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SendBuf::Owned(buf) => buf,
            SendBuf::Shared(bytes) => bytes,
        }
    }
}

impl AsRef<[u8]> for SendBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
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

/// Equal when the bytes are.
impl PartialEq for SendBuf {
    fn eq(&self, other: &SendBuf) -> bool {
        **self == **other
    }
}

impl Eq for SendBuf {}

impl PartialEq<[u8]> for SendBuf {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl fmt::Debug for SendBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            SendBuf::Owned(_) => "Owned",
            SendBuf::Shared(_) => "Shared",
        };
        f.debug_struct("SendBuf").field("kind", &kind).field("len", &self.len()).finish()
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
        assert_eq!((msg.as_ptr(), msg.len()), (ptr, 100), "the buffer's own memory");
        assert_eq!(msg, SendBuf::from(vec![3u8; 100]), "equal by content");
        let bytes = msg.into_bytes();
        assert_eq!(bytes.as_ptr(), ptr, "frozen without a copy");
        assert!(pool.contains(&bytes));
        assert_eq!(&*SendBuf::from(&b"ab"[..]), b"ab");
    }
}

//! The payload codec: serde + bincode 2 (standard configuration: little endian, varint).

use bytes::Bytes;
use rpc_transport::MemPool;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::arena;
use crate::proto::{Payload, HEADER_LEN};

/// Encoding or decoding failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

tokio::task_local! {
    /// The pool of the connection a server handler answers on: [`encode`] writes there.
    static POOL: MemPool;
}

/// Runs `fut` with `pool` as the pool [`encode`] writes into (the server runs each handler so,
/// with its connection's pool).
pub fn with_pool<F: std::future::Future>(
    pool: MemPool,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    POOL.scope(pool, fut)
}

/// Inside a server handler: the pool of the connection it answers on.
pub fn current_pool() -> Option<MemPool> {
    POOL.try_with(MemPool::clone).ok()
}

/// Encodes a value into a buffer of exactly its encoded size (measured in a first pass, so the
/// buffer never grows). Inside a server handler the buffer comes from the connection's
/// registered memory pool, so the transport sends or advertises it as it is; elsewhere it is a
/// heap buffer (for a small value, a slice of a block this thread carves small values from: no
/// allocation of its own).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, CodecError> {
    match POOL.try_with(MemPool::clone) {
        Ok(pool) => encode_in(&pool, value),
        Err(_) => {
            let size = encoded_size(value)?;
            if size <= arena::SMALL {
                return arena::write_local(size, |buf| write_into(value, buf));
            }
            let mut buf = vec![0u8; size];
            write_into(value, &mut buf)?;
            Ok(Bytes::from(buf))
        }
    }
}

/// Encodes a value straight into a buffer of `pool` (a connection's registered memory, see
/// [`rpc_transport::Connection::pool`]): the only write of the payload before it is sent or
/// READ by the peer.
pub fn encode_in<T: Serialize + ?Sized>(pool: &MemPool, value: &T) -> Result<Bytes, CodecError> {
    let size = encoded_size(value)?;
    let mut buf = pool.alloc_or_heap(size);
    write_into(value, &mut buf)?;
    Ok(buf.freeze())
}

/// Encodes a request's value into a buffer of `pool`: behind room for the frame header if it is
/// at most `eager_limit` bytes (it goes inline: see [`crate::proto::Payload::Framed`]), else
/// as [`encode_in`] does.
pub(crate) fn encode_request<T: Serialize + ?Sized>(
    pool: &MemPool,
    value: &T,
    eager_limit: usize,
) -> Result<Payload, CodecError> {
    let size = encoded_size(value)?;
    if size > eager_limit {
        let mut buf = pool.alloc_or_heap(size);
        write_into(value, &mut buf)?;
        return Ok(Payload::Bytes(buf.freeze()));
    }
    let mut buf = pool.alloc_or_heap(HEADER_LEN + size);
    write_into(value, &mut buf[HEADER_LEN..])?;
    Ok(Payload::Framed(buf))
}

fn encoded_size<T: Serialize + ?Sized>(value: &T) -> Result<usize, CodecError> {
    let mut size = CountingWriter(0);
    bincode::serde::encode_into_writer(value, &mut size, config()).map_err(encode_err)?;
    Ok(size.0)
}

fn write_into<T: Serialize + ?Sized>(value: &T, out: &mut [u8]) -> Result<(), CodecError> {
    let written = bincode::serde::encode_into_slice(value, out, config()).map_err(encode_err)?;
    if written != out.len() {
        return Err(CodecError(format!("encoded {written} bytes, measured {}", out.len())));
    }
    Ok(())
}

fn encode_err(e: bincode::error::EncodeError) -> CodecError {
    CodecError(e.to_string())
}

struct CountingWriter(usize);

impl bincode::enc::write::Writer for CountingWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0 += bytes.len();
        Ok(())
    }
}

/// Decodes a value; trailing bytes are an error (a mismatched type, not a valid message).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    // The borrowing decoder reads byte strings in place (the owned one first copies them into
    // a `Vec`); a `T: DeserializeOwned` still owns everything it decodes.
    let (value, used) = bincode::serde::borrow_decode_from_slice::<T, _>(bytes, config())
        .map_err(|e| CodecError(e.to_string()))?;
    if used != bytes.len() {
        return Err(CodecError(format!("{} trailing bytes after the value", bytes.len() - used)));
    }
    Ok(value)
}

std::thread_local! {
    /// The payload [`decode_shared`] is decoding, which [`SharedBytes`] values slice.
    static SOURCE: std::cell::RefCell<Option<Bytes>> = const { std::cell::RefCell::new(None) };
}

/// Decodes a value from a received payload; every [`SharedBytes`] in it is a slice of `bytes`
/// (no copy: on `rdma` it stays in the registered memory the message or READ landed in, which
/// returns to the connection's pool when the last slice drops). Generated stubs decode `Bytes`
/// arguments and results this way.
pub fn decode_shared<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, CodecError> {
    let previous = SOURCE.with(|s| s.replace(Some(bytes.clone())));
    let result = decode(bytes);
    SOURCE.with(|s| *s.borrow_mut() = previous);
    result
}

/// [`Bytes`] that decode without a copy inside [`decode_shared`] (elsewhere they copy). The
/// same bytes on the wire as `Bytes`: a field or argument can switch between the two freely.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SharedBytes(pub Bytes);

impl Serialize for SharedBytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for SharedBytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'a> serde::de::Visitor<'a> for Visitor {
            type Value = SharedBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<SharedBytes, E> {
                Ok(SharedBytes(share(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<SharedBytes, E> {
                Ok(SharedBytes(Bytes::from(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'a>>(self, mut seq: A) -> Result<SharedBytes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(SharedBytes(Bytes::from(out)))
            }
        }
        deserializer.deserialize_bytes(Visitor)
    }
}

/// `v` as a slice of the payload being decoded, if it lies inside it; else a copy.
fn share(v: &[u8]) -> Bytes {
    SOURCE.with(|s| match s.borrow().as_ref() {
        Some(src) if within(src, v) => src.slice_ref(v),
        _ => Bytes::copy_from_slice(v),
    })
}

fn within(src: &[u8], v: &[u8]) -> bool {
    let (start, end) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
    let (a, b) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
    !v.is_empty() && start <= a && b <= end
}

impl From<SharedBytes> for Bytes {
    fn from(b: SharedBytes) -> Bytes {
        b.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_bytes_slice_the_payload_and_encode_like_bytes() {
        let value = (7u32, Bytes::from(vec![5u8; 1000]), String::from("x"));
        let payload = encode(&value).unwrap();
        let (n, shared, s): (u32, SharedBytes, String) = decode_shared(&payload).unwrap();
        assert_eq!((n, &shared.0, s.as_str()), (7, &value.1, "x"));
        assert!(within(&payload, &shared.0), "no copy: a slice of the payload");
        // Outside decode_shared, and with plain Bytes, a copy.
        let (_, copied, _): (u32, SharedBytes, String) = decode(&payload).unwrap();
        assert!(!within(&payload, &copied.0));
        let (_, plain, _): (u32, Bytes, String) = decode_shared(&payload).unwrap();
        assert_eq!(plain, value.1);
        // Same wire format both ways.
        assert_eq!(encode(&(7u32, SharedBytes(value.1.clone()), "x")).unwrap(), payload);
        assert!(decode_shared::<(u32, SharedBytes)>(&Bytes::from_static(&[1, 200])).is_err());
    }
}

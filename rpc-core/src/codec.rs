//! The payload codec: serde + bincode 2 (standard configuration: little endian, varint).

use bytes::Bytes;
use rpc_transport::{Detail, MemPool, Received};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encoding or decoding failed. When bincode failed, [`source()`](std::error::Error::source)
/// is its error (`bincode::error::DecodeError` or `EncodeError`), and the message is its
/// message. Cheap to clone; equality compares messages (see [`Detail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError(pub Detail);

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for CodecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.cause().map(|c| c as &(dyn std::error::Error + 'static))
    }
}

use crate::arena;
use crate::proto::{Payload, HEADER_LEN, MIN_EAGER_THRESHOLD};

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

tokio::task_local! {
    /// The pool [`with_pool`] sets ([`encode`] writes there).
    static POOL: MemPool;
}

/// Runs `fut` with `pool` as the pool [`encode`] writes into (the server runs each handler with
/// its connection's pool; this sets another, in a handler too).
pub fn with_pool<F: std::future::Future>(
    pool: MemPool,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    POOL.scope(pool, fut)
}

/// Inside a server handler: the pool of the connection it answers on (or the one
/// [`with_pool`] set around the code running).
pub fn current_pool() -> Option<MemPool> {
    POOL.try_with(MemPool::clone).ok().or_else(crate::context::handler_pool)
}

/// Encodes a value into a buffer of exactly its encoded size (measured in a first pass, so the
/// buffer never grows). Inside a server handler the buffer comes from the connection's
/// registered memory pool, so the transport sends or advertises it as it is, unless the value is
/// tiny (at most 64 bytes: it travels inline, copied behind its frame header); elsewhere, and
/// for a tiny value, it is a heap buffer (for a small value, a slice of a block this thread
/// carves small values from: no allocation of its own).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, CodecError> {
    encode_sized(value, encoded_size(value)?)
}

/// [`encode`] of a value whose encoded size is already measured.
fn encode_sized<T: Serialize + ?Sized>(value: &T, size: usize) -> Result<Bytes, CodecError> {
    if size <= MIN_EAGER_THRESHOLD {
        // Even in a handler: a response this small is sent inline (under any eager threshold
        // the configuration allows), copied behind its frame header; a pool buffer of its own
        // would cost an allocation to freeze.
        return arena::write_local(size, |buf| write_into(value, buf));
    }
    match current_pool() {
        Some(pool) => encode_sized_in(&pool, value, size),
        None => {
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
    encode_sized_in(pool, value, size)
}

fn encode_sized_in<T: Serialize + ?Sized>(
    pool: &MemPool,
    value: &T,
    size: usize,
) -> Result<Bytes, CodecError> {
    let mut buf = pool.alloc_or_heap(size);
    write_into(value, &mut buf)?;
    Ok(buf.freeze())
}

/// Like [`encode`], but when the whole encoding of `value` already lies in `source` (a payload
/// decoded with [`decode_shared`]: a handler returning a `Bytes` argument as it came, with the
/// same length prefix in front), it is that slice of `source`: nothing is written. `source` is
/// immutable (`Bytes`) and the slice keeps it alive, so it is sent or advertised as it lies (in
/// the connection's pool when `source` is a received payload).
pub(crate) fn encode_reusing<T: Serialize + ?Sized>(value: &T, source: &Bytes) -> Result<Bytes, CodecError> {
    let mut probe = Probe { source, size: 0, head: [0; PROBE_HEAD], head_len: 0, span: None, fits: true };
    bincode::serde::encode_into_writer(value, &mut probe, config()).map_err(encode_err)?;
    if let Some((start, end)) = probe.span.filter(|&(start, end)| probe.fits && end - start == probe.size) {
        return Ok(source.slice(start..end));
    }
    encode_sized(value, probe.size)
}

/// Bytes an encoding may write before its first write that lies in the source (a length
/// prefix, a tag) and still be matched against the source.
const PROBE_HEAD: usize = 16;

/// Measures an encoding and checks whether it is one contiguous range of `source`: writes of
/// memory inside `source` must follow each other there; other writes (short ones) must equal the
/// source's bytes where they fall.
struct Probe<'a> {
    source: &'a Bytes,
    size: usize,
    /// Short writes before the first write inside the source.
    head: [u8; PROBE_HEAD],
    head_len: usize,
    /// The range of the source matched so far (start, end).
    span: Option<(usize, usize)>,
    /// Still one range of the source.
    fits: bool,
}

impl Probe<'_> {
    fn check(&mut self, bytes: &[u8]) {
        let src: &[u8] = self.source;
        let inside = within(src, bytes).then(|| bytes.as_ptr() as usize - src.as_ptr() as usize);
        match (self.span, inside) {
            (None, Some(at)) => {
                // The first write inside: the short writes before it must be the bytes in front.
                let head = &self.head[..self.head_len];
                if at >= head.len() && &src[at - head.len()..at] == head {
                    self.span = Some((at - head.len(), at + bytes.len()));
                } else {
                    self.fits = false;
                }
            }
            (None, None) if self.head_len + bytes.len() <= PROBE_HEAD => {
                self.head[self.head_len..self.head_len + bytes.len()].copy_from_slice(bytes);
                self.head_len += bytes.len();
            }
            (Some((start, end)), Some(at)) if at == end => self.span = Some((start, end + bytes.len())),
            (Some((start, end)), None)
                if bytes.len() <= PROBE_HEAD && src.get(end..end + bytes.len()) == Some(bytes) =>
            {
                self.span = Some((start, end + bytes.len()));
            }
            _ => self.fits = false,
        }
    }
}

impl bincode::enc::write::Writer for Probe<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.size += bytes.len();
        if self.fits && !bytes.is_empty() {
            self.check(bytes);
        }
        Ok(())
    }
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
        return encode_sized_in(pool, value, size).map(Payload::Bytes);
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
        return Err(CodecError(format!("encoded {written} bytes, measured {}", out.len()).into()));
    }
    Ok(())
}

fn encode_err(e: bincode::error::EncodeError) -> CodecError {
    CodecError(Detail::from_error(e))
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
        .map_err(|e| CodecError(Detail::from_error(e)))?;
    if used != bytes.len() {
        return Err(CodecError(format!("{} trailing bytes after the value", bytes.len() - used).into()));
    }
    Ok(value)
}

std::thread_local! {
    /// Slices [`share`] has taken on this thread (wrapping).
    static SLICES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Decodes a value from a received payload; every [`SharedBytes`] in it of more than 1 KiB is a
/// slice of `bytes` (no copy: on `rdma` it stays in the registered memory the message or READ
/// landed in, which returns to the connection's pool when the last slice drops), and so is a
/// smaller one when `bytes` is at most 1 KiB; otherwise a small one is a copy (see
/// [`SharedBytes`]). Generated stubs decode `Bytes` arguments and results this way.
pub fn decode_shared<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, CodecError> {
    decode_in_place(&mut Received::from(bytes.clone())).map(|(value, _)| value)
}

/// [`decode_shared`] of a received message as it lies in its receive buffer: the buffer is
/// frozen into `Bytes` (an allocation) only if the value keeps a slice of it (a `SharedBytes` of
/// more than 1 KiB). Dropping the returned message (when the value keeps nothing of it) returns
/// the buffer to its pool.
pub fn decode_received<T: DeserializeOwned>(mut payload: Received) -> Result<T, CodecError> {
    decode_in_place(&mut payload).map(|(value, _)| value)
}

/// [`decode_received`] and whether the value holds a slice of `payload`, which stays with the
/// caller (as `Bytes` if a slice was taken).
pub(crate) fn decode_in_place<T: DeserializeOwned>(payload: &mut Received) -> Result<(T, bool), CodecError> {
    let before = SLICES.get();
    let result = payload.lend_in_place(|bytes| decode::<T>(bytes));
    result.map(|value| (value, SLICES.get() != before))
}

/// [`decode_in_place`], the payload taken and given back.
#[cfg(test)]
fn decode_sharing<T: DeserializeOwned>(mut payload: Received) -> (Result<(T, bool), CodecError>, Received) {
    let result = decode_in_place(&mut payload);
    (result, payload)
}

/// A received message as [`Bytes`], by the rule [`SharedBytes`] follows: at most 1 KiB, a copy
/// (the one the driver made as the message arrived, or else one in this thread's arena: its
/// buffer goes back to the pool at once); larger, frozen where it lies (no copy).
pub(crate) fn received_bytes(payload: Received) -> Bytes {
    if payload.len() <= arena::SMALL && !payload.is_bytes() {
        return arena::copy_local(&payload);
    }
    payload.into_bytes()
}

/// [`Bytes`] that decode without a copy inside [`decode_shared`] (elsewhere they copy). The
/// same bytes on the wire as `Bytes`: a field or argument can switch between the two freely.
///
/// A value of more than 1 KiB is a slice of the received message where it landed. A message of
/// at most 1 KiB never stays in its receive buffer: the connection's driver copies it out as it
/// arrives (into a block the connection carves small byte strings from: a reference count, no
/// allocation of its own) and posts the receive buffer again at once, and the values in it are
/// slices of that copy. A smaller value in a larger message is copied into such a block of this
/// thread. Copying at most 1 KiB costs less than freezing the receive buffer into `Bytes` (an
/// allocation, and a free when the last slice drops), and the receive buffer, registered memory
/// on `rdma`, is not held by a few bytes the application keeps. A kept copy holds its block (16
/// KiB of heap) instead.
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

/// `v` as a slice of the payload being decoded, if it lies inside it and is larger than
/// [`arena::SMALL`], or is smaller and the payload is a copy of at most that size (a message
/// copied out as it arrived: a slice of it keeps no receive buffer); else a copy (into this
/// thread's arena when it is that small).
fn share(v: &[u8]) -> Bytes {
    let small = v.len() <= arena::SMALL;
    let slice = match small {
        true => Received::share_if_small_bytes(v, arena::SMALL),
        false => Received::share(v),
    };
    match slice {
        Some(slice) => {
            SLICES.set(SLICES.get().wrapping_add(1));
            slice
        }
        None if small => arena::copy_local(v),
        None => Bytes::copy_from_slice(v),
    }
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
        let value = (7u32, Bytes::from(vec![5u8; arena::SMALL + 1]), String::from("x"));
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

    #[test]
    fn shared_bytes_of_at_most_1_kib_are_copied_into_the_arena_out_of_a_larger_message() {
        // The message is larger than 1 KiB (it may be a receive buffer): a small value is copied.
        let padding = vec![0u8; arena::SMALL];
        for len in [1, 32, arena::SMALL] {
            let value = (7u32, Bytes::from(vec![3u8; len]), &padding);
            let payload = encode(&value).unwrap();
            let (n, small, _): (u32, SharedBytes, Vec<u8>) = decode_shared(&payload).unwrap();
            assert_eq!((n, &small.0), (7, &value.1));
            assert!(!within(&payload, &small.0), "{len} bytes: a copy, not a slice");
            // Two copies in a row come from the same block (no allocation of their own).
            let (_, next, _): (u32, SharedBytes, Vec<u8>) = decode_shared(&payload).unwrap();
            assert_eq!(next.0.as_ptr() as usize, small.0.as_ptr() as usize + len, "{len} bytes");
        }
    }

    #[test]
    fn shared_bytes_in_a_message_of_at_most_1_kib_are_slices_of_it() {
        // A message that small was copied out of its receive buffer as it arrived (or is the
        // caller's own `Bytes`): a slice of it holds no receive buffer.
        for len in [1, 32, arena::SMALL - 8] {
            let value = (7u32, Bytes::from(vec![3u8; len]));
            let payload = encode(&value).unwrap();
            assert!(payload.len() <= arena::SMALL);
            let (n, small): (u32, SharedBytes) = decode_shared(&payload).unwrap();
            assert_eq!((n, &small.0), (7, &value.1));
            assert!(within(&payload, &small.0), "{len} bytes: a slice, not a copy");
        }
        // A received message still in its (pool) buffer is not frozen for a small value: copied.
        let pool = MemPool::heap(rpc_transport::PoolLimits::default());
        let bytes = encode(&(7u32, Bytes::from_static(b"abc"))).unwrap();
        let mut buf = pool.alloc(bytes.len()).unwrap();
        buf.copy_from_slice(&bytes);
        let (value, back) = decode_sharing::<(u32, SharedBytes)>(Received::from(buf));
        let ((_, small), sliced) = value.unwrap();
        assert!(!sliced && !back.is_bytes() && !pool.contains(&small.0));
    }

    #[test]
    fn in_a_handler_tiny_values_skip_the_pool_and_larger_ones_use_it() {
        let pool = MemPool::heap(rpc_transport::PoolLimits::default());
        let (tiny, large) =
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(with_pool(pool.clone(), async {
                    (encode(&7u64).unwrap(), encode(&vec![1u8; 500]).unwrap())
                }));
        assert_eq!(tiny, encode(&7u64).unwrap());
        assert!(!pool.contains(&tiny), "a tiny value is copied behind its frame header anyway");
        assert!(pool.contains(&large), "a larger one is sent or advertised from the pool");
    }

    #[test]
    fn a_received_payload_is_frozen_only_when_the_value_keeps_a_slice() {
        let pool = MemPool::heap(rpc_transport::PoolLimits::default());
        let in_pool = |value: &(u64, Bytes)| {
            let bytes = encode(value).unwrap();
            let mut buf = pool.alloc(bytes.len()).unwrap();
            buf.copy_from_slice(&bytes);
            Received::from(buf)
        };
        // Nothing kept: decoded where it lies, the buffer is not frozen.
        let (value, back) = decode_sharing::<(u64, Vec<u8>)>(in_pool(&(7, Bytes::from_static(b"abc"))));
        assert_eq!(value.unwrap(), ((7, b"abc".to_vec()), false));
        assert!(!back.is_bytes());
        // A `SharedBytes` of more than 1 KiB kept: the buffer is frozen where it lies and sliced.
        let large = Bytes::from(vec![4u8; arena::SMALL + 1]);
        let (value, back) = decode_sharing::<(u64, SharedBytes)>(in_pool(&(7, large.clone())));
        let ((n, shared), sliced) = value.unwrap();
        assert!(sliced && back.is_bytes());
        assert_eq!((n, &shared.0), (7, &large));
        assert!(pool.contains(&shared.0) && within(&back, &shared.0), "a slice of the buffer");
        // A smaller one is copied: the buffer is not frozen (dropping `back` returns it).
        let (value, back) = decode_sharing::<(u64, SharedBytes)>(in_pool(&(7, Bytes::from_static(b"abc"))));
        let ((n, small), sliced) = value.unwrap();
        assert!(!sliced && !back.is_bytes());
        assert_eq!((n, &small.0[..]), (7, &b"abc"[..]));
        assert!(!pool.contains(&small.0), "a copy, outside the pool");
        // `received_bytes` follows the same rule.
        let buf = in_pool(&(7, Bytes::from_static(b"abc")));
        let copied = received_bytes(buf);
        assert!(!pool.contains(&copied));
        let framed = in_pool(&(7, large.clone()));
        let at = framed.as_ptr();
        let kept = received_bytes(framed);
        assert!(pool.contains(&kept) && kept.as_ptr() == at, "frozen where it lies");
        assert_eq!(decode_received::<u64>(Received::from(encode(&5u64).unwrap())), Ok(5));
    }

    /// The same bytes as `value`'s own encoding, and whether they are `source`'s memory.
    fn reused<T: Serialize>(value: &T, source: &Bytes) -> (Bytes, bool) {
        let out = encode_reusing(value, source).unwrap();
        assert_eq!(out, encode(value).unwrap(), "encode_reusing writes what encode writes");
        let shares = within(source, &out);
        (out, shares)
    }

    #[test]
    fn an_argument_returned_as_it_came_is_its_payload_not_a_copy() {
        let payload = encode(&(Bytes::from(vec![9u8; 100_000]),)).unwrap();
        let ((arg,), sliced): ((SharedBytes,), bool) =
            decode_sharing(Received::from(payload.clone())).0.unwrap();
        assert!(sliced);
        let (out, shares) = reused(&arg.0, &payload);
        assert!(shares && out.as_ptr() == payload.as_ptr() && out.len() == payload.len());
        // With fields in front that match too.
        let payload = encode(&(7u32, Bytes::from(vec![1u8; 5000]), 3u8)).unwrap();
        let (n, b, t): (u32, SharedBytes, u8) = decode_shared(&payload).unwrap();
        assert!(reused(&(n, &b, t), &payload).1);
    }

    #[test]
    fn anything_else_is_encoded_afresh() {
        let payload = encode(&(7u32, Bytes::from(vec![1u8; 5000]))).unwrap();
        let (n, b): (u32, SharedBytes) = decode_shared(&payload).unwrap();
        // A slice of the argument (its length prefix differs), other fields, other values.
        assert!(!reused(&b.0.slice(10..), &payload).1);
        assert!(!reused(&(n + 1, &b), &payload).1);
        assert!(!reused(&(&b, n), &payload).1);
        assert!(!reused(&(n, &b, 0u8), &payload).1);
        assert!(!reused(&42u64, &payload).1);
        assert!(!reused(&Bytes::from(vec![1u8; 5000]), &payload).1);
        // Nothing sliced: the caller does not keep the payload.
        let (_, sliced): (u64, bool) = decode_sharing(Received::from(encode(&5u64).unwrap())).0.unwrap();
        assert!(!sliced);
    }

    proptest::proptest! {
        /// Whatever is returned, the bytes are those `encode` writes.
        #[test]
        fn reusing_never_changes_the_encoding(
            head in proptest::collection::vec(proptest::num::u8::ANY, 0..4),
            data in proptest::collection::vec(proptest::num::u8::ANY, 1..300),
            cut in 0usize..300,
            bump in proptest::bool::ANY,
        ) {
            let payload = encode(&(head.clone(), Bytes::from(data))).unwrap();
            let (h, b): (Vec<u8>, SharedBytes) = decode_shared(&payload).unwrap();
            let b = b.0.slice(cut.min(b.0.len())..);
            let mut h = h;
            if bump { h.push(1); }
            reused(&(h, b), &payload);
        }
    }
}

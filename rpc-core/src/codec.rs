//! The payload codec: serde + bincode 2 (standard configuration: little endian, varint).

use bytes::Bytes;
use rpc_transport::{Buf, MemPool};
use serde::de::DeserializeOwned;
use serde::Serialize;

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

/// Encodes a value into a buffer of exactly its encoded size (measured in a first pass, so the
/// buffer never grows). Inside a server handler the buffer comes from the connection's
/// registered memory pool, so the transport sends or advertises it as it is; elsewhere it is a
/// plain heap buffer.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, CodecError> {
    match POOL.try_with(MemPool::clone) {
        Ok(pool) => encode_in(&pool, value),
        Err(_) => {
            let size = encoded_size(value)?;
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
    let mut buf = match pool.alloc(size) {
        Ok(buf) => buf,
        Err(_) => Buf::zeroed(size),
    };
    buf.set_len(size);
    write_into(value, &mut buf)?;
    Ok(buf.freeze())
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
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, config()).map_err(|e| CodecError(e.to_string()))?;
    if used != bytes.len() {
        return Err(CodecError(format!("{} trailing bytes after the value", bytes.len() - used)));
    }
    Ok(value)
}

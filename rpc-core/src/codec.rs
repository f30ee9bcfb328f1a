//! The payload codec: serde + bincode 2 (standard configuration: little endian, varint).

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encoding or decoding failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes a value into a buffer of exactly its encoded size (measured in a first pass, so the
/// buffer never grows and large ones come from the [buffer cache](crate::buffers)).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, CodecError> {
    let err = |e: bincode::error::EncodeError| CodecError(e.to_string());
    let mut size = CountingWriter(0);
    bincode::serde::encode_into_writer(value, &mut size, config()).map_err(err)?;
    let mut out = VecWriter(crate::buffers::with_capacity(size.0));
    bincode::serde::encode_into_writer(value, &mut out, config()).map_err(err)?;
    Ok(crate::buffers::freeze(out.0))
}

struct CountingWriter(usize);

impl bincode::enc::write::Writer for CountingWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0 += bytes.len();
        Ok(())
    }
}

struct VecWriter(Vec<u8>);

impl bincode::enc::write::Writer for VecWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
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

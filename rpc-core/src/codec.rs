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

/// Encodes a value.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, CodecError> {
    bincode::serde::encode_to_vec(value, config()).map(Bytes::from).map_err(|e| CodecError(e.to_string()))
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

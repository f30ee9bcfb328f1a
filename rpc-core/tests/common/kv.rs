//! The key-value service of `examples/` (same trait name and methods, so the same method ids
//! and encodings as `kv server`), in-process for the hostile-peer tests. The examples crate
//! depends on rpc-core, so rpc-core's tests cannot depend on it.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;

/// A key-value store.
#[rpc_core::service]
pub trait Kv {
    /// The value under `key`, if any.
    async fn get(&self, key: String) -> Option<Bytes>;
    /// Stores `value` under `key`; returns the key's new version (1 for a new key).
    async fn put(&self, key: String, value: Bytes) -> u64;
    /// Removes `key`; returns whether it was there.
    async fn delete(&self, key: String) -> bool;
    /// Number of keys.
    async fn len(&self) -> u64;
}

/// An in-memory [`Kv`].
#[derive(Debug, Default)]
pub struct MemoryKv {
    entries: Mutex<HashMap<String, (u64, Bytes)>>,
}

impl MemoryKv {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Bytes)>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Kv for std::sync::Arc<MemoryKv> {
    async fn get(&self, key: String) -> Option<Bytes> {
        self.entries().get(&key).map(|(_, v)| v.clone())
    }
    async fn put(&self, key: String, value: Bytes) -> u64 {
        let mut entries = self.entries();
        let version = entries.get(&key).map_or(1, |(v, _)| v + 1);
        entries.insert(key, (version, value));
        version
    }
    async fn delete(&self, key: String) -> bool {
        self.entries().remove(&key).is_some()
    }
    async fn len(&self) -> u64 {
        self.entries().len() as u64
    }
}

/// The encoded arguments of `Kv.get(key)`, as a raw client sends them.
pub fn get_args(key: &str) -> Bytes {
    rpc_core::codec::encode(&(key.to_string(),)).expect("encode get args")
}

/// The encoded arguments of `Kv.put(key, value)`.
pub fn put_args(key: &str, value: &Bytes) -> Bytes {
    rpc_core::codec::encode(&(key.to_string(), value.clone())).expect("encode put args")
}

/// Bytes that `put_args(key, value)` takes for a value of `value_len` bytes, without building it
/// (a raw attacker advertises a region of exactly that size and serves it in pieces).
pub fn put_args_len(key: &str, value_len: usize) -> usize {
    // bincode standard config: varint lengths, a string and a byte string each length-prefixed.
    varint_len(key.len()) + key.len() + varint_len(value_len) + value_len
}

/// Writes the encoding of `Kv.put(key, value of value_len bytes all equal to fill)`.
pub fn put_args_filled(key: &str, value_len: usize, fill: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(put_args_len(key, value_len));
    push_varint(&mut out, key.len());
    out.extend_from_slice(key.as_bytes());
    push_varint(&mut out, value_len);
    out.resize(out.len() + value_len, fill);
    out
}

fn varint_len(v: usize) -> usize {
    match v {
        0..=250 => 1,
        251..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

fn push_varint(out: &mut Vec<u8>, v: usize) {
    match v {
        0..=250 => out.push(v as u8),
        251..=0xffff => {
            out.push(251);
            out.extend_from_slice(&(v as u16).to_le_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(252);
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
        _ => {
            out.push(253);
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
    }
}

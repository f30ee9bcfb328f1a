//! A key-value service, shared by the `kv` example binary and the docs.
//!
//! Values are `bytes::Bytes`: serde encodes them as one length-prefixed byte string (a single
//! copy), where a `Vec<u8>` would be encoded element by element.

pub mod metrics;

// The README's Rust snippets compile and run as doctests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;

/// A key-value store.
#[rpc_core::service]
pub trait Kv {
    /// The value under `key`, if any. (Reads answer at once, from a map under a lock held for
    /// no `.await`: marked to be polled in the connection's driver, with no task.)
    #[rpc(inline)]
    async fn get(&self, key: String) -> Option<Bytes>;
    /// Stores `value` under `key`; returns the key's new version (1 for a new key).
    async fn put(&self, key: String, value: Bytes) -> u64;
    /// Removes `key`; returns whether it was there.
    async fn delete(&self, key: String) -> bool;
    /// Number of keys.
    #[rpc(inline)]
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

impl Kv for MemoryKv {
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

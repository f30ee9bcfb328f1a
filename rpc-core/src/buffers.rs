//! A process-wide cache of large byte buffers, reused across calls.
//!
//! Large payloads (encoded arguments and results, READ destinations) would otherwise be fresh
//! allocations on every call; above the allocator's mmap threshold each one is page-faulted in on
//! first touch and unmapped when freed, which costs more than copying the bytes. Buffers of at
//! least [`MIN_POOLED`] bytes are handed out as [`Bytes`] whose drop returns them here.
//! At most [`MAX_CACHED_BYTES`] are kept; the rest are freed.

use std::sync::{Mutex, OnceLock};

use bytes::Bytes;

/// Smallest buffer worth caching (smaller ones come from the allocator's own caches).
pub const MIN_POOLED: usize = 64 * 1024;
/// Largest total of idle buffers kept.
pub const MAX_CACHED_BYTES: usize = 64 << 20;
/// Largest number of idle buffers kept.
const MAX_CACHED_BUFFERS: usize = 16;

#[derive(Debug, Default)]
struct Pool {
    idle: Mutex<Vec<Vec<u8>>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

impl Pool {
    /// The smallest idle buffer whose capacity holds `len` (and is not wastefully larger).
    fn take(&self, len: usize) -> Option<Vec<u8>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let best = idle
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() / 4 <= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        Some(idle.swap_remove(best))
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let cached: usize = idle.iter().map(Vec::capacity).sum();
        if idle.len() < MAX_CACHED_BUFFERS && cached + buf.capacity() <= MAX_CACHED_BYTES {
            idle.push(buf);
        }
    }
}

/// A buffer of exactly `len` initialized bytes (contents unspecified), for a READ destination.
pub(crate) fn zeroable(len: usize) -> Vec<u8> {
    if len < MIN_POOLED {
        return vec![0; len];
    }
    match pool().take(len) {
        Some(mut buf) => {
            // Keep what is initialized; only a shortfall is written.
            if buf.len() >= len {
                buf.truncate(len);
            } else {
                buf.resize(len, 0);
            }
            buf
        }
        None => vec![0; len],
    }
}

/// An empty buffer with room for `capacity` bytes, to write into.
pub(crate) fn with_capacity(capacity: usize) -> Vec<u8> {
    if capacity < MIN_POOLED {
        return Vec::with_capacity(capacity);
    }
    match pool().take(capacity) {
        Some(mut buf) => {
            buf.clear();
            buf
        }
        None => Vec::with_capacity(capacity),
    }
}

/// Freezes `buf` into [`Bytes`]; a large buffer returns to the cache when the last clone drops.
pub(crate) fn freeze(buf: Vec<u8>) -> Bytes {
    if buf.capacity() < MIN_POOLED {
        return Bytes::from(buf);
    }
    Bytes::from_owner(Pooled(buf))
}

struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        pool().give_back(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_come_back_and_small_ones_are_not_cached() {
        let mut b = with_capacity(1 << 20);
        b.extend_from_slice(&[7u8; 1 << 20]);
        let ptr = b.as_ptr();
        let frozen = freeze(b);
        assert_eq!(frozen.len(), 1 << 20);
        drop(frozen.clone());
        drop(frozen);
        let again = zeroable(900 << 10);
        assert_eq!(again.len(), 900 << 10);
        assert_eq!(again.as_ptr(), ptr, "the 1 MiB buffer was reused for 900 KiB");
        assert!(zeroable(10).capacity() < MIN_POOLED);
        // Far too large a buffer for the request is not handed out.
        let tiny = zeroable(MIN_POOLED);
        assert_ne!(tiny.as_ptr(), again.as_ptr());
    }
}

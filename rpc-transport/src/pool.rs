//! Registered memory as a connection's resource: a pool of buffers that every operation can use
//! as they are (SEND from, advertise for READ, READ into, receive into), registered once per
//! chunk and reused.
//!
//! # Shape
//!
//! A [`MemPool`] hands out [`Buf`]s: owned, writable byte buffers carved from *chunks*. A chunk is
//! allocated and registered once (on `rdma`: one `ibv_reg_mr` in the connection's protection
//! domain; `mem` and `tcp` register nothing) and stays registered while any of its buffers is
//! alive or idle in the pool. Freezing a `Buf` into [`Bytes`] ([`Buf::freeze`]) does not copy:
//! the buffer returns to its pool when the last `Bytes` clone drops. A transport recognises its
//! own pool's memory by address ([`MemPool::keys_of`]), so a `Bytes` that came from its pool is
//! sent, advertised or read into without registering anything.
//!
//! Sizes are rounded up to one of four classes per power of two (at most 25% waste). Classes
//! below [`CHUNK_BYTES`] share chunks of 32 buffers (64 KiB to 1 MiB); larger buffers are a
//! chunk each.
//!
//! # Limits and memory cost
//!
//! [`PoolLimits::max_bytes`] bounds the memory a pool keeps registered for reuse; an allocation
//! beyond it (or larger than [`MAX_CLASS`]) gets a chunk of its own, registered by
//! [`MemPool::alloc`] on the caller's task and deregistered when it is dropped (counted in
//! [`PoolCounters::one_off`]). [`PoolLimits::max_idle_bytes`] bounds the large buffers kept idle
//! for reuse; shared small-class chunks stay until the pool goes.
//!
//! # Soundness of recognising memory by address
//!
//! Pool memory is reachable only through a `Buf` (or the `Bytes` it froze into), which owns its
//! block until dropped. So a `Bytes` whose bytes lie inside a live chunk of this pool keeps that
//! block alive for as long as the caller holds it: a transport that keeps the `Bytes` until the
//! operation completes (or the region is revoked) never lets the block be reused under it.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;

use crate::TransportError;

/// Largest chunk shared by small size classes: 1 MiB. A class's chunks hold 32 buffers, at
/// least 64 KiB and at most this much; buffers of this size or more are a chunk each.
pub const CHUNK_BYTES: usize = 1 << 20;
/// Smallest chunk.
const MIN_CHUNK: usize = 64 << 10;
/// Buffers per shared chunk.
const BLOCKS_PER_CHUNK: usize = 32;
/// Smallest size class: 512 bytes.
const MIN_CLASS: usize = 512;
/// Largest size class kept in the pool: 1 GiB. Larger buffers are one-off.
pub const MAX_CLASS: usize = 1 << 30;

/// Keys of registered memory, as the NIC knows them (0 on backends without registration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keys {
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// A registration of one chunk; dropping it deregisters.
pub(crate) struct Registration {
    pub(crate) keys: Keys,
    /// Whatever deregisters on drop (an `ibv_mr` on rdma).
    pub(crate) guard: Option<Box<dyn Send + Sync>>,
}

/// Registers memory for a pool: the backend's part.
pub(crate) trait Registrar: Send + Sync + 'static {
    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// The memory must stay allocated until the returned registration is dropped.
    unsafe fn register(&self, ptr: NonNull<u8>, len: usize) -> Result<Registration, TransportError>;
    /// Whether this backend registers anything (false: `mem`, `tcp`).
    fn registers(&self) -> bool;
}

/// The registrar of backends without registration.
struct NoRegistration;

impl Registrar for NoRegistration {
    unsafe fn register(&self, _: NonNull<u8>, _: usize) -> Result<Registration, TransportError> {
        Ok(Registration { keys: Keys { lkey: 0, rkey: 0 }, guard: None })
    }
    fn registers(&self) -> bool {
        false
    }
}

/// Bounds of one pool. Build with struct update syntax: `PoolLimits { max_bytes: .., ..Default::default() }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Memory the pool keeps registered (in use or idle) for reuse. Default 256 MiB. Buffers
    /// beyond it are registered for their own life (one-off) and released when dropped.
    pub max_bytes: usize,
    /// Idle memory of large classes (at least [`CHUNK_BYTES`]) kept registered for the next
    /// buffer of the same class. Default 64 MiB. Small classes share chunks and stay (bounded by
    /// `max_bytes`). An idle connection therefore pins at most `max_idle_bytes` plus the small
    /// chunks it used.
    pub max_idle_bytes: usize,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits { max_bytes: 256 << 20, max_idle_bytes: 64 << 20 }
    }
}

/// What a pool did, since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolCounters {
    /// Memory registrations (`ibv_reg_mr` on rdma; 0 on backends that register nothing).
    pub registrations: u64,
    /// Deregistrations (`ibv_dereg_mr`).
    pub deregistrations: u64,
    /// Buffers handed out.
    pub allocs: u64,
    /// Buffers that needed a new chunk (a registration, on rdma).
    pub misses: u64,
    /// Buffers registered for their own life: beyond `max_bytes` or larger than [`MAX_CLASS`].
    pub one_off: u64,
    /// Bytes currently registered (chunks alive).
    pub registered_bytes: u64,
    /// Bytes the pool keeps for reuse (chunks of the pool, in use or idle).
    pub pooled_bytes: u64,
}

#[derive(Default)]
struct AtomicCounters {
    registrations: AtomicU64,
    deregistrations: AtomicU64,
    allocs: AtomicU64,
    misses: AtomicU64,
    one_off: AtomicU64,
    registered_bytes: AtomicU64,
}

/// One registered allocation.
struct Chunk {
    // Field order: the registration goes (deregisters) before the memory is freed in `Drop`.
    reg: Registration,
    mem: NonNull<u8>,
    len: usize,
    /// Kept by the pool (false: a one-off buffer, released with it).
    pooled: bool,
    shared: Weak<Shared>,
}

// SAFETY: the chunk's memory is plain heap bytes; which part may be written is governed by the
// unique ownership of blocks (one `Buf` per block), not by the chunk.
unsafe impl Send for Chunk {}
// SAFETY: as above; the chunk itself is never mutated after creation.
unsafe impl Sync for Chunk {}

impl Drop for Chunk {
    fn drop(&mut self) {
        let registered = self.reg.guard.is_some();
        // Deregister first (the NIC may no longer use the memory), then free it.
        self.reg.guard = None;
        if let Some(shared) = self.shared.upgrade() {
            shared.chunk_gone(self.mem.as_ptr() as usize, self.len, registered, self.pooled);
        }
        // SAFETY: `mem` came from `Box::<[u8]>::into_raw` of exactly `len` bytes in `Chunk::new`
        // and is freed only here, once.
        unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.mem.as_ptr(), self.len))) };
    }
}

/// A block of a chunk, owned by exactly one `Buf` (or idle in the pool).
struct Block {
    chunk: Arc<Chunk>,
    offset: usize,
    size: usize,
}

impl Block {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: `offset + size <= chunk.len` by construction (`Shared::carve`).
        unsafe { self.chunk.mem.as_ptr().add(self.offset) }
    }
}

struct State {
    /// Idle blocks per size class.
    free: Vec<Vec<Block>>,
    /// Bytes of pooled chunks (in use or idle).
    pooled_bytes: usize,
    /// Bytes of idle blocks of large classes.
    idle_large: usize,
    /// The connection is gone: nothing more is kept for reuse.
    closed: bool,
}

struct Shared {
    registrar: Box<dyn Registrar>,
    limits: PoolLimits,
    state: Mutex<State>,
    /// Live chunks by start address, for [`MemPool::keys_of`].
    chunks: Mutex<BTreeMap<usize, (usize, Keys)>>,
    counters: AtomicCounters,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunks(&self) -> MutexGuard<'_, BTreeMap<usize, (usize, Keys)>> {
        self.chunks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunk_gone(&self, addr: usize, len: usize, registered: bool, pooled: bool) {
        self.chunks().remove(&addr);
        if registered {
            self.counters.deregistrations.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.registered_bytes.fetch_sub(len as u64, Ordering::Relaxed);
        if pooled {
            let mut state = self.state();
            state.pooled_bytes = state.pooled_bytes.saturating_sub(len);
        }
    }

    fn give_back(&self, block: Block) {
        if !block.chunk.pooled {
            return; // a one-off: released (deregistered) with its last block
        }
        let class = class_index(block.size);
        let mut state = self.state();
        if state.closed {
            drop(state);
            return; // released
        }
        if block.size >= CHUNK_BYTES {
            if state.idle_large + block.size > self.limits.max_idle_bytes {
                drop(state);
                return; // released: the chunk deregisters when `block` drops
            }
            state.idle_large += block.size;
        }
        state.free[class].push(block);
    }
}

/// A pool of registered buffers, shared by a connection and whoever encodes for it. Cheap to
/// clone (one `Arc`).
#[derive(Clone)]
pub struct MemPool {
    shared: Arc<Shared>,
}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("registers", &self.shared.registrar.registers())
            .field("counters", &self.counters())
            .finish()
    }
}

impl MemPool {
    /// A pool of plain heap memory (what `mem` and `tcp` use): nothing is registered.
    pub fn heap(limits: PoolLimits) -> MemPool {
        MemPool::with_registrar(Box::new(NoRegistration), limits)
    }

    pub(crate) fn with_registrar(registrar: Box<dyn Registrar>, limits: PoolLimits) -> MemPool {
        let classes = class_index(MAX_CLASS) + 1;
        MemPool {
            shared: Arc::new(Shared {
                registrar,
                limits,
                state: Mutex::new(State {
                    free: (0..classes).map(|_| Vec::new()).collect(),
                    pooled_bytes: 0,
                    idle_large: 0,
                    closed: false,
                }),
                chunks: Mutex::new(BTreeMap::new()),
                counters: AtomicCounters::default(),
            }),
        }
    }

    /// A buffer of `len` bytes (contents unspecified: zeroes or bytes of an earlier use of this
    /// pool). Fails only if the memory cannot be allocated or registered.
    pub fn alloc(&self, len: usize) -> Result<Buf, TransportError> {
        let shared = &self.shared;
        shared.counters.allocs.fetch_add(1, Ordering::Relaxed);
        let size = class_size(len.max(1));
        if size > MAX_CLASS {
            return self.one_off(len);
        }
        let class = class_index(size);
        let mut state = shared.state();
        if state.closed {
            drop(state);
            return self.one_off(len);
        }
        if let Some(block) = state.free[class].pop() {
            if size >= CHUNK_BYTES {
                state.idle_large -= size;
            }
            return Ok(Buf::pooled(block, len));
        }
        let chunk_len = if size >= CHUNK_BYTES {
            size
        } else {
            (size * BLOCKS_PER_CHUNK).clamp(MIN_CHUNK, CHUNK_BYTES) / size * size
        };
        if state.pooled_bytes + chunk_len > shared.limits.max_bytes {
            drop(state);
            return self.one_off(len);
        }
        state.pooled_bytes += chunk_len;
        drop(state);
        shared.counters.misses.fetch_add(1, Ordering::Relaxed);
        let chunk = match self.new_chunk(chunk_len, true) {
            Ok(c) => c,
            Err(e) => {
                let mut state = shared.state();
                state.pooled_bytes -= chunk_len;
                return Err(e);
            }
        };
        let blocks = chunk_len / size;
        let mut state = shared.state();
        for i in 1..blocks {
            state.free[class].push(Block { chunk: chunk.clone(), offset: i * size, size });
        }
        drop(state);
        Ok(Buf::pooled(Block { chunk, offset: 0, size }, len))
    }

    /// [`MemPool::alloc`], or plain heap memory if the pool cannot provide it (a transport then
    /// copies or registers it for its operation alone).
    pub fn alloc_or_heap(&self, len: usize) -> Buf {
        self.alloc(len).unwrap_or_else(|e| {
            tracing::debug!(len, error = %e, "pool allocation failed; using heap memory");
            Buf::zeroed(len)
        })
    }

    fn one_off(&self, len: usize) -> Result<Buf, TransportError> {
        self.shared.counters.one_off.fetch_add(1, Ordering::Relaxed);
        let chunk = self.new_chunk(len.max(1), false)?;
        Ok(Buf::pooled(Block { chunk, offset: 0, size: len.max(1) }, len))
    }

    fn new_chunk(&self, len: usize, pooled: bool) -> Result<Arc<Chunk>, TransportError> {
        let shared = &self.shared;
        let mem = Box::into_raw(vec![0u8; len].into_boxed_slice());
        // SAFETY: a boxed slice of `len >= 1` bytes is never null.
        let mem = unsafe { NonNull::new_unchecked(mem as *mut u8) };
        // SAFETY: the memory is freed only in `Chunk::drop`, after the registration is dropped.
        let reg = match unsafe { shared.registrar.register(mem, len) } {
            Ok(reg) => reg,
            Err(e) => {
                // SAFETY: not registered, not shared: freed once, here.
                unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(mem.as_ptr(), len))) };
                return Err(e);
            }
        };
        if reg.guard.is_some() {
            shared.counters.registrations.fetch_add(1, Ordering::Relaxed);
        }
        shared.counters.registered_bytes.fetch_add(len as u64, Ordering::Relaxed);
        shared.chunks().insert(mem.as_ptr() as usize, (len, reg.keys));
        Ok(Arc::new(Chunk { reg, mem, len, pooled, shared: Arc::downgrade(shared) }))
    }

    /// The keys of `bytes` if they lie entirely inside one chunk of this pool (see the module
    /// docs for why holding `bytes` then keeps that memory from being reused).
    #[cfg_attr(not(any(test, feature = "rdma")), allow(dead_code))]
    pub(crate) fn keys_of(&self, bytes: &[u8]) -> Option<Keys> {
        let addr = bytes.as_ptr() as usize;
        let chunks = self.shared.chunks();
        let (&start, &(len, keys)) = chunks.range(..=addr).next_back()?;
        (addr + bytes.len() <= start + len).then_some(keys)
    }

    /// The connection is gone: releases every idle buffer now, and every buffer in use when it
    /// is dropped (its chunk is deregistered and freed with its last buffer). Allocation still
    /// works, as one-off buffers. Idempotent.
    pub fn close(&self) {
        let idle = {
            let mut state = self.shared.state();
            state.closed = true;
            state.idle_large = 0;
            std::mem::take(&mut state.free)
        };
        drop(idle); // outside the lock: dropping chunks takes it
    }

    /// Whether `bytes` lie in this pool's memory (a received message or READ that was handed
    /// on without a copy, a payload encoded in place).
    pub fn contains(&self, bytes: &[u8]) -> bool {
        !bytes.is_empty() && self.keys_of(bytes).is_some()
    }

    /// Whether this pool registers its chunks (rdma) or not (mem, tcp).
    pub fn registers(&self) -> bool {
        self.shared.registrar.registers()
    }

    /// The pool's counters.
    pub fn counters(&self) -> PoolCounters {
        let c = &self.shared.counters;
        PoolCounters {
            registrations: c.registrations.load(Ordering::Relaxed),
            deregistrations: c.deregistrations.load(Ordering::Relaxed),
            allocs: c.allocs.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            one_off: c.one_off.load(Ordering::Relaxed),
            registered_bytes: c.registered_bytes.load(Ordering::Relaxed),
            pooled_bytes: self.shared.state().pooled_bytes as u64,
        }
    }
}

/// The size class of a buffer of `len` bytes: `len` rounded up to `c << e` with `c` in 4..8.
fn class_size(len: usize) -> usize {
    if len <= MIN_CLASS {
        return MIN_CLASS;
    }
    let m = len - 1;
    let k = usize::BITS - 1 - m.leading_zeros();
    let shift = k - 2;
    ((m >> shift) + 1) << shift
}

/// The index of a class size (as returned by [`class_size`]).
fn class_index(size: usize) -> usize {
    let k = usize::BITS - 1 - size.leading_zeros(); // size in [2^k, 2^(k+1))
    let shift = k - 2;
    let c = size >> shift; // 4..=7
    (shift as usize - 7) * 4 + (c - 4)
}

enum Storage {
    /// A block of a pool's chunk.
    Pooled(Block),
    /// Plain heap memory, registered nowhere (tests, callers without a pool).
    Heap(Vec<u8>),
}

/// An owned, writable buffer: from a [`MemPool`] (registered memory, reused) or from a `Vec`.
///
/// Derefs to its first [`Buf::len`] bytes. It belongs to whoever holds it; handed to an
/// operation (a receive, a READ's destination) it comes back in the operation's completion.
pub struct Buf {
    storage: Storage,
    len: usize,
}

// SAFETY: a pooled `Buf` is the only owner of its block's bytes (the pool hands each block to one
// `Buf` at a time), so moving it across threads moves exclusive access.
unsafe impl Send for Buf {}
// SAFETY: shared references only read.
unsafe impl Sync for Buf {}

impl Buf {
    fn pooled(block: Block, len: usize) -> Buf {
        Buf { storage: Storage::Pooled(block), len }
    }

    /// A heap buffer of `len` zero bytes (registered nowhere).
    pub fn zeroed(len: usize) -> Buf {
        Buf::from(vec![0u8; len])
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most bytes this buffer can hold.
    pub fn capacity(&self) -> usize {
        match &self.storage {
            Storage::Pooled(b) => b.size,
            Storage::Heap(v) => v.len(),
        }
    }

    /// Sets the length (at most [`Buf::capacity`]; contents of new bytes unspecified).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// Whether it came from a pool.
    pub fn is_pooled(&self) -> bool {
        matches!(self.storage, Storage::Pooled(_))
    }

    /// The whole capacity, writable.
    pub fn storage_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            // SAFETY: this `Buf` owns the block exclusively; the block lies inside its chunk,
            // which is alive (Arc) and allocated for its whole length.
            Storage::Pooled(b) => unsafe { std::slice::from_raw_parts_mut(b.ptr(), b.size) },
            Storage::Heap(v) => v,
        }
    }

    /// Freezes into [`Bytes`] without copying; pool memory returns to its pool when the last
    /// clone drops.
    pub fn freeze(mut self) -> Bytes {
        if let Storage::Heap(v) = &mut self.storage {
            let mut v = std::mem::take(v);
            v.truncate(self.len);
            return Bytes::from(v);
        }
        Bytes::from_owner(self)
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            // SAFETY: as in `storage_mut`; `len <= size`.
            Storage::Pooled(b) => unsafe { std::slice::from_raw_parts(b.ptr(), self.len) },
            Storage::Heap(v) => &v[..self.len],
        }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.storage_mut()[..len]
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for Buf {
    fn from(v: Vec<u8>) -> Buf {
        let len = v.len();
        Buf { storage: Storage::Heap(v), len }
    }
}

impl PartialEq<[u8]> for Buf {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for Buf {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Buf {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == *other
    }
}

impl PartialEq for Buf {
    fn eq(&self, other: &Buf) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf").field("len", &self.len).field("pooled", &self.is_pooled()).finish()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Storage::Pooled(_) = self.storage {
            let Storage::Pooled(block) = std::mem::replace(&mut self.storage, Storage::Heap(Vec::new()))
            else {
                unreachable!()
            };
            if let Some(shared) = block.chunk.shared.upgrade() {
                shared.give_back(block);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_a_quarter() {
        assert_eq!(class_size(1), 512);
        assert_eq!(class_size(512), 512);
        assert_eq!(class_size(513), 640);
        assert_eq!(class_size(8192 + 128), 10240);
        assert_eq!(class_size(16 << 20), 16 << 20);
        assert_eq!(class_size((16 << 20) + 1), 20 << 20);
        let mut last = 0;
        for len in (1..(4 << 20)).step_by(997) {
            let size = class_size(len);
            assert!(size >= len && (size <= MIN_CLASS || size - len <= len / 4 + 1), "{len} -> {size}");
            let idx = class_index(size);
            assert!(idx >= last || size <= MIN_CLASS);
            last = idx;
        }
        assert_eq!(class_index(512), 0);
        assert_eq!(class_index(640), 1);
        assert_eq!(class_index(1024), 4);
    }

    #[test]
    fn buffers_are_reused_and_recognised() {
        let pool = MemPool::heap(PoolLimits::default());
        let mut a = pool.alloc(3000).unwrap();
        a.copy_from_slice(&[7; 3000]);
        let ptr = a.as_ptr();
        let frozen = a.freeze();
        assert!(pool.keys_of(&frozen[10..20]).is_some());
        assert!(pool.keys_of(&[0u8; 4]).is_none());
        let c = pool.counters();
        assert_eq!((c.misses, c.registrations), (1, 0));
        drop(frozen);
        let b = pool.alloc(2900).unwrap();
        assert_eq!(b.as_ptr(), ptr, "the block was reused");
        assert_eq!(pool.counters().misses, 1);
    }

    #[test]
    fn large_idle_buffers_are_bounded_and_overflow_is_one_off() {
        let limits = PoolLimits { max_bytes: 8 << 20, max_idle_bytes: 2 << 20 };
        let pool = MemPool::heap(limits);
        let a = pool.alloc(2 << 20).unwrap();
        let b = pool.alloc(2 << 20).unwrap();
        let c = pool.alloc(2 << 20).unwrap();
        assert_eq!(pool.counters().pooled_bytes, 6 << 20);
        let d = pool.alloc(4 << 20).unwrap(); // would exceed max_bytes: one-off
        assert_eq!(pool.counters().one_off, 1);
        assert_eq!(pool.counters().pooled_bytes, 6 << 20);
        drop((a, b, c, d));
        // Only 2 MiB of large buffers stay idle.
        assert_eq!(pool.counters().pooled_bytes, 2 << 20);
        assert_eq!(pool.counters().registered_bytes, 2 << 20);
    }

    #[test]
    fn a_closed_pool_keeps_nothing() {
        let pool = MemPool::heap(PoolLimits::default());
        let a = pool.alloc(2 << 20).unwrap();
        let b = pool.alloc(4000).unwrap();
        drop(pool.alloc(3 << 20).unwrap());
        assert!(pool.counters().registered_bytes >= 5 << 20);
        pool.close();
        assert_eq!(pool.counters().registered_bytes, (2 << 20) + 32 * 4096, "only what is in use");
        drop((a, b));
        assert_eq!(pool.counters().registered_bytes, 0);
        assert_eq!(pool.counters().pooled_bytes, 0);
        let c = pool.alloc(100).unwrap();
        assert_eq!(pool.counters().one_off, 1);
        drop(c);
        assert_eq!(pool.counters().registered_bytes, 0);
    }

    #[test]
    fn buffers_outlive_their_pool() {
        let pool = MemPool::heap(PoolLimits::default());
        let mut a = pool.alloc(100).unwrap();
        drop(pool);
        a.copy_from_slice(&[1; 100]);
        assert_eq!(a.freeze().len(), 100);
    }
}

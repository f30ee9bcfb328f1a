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
//! Besides the chunks, each size class in use has a free list of `2 x` its blocks per chunk
//! (at least 8) slots of 32 bytes, made on the class's first use: 8 KiB for the 512-byte class.
//!
//! # No lock on the common path
//!
//! Allocating and freeing a buffer take no lock: each size class's idle blocks wait in a bounded
//! lock-free queue ([`crossbeam_queue::ArrayQueue`]); only blocks beyond its capacity go to a
//! locked overflow list (more idle blocks of one class at once than two chunks' worth). Idle
//! blocks are reused first in, first out (a chunk's blocks in turn, not the last one freed). The
//! pool's byte counts are atomics. A buffer's keys come with its chunk
//! ([`MemPool::keys_of_buf`]); memory recognised by address ([`MemPool::keys_of`], for a
//! `Bytes`) is looked up in a snapshot of the chunk map that is replaced ([`arc_swap`]) when a
//! chunk comes or goes, which is when memory is registered or deregistered, never per call.
//!
//! # Soundness of recognising memory by address
//!
//! Pool memory is reachable only through a `Buf` (or the `Bytes` it froze into), which owns its
//! block until dropped. So a `Bytes` whose bytes lie inside a live chunk of this pool keeps that
//! block alive for as long as the caller holds it: a transport that keeps the `Bytes` until the
//! operation completes (or the region is revoked) never lets the block be reused under it.
//!
//! A stale snapshot cannot mislead either: a chunk leaves the snapshot before its memory is
//! freed (in `Chunk::drop`, which runs only when no buffer of it is left). Memory that the
//! allocator later hands out at the same address was allocated after that free, so a caller
//! holding it loads the snapshot after the new one was stored (arc-swap's store and load order
//! like a release and an acquire) and sees the chunk gone.
//!
//! # Closing
//!
//! [`MemPool::close`] sets a flag, then empties the free lists. A buffer freed concurrently
//! pushes its block, then reads the flag (a sequentially consistent fence on each side): if it
//! sees the pool closed it empties its free list itself, so no block stays idle in a closed
//! pool whichever comes first.

use parking_lot::Mutex;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use arc_swap::ArcSwap;
use bytes::Bytes;
use crossbeam_queue::ArrayQueue;

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

/// The idle blocks of one size class: a bounded lock-free queue, and a locked overflow list for
/// blocks beyond its capacity (reached only when more blocks of the class are idle at once).
struct FreeList {
    queue: ArrayQueue<Block>,
    overflow: Mutex<Vec<Block>>,
    /// Blocks in `overflow`, read without its lock (a stale zero only costs a new chunk,
    /// bounded by `max_bytes` like any other).
    overflowed: AtomicUsize,
}

impl FreeList {
    fn new(capacity: usize) -> FreeList {
        FreeList {
            queue: ArrayQueue::new(capacity),
            overflow: Mutex::new(Vec::new()),
            overflowed: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn pop(&self) -> Option<Block> {
        if let Some(block) = self.queue.pop() {
            return Some(block);
        }
        if self.overflowed.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.pop_overflow()
    }

    #[cold]
    #[inline(never)]
    fn pop_overflow(&self) -> Option<Block> {
        let mut overflow = self.overflow.lock();
        let block = overflow.pop();
        self.overflowed.store(overflow.len(), Ordering::Relaxed);
        block
    }

    #[inline]
    fn push(&self, block: Block) {
        if let Err(block) = self.queue.push(block) {
            self.push_overflow(block);
        }
    }

    #[cold]
    #[inline(never)]
    fn push_overflow(&self, block: Block) {
        let mut overflow = self.overflow.lock();
        overflow.push(block);
        self.overflowed.store(overflow.len(), Ordering::Relaxed);
    }

    /// Takes every idle block (the caller drops them outside any lock: dropping a chunk's last
    /// block updates the chunk map).
    fn take_all(&self) -> Vec<Block> {
        let mut taken = std::mem::take(&mut *self.overflow.lock());
        self.overflowed.store(0, Ordering::Relaxed);
        while let Some(block) = self.queue.pop() {
            taken.push(block);
        }
        taken
    }
}

/// A live chunk, as the address map knows it.
#[derive(Clone, Copy)]
struct ChunkEntry {
    start: usize,
    len: usize,
    keys: Keys,
}

struct Shared {
    registrar: Box<dyn Registrar>,
    limits: PoolLimits,
    /// Idle blocks per size class, each list made on its class's first use.
    free: Box<[OnceLock<Box<FreeList>>]>,
    /// Bytes of pooled chunks (in use or idle), at most `limits.max_bytes`.
    pooled_bytes: AtomicUsize,
    /// Bytes of idle blocks of large classes, at most `limits.max_idle_bytes`.
    idle_large: AtomicUsize,
    /// The connection is gone: nothing more is kept for reuse.
    closed: AtomicBool,
    /// Live chunks sorted by start address; changed under this lock (when a chunk comes or
    /// goes), then published to `snapshot`.
    chunks: Mutex<Vec<ChunkEntry>>,
    /// The latest `chunks`, read without a lock by [`MemPool::keys_of`].
    snapshot: ArcSwap<Vec<ChunkEntry>>,
    counters: AtomicCounters,
}

impl Shared {
    #[inline]
    fn free_list(&self, class: usize) -> &FreeList {
        match self.free[class].get() {
            Some(list) => list,
            None => self.make_free_list(class),
        }
    }

    #[cold]
    #[inline(never)]
    fn make_free_list(&self, class: usize) -> &FreeList {
        self.free[class].get_or_init(|| {
            let size = class_size_of(class);
            Box::new(FreeList::new((2 * (chunk_len(size) / size)).max(8)))
        })
    }

    /// Adds or removes a chunk of the address map and publishes the new map.
    fn update_chunks(&self, f: impl FnOnce(&mut Vec<ChunkEntry>)) {
        let mut chunks = self.chunks.lock();
        f(&mut chunks);
        self.snapshot.store(Arc::new(chunks.clone()));
    }

    fn chunk_gone(&self, addr: usize, len: usize, registered: bool, pooled: bool) {
        self.update_chunks(|chunks| {
            if let Ok(i) = chunks.binary_search_by_key(&addr, |c| c.start) {
                chunks.remove(i);
            }
        });
        if registered {
            self.counters.deregistrations.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.registered_bytes.fetch_sub(len as u64, Ordering::Relaxed);
        if pooled {
            self.pooled_bytes.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// An idle block of `class`, if any.
    #[inline]
    fn take_idle(&self, class: usize) -> Option<Block> {
        let block = self.free_list(class).pop()?;
        if block.size >= CHUNK_BYTES {
            self.idle_large.fetch_sub(block.size, Ordering::Relaxed);
        }
        Some(block)
    }

    #[inline]
    fn give_back(&self, block: Block) {
        if !block.chunk.pooled || self.closed.load(Ordering::Relaxed) {
            return; // a one-off, or a closed pool: released (deregistered) with its last block
        }
        let size = block.size;
        if size >= CHUNK_BYTES {
            let max = self.limits.max_idle_bytes;
            let room = |idle: usize| (idle + size <= max).then_some(idle + size);
            if self.idle_large.fetch_update(Ordering::Relaxed, Ordering::Relaxed, room).is_err() {
                return; // released: the chunk deregisters when `block` drops
            }
        }
        let class = class_index(size);
        self.free_list(class).push(block);
        self.recheck_closed(class);
    }

    /// After pushing idle blocks of `class`: if the pool was closed meanwhile (its `close` may
    /// have emptied the list before our push), empties the list now. See the module docs.
    #[inline]
    fn recheck_closed(&self, class: usize) {
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::Relaxed) {
            self.drop_idle(class);
        }
    }

    /// Releases every idle block of `class`.
    #[cold]
    #[inline(never)]
    fn drop_idle(&self, class: usize) {
        let Some(list) = self.free[class].get() else { return };
        let taken = list.take_all();
        let large: usize = taken.iter().filter(|b| b.size >= CHUNK_BYTES).map(|b| b.size).sum();
        self.idle_large.fetch_sub(large, Ordering::Relaxed);
        drop(taken);
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
                free: (0..classes).map(|_| OnceLock::new()).collect(),
                pooled_bytes: AtomicUsize::new(0),
                idle_large: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
                chunks: Mutex::new(Vec::new()),
                snapshot: ArcSwap::from_pointee(Vec::new()),
                counters: AtomicCounters::default(),
            }),
        }
    }

    /// A buffer of `len` bytes (contents unspecified: zeroes or bytes of an earlier use of this
    /// pool). Fails only if the memory cannot be allocated or registered.
    #[inline]
    pub fn alloc(&self, len: usize) -> Result<Buf, TransportError> {
        let shared = &self.shared;
        shared.counters.allocs.fetch_add(1, Ordering::Relaxed);
        let Some((size, class)) = self.class_for(len) else { return self.one_off(len) };
        if let Some(block) = shared.take_idle(class) {
            return Ok(Buf::pooled(block, len));
        }
        self.alloc_chunk(len, size, class)
    }

    /// [`MemPool::alloc`] with no idle block of its class: a new chunk (or a one-off beyond
    /// `max_bytes`).
    #[cold]
    #[inline(never)]
    fn alloc_chunk(&self, len: usize, size: usize, class: usize) -> Result<Buf, TransportError> {
        let shared = &self.shared;
        let chunk_len = chunk_len(size);
        let max = shared.limits.max_bytes;
        let room = |pooled: usize| (pooled + chunk_len <= max).then_some(pooled + chunk_len);
        if shared.pooled_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, room).is_err() {
            return self.one_off(len);
        }
        shared.counters.misses.fetch_add(1, Ordering::Relaxed);
        let chunk = match self.new_chunk(chunk_len, true) {
            Ok(c) => c,
            Err(e) => {
                shared.pooled_bytes.fetch_sub(chunk_len, Ordering::Relaxed);
                return Err(e);
            }
        };
        let blocks = chunk_len / size;
        if blocks > 1 {
            let list = shared.free_list(class);
            for i in 1..blocks {
                list.push(Block { chunk: chunk.clone(), offset: i * size, size });
            }
            shared.recheck_closed(class);
        }
        Ok(Buf::pooled(Block { chunk, offset: 0, size }, len))
    }

    /// A buffer of `len` bytes if one lies idle in the pool, without making or registering any
    /// memory (`None`: [`MemPool::alloc`] would make a chunk or a one-off, which on a registering
    /// backend calls the NIC's driver and can take milliseconds for large buffers).
    pub fn alloc_idle(&self, len: usize) -> Option<Buf> {
        let (_, class) = self.class_for(len)?;
        let block = self.shared.take_idle(class)?;
        self.shared.counters.allocs.fetch_add(1, Ordering::Relaxed);
        Some(Buf::pooled(block, len))
    }

    /// The size and class index a buffer of `len` bytes is pooled in; `None` when it cannot be
    /// pooled (larger than [`MAX_CLASS`], or the pool is closed): it is then a one-off.
    #[inline]
    fn class_for(&self, len: usize) -> Option<(usize, usize)> {
        let (size, class) = class_of(len);
        let pooled = size <= MAX_CLASS && !self.shared.closed.load(Ordering::Relaxed);
        pooled.then_some((size, class))
    }

    /// [`MemPool::alloc`], or plain heap memory if the pool cannot provide it (a transport then
    /// copies or registers it for its operation alone).
    pub fn alloc_or_heap(&self, len: usize) -> Buf {
        self.alloc(len).unwrap_or_else(|e| {
            tracing::debug!(len, error = %e, "pool allocation failed; using heap memory");
            Buf::zeroed(len)
        })
    }

    #[cold]
    #[inline(never)]
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
        let entry = ChunkEntry { start: mem.as_ptr() as usize, len, keys: reg.keys };
        shared.update_chunks(|chunks| {
            let i = chunks.partition_point(|c| c.start < entry.start);
            chunks.insert(i, entry);
        });
        Ok(Arc::new(Chunk { reg, mem, len, pooled, shared: Arc::downgrade(shared) }))
    }

    /// The keys of `bytes` if they lie entirely inside one chunk of this pool (see the module
    /// docs for why holding `bytes` then keeps that memory from being reused). Takes no lock.
    #[cfg_attr(not(any(test, feature = "rdma")), allow(dead_code))]
    pub(crate) fn keys_of(&self, bytes: &[u8]) -> Option<Keys> {
        let addr = bytes.as_ptr() as usize;
        let chunks = self.shared.snapshot.load();
        let i = chunks.partition_point(|c| c.start <= addr).checked_sub(1)?;
        let c = chunks[i];
        (addr + bytes.len() <= c.start + c.len).then_some(c.keys)
    }

    /// The keys of `buf`'s memory if it came from this pool: read from its chunk, no lookup.
    #[cfg_attr(not(any(test, feature = "rdma")), allow(dead_code))]
    pub(crate) fn keys_of_buf(&self, buf: &Buf) -> Option<Keys> {
        match &buf.storage {
            Storage::Pooled(b) if std::ptr::eq(b.chunk.shared.as_ptr(), Arc::as_ptr(&self.shared)) => {
                Some(b.chunk.reg.keys)
            }
            _ => None,
        }
    }

    /// The connection is gone: releases every idle buffer now, and every buffer in use when it
    /// is dropped (its chunk is deregistered and freed with its last buffer). Allocation still
    /// works, as one-off buffers. Idempotent.
    pub fn close(&self) {
        let shared = &self.shared;
        shared.closed.store(true, Ordering::Relaxed);
        // Pairs with the fence of a concurrent `give_back` (see the module docs).
        fence(Ordering::SeqCst);
        for class in 0..shared.free.len() {
            shared.drop_idle(class);
        }
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
            pooled_bytes: self.shared.pooled_bytes.load(Ordering::Relaxed) as u64,
        }
    }
}

/// The size class of a buffer of `len` bytes and its index: [`class_size`] and [`class_index`]
/// at once (one bit scan).
#[inline]
fn class_of(len: usize) -> (usize, usize) {
    if len <= MIN_CLASS {
        return (MIN_CLASS, 0);
    }
    let m = len - 1;
    let shift = (usize::BITS - 3 - m.leading_zeros()) as usize;
    let c = (m >> shift) + 1; // 5..=8: 8 is the next power's class 4, which the index agrees with
    (c << shift, (shift - 7) * 4 + c - 4)
}

/// The size class of a buffer of `len` bytes: `len` rounded up to `c << e` with `c` in 4..8
/// (the plain statement of what [`class_of`] computes, which tests hold it to).
#[cfg(test)]
fn class_size(len: usize) -> usize {
    if len <= MIN_CLASS {
        return MIN_CLASS;
    }
    let m = len - 1;
    let k = usize::BITS - 1 - m.leading_zeros();
    let shift = k - 2;
    ((m >> shift) + 1) << shift
}

/// The size of class `index` (the inverse of [`class_index`]).
fn class_size_of(index: usize) -> usize {
    (4 + index % 4) << (index / 4 + 7)
}

/// The length of a chunk of buffers of class `size`: 32 buffers (64 KiB to 1 MiB) of a small
/// class, one of a large one.
fn chunk_len(size: usize) -> usize {
    if size >= CHUNK_BYTES {
        size
    } else {
        (size * BLOCKS_PER_CHUNK).clamp(MIN_CHUNK, CHUNK_BYTES) / size * size
    }
}

/// The index of a class size (as returned by [`class_of`]).
#[inline]
fn class_index(size: usize) -> usize {
    let k = usize::BITS - 1 - size.leading_zeros(); // size in [2^k, 2^(k+1))
    let shift = k - 2;
    let c = size >> shift; // 4..=7
    (shift as usize - 7) * 4 + (c - 4)
}

enum Storage {
    /// A block of a pool's chunk, moved out by `Buf`'s `Drop` only (no storage swap there).
    Pooled(ManuallyDrop<Block>),
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
    #[inline]
    fn pooled(block: Block, len: usize) -> Buf {
        Buf { storage: Storage::Pooled(ManuallyDrop::new(block)), len }
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
    #[inline]
    fn drop(&mut self) {
        if let Storage::Pooled(block) = &mut self.storage {
            // SAFETY: taken once, here, as the `Buf` goes: nothing reads the storage after (the
            // drop glue of a `ManuallyDrop` does nothing).
            let block = unsafe { ManuallyDrop::take(block) };
            match block.chunk.shared.upgrade() {
                Some(shared) => shared.give_back(block),
                None => drop(block), // the pool is gone: released with its chunk
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
        // The free list is first in, first out: the block comes back after the chunk's 31
        // others.
        let again: Vec<Buf> = (0..32).map(|_| pool.alloc(2900).unwrap()).collect();
        assert!(again.iter().any(|b| b.as_ptr() == ptr), "the block was reused");
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
    fn class_indices_and_sizes_are_inverse() {
        for index in 0..=class_index(MAX_CLASS) {
            let size = class_size_of(index);
            assert_eq!(class_size(size), size, "{index}");
            assert_eq!(class_index(size), index);
        }
        assert_eq!(class_size_of(class_index(MAX_CLASS)), MAX_CLASS);
        let lens = (0..4096).chain((12..31).flat_map(|k| [(1 << k) - 1, 1 << k, (1 << k) + 1, 5 << (k - 2)]));
        for len in lens.chain((1..(1 << 22)).step_by(4099)) {
            let size = class_size(len.max(1));
            assert_eq!(class_of(len), (size, class_index(size)), "{len}");
        }
    }

    #[test]
    fn a_buffer_carries_its_chunks_keys() {
        let pool = MemPool::heap(PoolLimits::default());
        let other = MemPool::heap(PoolLimits::default());
        let a = pool.alloc(100).unwrap();
        let big = pool.alloc(2 << 20).unwrap();
        assert_eq!(pool.keys_of_buf(&a), Some(Keys { lkey: 0, rkey: 0 }));
        assert!(pool.keys_of_buf(&big).is_some());
        assert_eq!(other.keys_of_buf(&a), None, "another pool's buffer");
        assert_eq!(pool.keys_of_buf(&Buf::zeroed(100)), None, "heap memory");
        // By address: inside its chunk, not straddling past its end.
        assert!(pool.keys_of(&big[..]).is_some());
        let chunks = pool.shared.snapshot.load().len();
        assert_eq!(chunks, 2);
        drop(big); // idle (within max_idle_bytes): its chunk stays
        assert_eq!(pool.shared.snapshot.load().len(), 2);
        pool.close();
        assert_eq!(pool.shared.snapshot.load().len(), 1, "released chunks leave the map");
        drop(a);
        assert!(pool.shared.snapshot.load().is_empty());
    }

    #[test]
    fn idle_blocks_beyond_a_free_lists_capacity_are_reused_too() {
        let pool = MemPool::heap(PoolLimits::default());
        // 512-byte class: 128 blocks per chunk, a queue of 256; 600 idle at once overflow it.
        let bufs: Vec<Buf> = (0..600).map(|_| pool.alloc(100).unwrap()).collect();
        let misses = pool.counters().misses;
        assert_eq!(misses, 5, "600 blocks in chunks of 128");
        drop(bufs);
        assert!(pool.shared.free_list(0).overflowed.load(Ordering::Relaxed) > 0);
        let bufs: Vec<Buf> = (0..600).map(|_| pool.alloc(100).unwrap()).collect();
        assert_eq!(pool.counters().misses, misses, "every block came from the free list");
        let mut addrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), 600, "no block handed out twice");
        drop(bufs);
        pool.close();
        assert_eq!(pool.counters().registered_bytes, 0);
    }

    /// Writes `tag` into the first and last 16 bytes (enough to see a block handed out twice,
    /// cheap enough for 1 MiB buffers in a debug build).
    fn mark(buf: &mut [u8], tag: u8) {
        let n = buf.len().min(16);
        let len = buf.len();
        buf[..n].fill(tag);
        buf[len - n..].fill(tag);
    }

    fn marked(buf: &[u8], tag: u8) -> bool {
        let n = buf.len().min(16);
        buf[..n].iter().chain(&buf[buf.len() - n..]).all(|&b| b == tag)
    }

    /// Threads allocating and freeing at once (some buffers frozen and freed on another thread)
    /// never share a block, and every block comes back: a bounded number of rounds.
    #[test]
    fn concurrent_alloc_and_free_from_several_threads() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 2000;
        let pool = MemPool::heap(PoolLimits { max_bytes: 64 << 20, max_idle_bytes: 8 << 20 });
        let (tx, rx) = std::sync::mpsc::sync_channel::<(Bytes, u8)>(64);
        let freer = std::thread::spawn(move || {
            let mut freed = 0usize;
            while let Ok((bytes, tag)) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
                assert!(marked(&bytes, tag), "a frozen buffer changed under its owner");
                freed += 1;
            }
            freed
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let pool = pool.clone();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut held: Vec<(Buf, u8)> = Vec::new();
                    let mut sent = 0;
                    for i in 0..ROUNDS {
                        let len = [32, 700, 5000, 40_000, 1 << 20][(i + t) % 5];
                        let tag = (t * 31 + i) as u8;
                        let mut buf = pool.alloc(len).unwrap();
                        mark(&mut buf, tag);
                        held.push((buf, tag));
                        if held.len() > 8 {
                            let (buf, tag) = held.swap_remove(i % held.len());
                            assert!(marked(&buf, tag), "a block was handed out twice");
                            if i % 3 == 0 {
                                tx.send((buf.freeze(), tag)).unwrap();
                                sent += 1;
                            }
                        }
                    }
                    for (buf, tag) in held {
                        assert!(marked(&buf, tag), "a block was handed out twice");
                    }
                    sent
                })
            })
            .collect();
        drop(tx);
        let sent: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(freer.join().unwrap(), sent);
        let c = pool.counters();
        assert_eq!(c.allocs, (THREADS * ROUNDS) as u64);
        assert_eq!(c.one_off, 0, "within max_bytes");
        assert_eq!(c.pooled_bytes, c.registered_bytes, "nothing but pooled chunks");
        assert!(pool.shared.idle_large.load(Ordering::Relaxed) <= 8 << 20);
        pool.close();
        let c = pool.counters();
        assert_eq!((c.registered_bytes, c.pooled_bytes), (0, 0), "every block came back");
        assert_eq!(pool.shared.idle_large.load(Ordering::Relaxed), 0);
    }

    /// Buffers freed on other threads while the pool closes: none stays idle in it.
    #[test]
    fn a_pool_closed_while_buffers_are_freed_keeps_nothing() {
        for round in 0..20 {
            let pool = MemPool::heap(PoolLimits::default());
            let bufs: Vec<Vec<Buf>> = (0..3)
                .map(|_| {
                    (0..200)
                        .map(|i| pool.alloc(if i % 20 == 0 { 2 << 20 } else { [100, 3000][i % 2] }).unwrap())
                        .collect()
                })
                .collect();
            let start = Arc::new(std::sync::Barrier::new(4));
            let freers: Vec<_> = bufs
                .into_iter()
                .map(|mine| {
                    let start = start.clone();
                    std::thread::spawn(move || {
                        start.wait();
                        for b in mine {
                            drop(b);
                        }
                    })
                })
                .collect();
            // Closes at a different point of the frees each round.
            start.wait();
            for _ in 0..round * 500 {
                std::hint::spin_loop();
            }
            pool.close();
            for f in freers {
                f.join().unwrap();
            }
            let c = pool.counters();
            assert_eq!((c.registered_bytes, c.pooled_bytes), (0, 0), "round {round}: {c:?}");
            assert!(pool.shared.snapshot.load().is_empty());
        }
    }

    /// The interleaving the smoke test above can rarely hit, step by step: a free that checked
    /// the flag before `close` and pushed its block after `close` emptied the list.
    #[test]
    fn a_block_pushed_after_close_is_released_by_the_recheck() {
        let pool = MemPool::heap(PoolLimits::default());
        let mut buf = pool.alloc(100).unwrap();
        let Storage::Pooled(block) = std::mem::replace(&mut buf.storage, Storage::Heap(Vec::new())) else {
            unreachable!("a pool buffer")
        };
        let block = ManuallyDrop::into_inner(block);
        let class = class_index(block.size);
        pool.close();
        assert!(pool.counters().registered_bytes > 0, "the block keeps its chunk");
        pool.shared.free_list(class).push(block); // the late push
        pool.shared.recheck_closed(class);
        assert_eq!(pool.counters().registered_bytes, 0, "released, not kept idle");
        assert!(pool.shared.snapshot.load().is_empty());
    }

    /// Threads allocating new chunks (so making free lists and pushing fresh blocks) and freeing
    /// while the pool closes: nothing stays idle, whichever comes first (bounded rounds).
    #[test]
    fn a_pool_closed_while_chunks_are_made_keeps_nothing() {
        for round in 0..40 {
            let pool = MemPool::heap(PoolLimits::default());
            let start = Arc::new(std::sync::Barrier::new(3));
            let workers: Vec<_> = (0..2)
                .map(|t| {
                    let (pool, start) = (pool.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        for i in 0..60 {
                            // A different class each time: first uses race the close.
                            let len = 600 + (i * 2 + t) * 700;
                            drop(pool.alloc(len).unwrap());
                        }
                    })
                })
                .collect();
            start.wait();
            for _ in 0..round * 300 {
                std::hint::spin_loop();
            }
            pool.close();
            for w in workers {
                w.join().unwrap();
            }
            let c = pool.counters();
            assert_eq!((c.registered_bytes, c.pooled_bytes), (0, 0), "round {round}: {c:?}");
            assert_eq!(c.allocs, 120, "round {round}");
        }
    }

    /// A registrar that counts live registrations, to see that everything is released.
    struct Counting(Arc<AtomicUsize>);

    struct Live(Arc<AtomicUsize>);

    impl Drop for Live {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    impl Registrar for Counting {
        unsafe fn register(&self, _: NonNull<u8>, _: usize) -> Result<Registration, TransportError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(Registration { keys: Keys { lkey: 1, rkey: 2 }, guard: Some(Box::new(Live(self.0.clone()))) })
        }
        fn registers(&self) -> bool {
            true
        }
    }

    /// A pool dropped without `close`, with buffers idle and in use (freed on other threads
    /// afterwards): every chunk is deregistered and the pool itself freed.
    #[test]
    fn a_pool_dropped_without_close_frees_everything() {
        for round in 0..20 {
            let live = Arc::new(AtomicUsize::new(0));
            let pool = MemPool::with_registrar(Box::new(Counting(live.clone())), PoolLimits::default());
            let gone = Arc::downgrade(&pool.shared);
            let mut bufs: Vec<Buf> =
                (0..300).map(|i| pool.alloc([100, 3000, 2 << 20][i % 3]).unwrap()).collect();
            bufs.truncate(150); // half of them idle in the pool
            assert!(live.load(Ordering::Relaxed) > 0);
            let halves: Vec<Vec<Buf>> = vec![bufs.split_off(75), bufs];
            let start = Arc::new(std::sync::Barrier::new(3));
            let freers: Vec<_> = halves
                .into_iter()
                .map(|mine| {
                    let start = start.clone();
                    std::thread::spawn(move || {
                        start.wait();
                        drop(mine);
                    })
                })
                .collect();
            start.wait();
            for _ in 0..round * 200 {
                std::hint::spin_loop();
            }
            drop(pool);
            for f in freers {
                f.join().unwrap();
            }
            assert_eq!(live.load(Ordering::Relaxed), 0, "round {round}: a chunk stayed registered");
            assert_eq!(gone.strong_count(), 0, "round {round}: the pool was not freed");
        }
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

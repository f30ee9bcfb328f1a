//! Registered memory: the registrar of the connection's [`crate::MemPool`], send slabs for
//! messages from outside the pool, READ destinations and the regions this side advertises.
//!
//! # The pool first
//!
//! Receives are posted from the connection's pool and handed to the caller as they are; SENDs,
//! advertised regions and READ destinations whose bytes lie in the pool use the pool chunk's keys
//! (no registration). Memory from elsewhere is owned by the caller, who may free it at any time:
//! a registration keyed by its address would outlive it (a cache of such registrations is unsound
//! without hooks on `munmap`). So a SEND from elsewhere is copied into a send slab (or posted
//! inline); a region or READ destination from elsewhere is registered for that operation alone
//! (counted in `TransportCounters::bytes_outside_pool`).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use sideway::ibverbs::memory_region::{MemoryRegion, RegisterMemoryRegionErrorKind};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::AccessFlags;

use super::error::{registration_failed, verbs};
use crate::{Buf, TransportError};

/// The registrar of a connection's pool: chunks registered in the connection's own protection
/// domain, for local write and (with [`crate::KeyPolicy::PoolKeys`]) remote READ.
pub(crate) struct PdRegistrar {
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) remote_read: bool,
}

impl crate::pool::Registrar for PdRegistrar {
    unsafe fn register(
        &self,
        ptr: std::ptr::NonNull<u8>,
        len: usize,
    ) -> Result<crate::pool::Registration, TransportError> {
        let access = if self.remote_read {
            AccessFlags::LocalWrite | AccessFlags::RemoteRead
        } else {
            AccessFlags::LocalWrite
        };
        // SAFETY: forwarded from the caller's contract (the memory outlives the registration).
        let mr = unsafe { register_raw(&self.pd, ptr.as_ptr() as usize, len, access)? };
        let keys = crate::pool::Keys { lkey: mr.lkey(), rkey: mr.rkey() };
        Ok(crate::pool::Registration { keys, guard: Some(Box::new(mr)) })
    }

    fn registers(&self) -> bool {
        true
    }
}

/// Registers `len` bytes at `ptr`.
///
/// # Safety
///
/// `ptr..ptr+len` must stay valid (allocated, not moved) until the returned region is dropped,
/// and must not be written by Rust code while the NIC may access it.
unsafe fn register_raw(
    pd: &Arc<ProtectionDomain>,
    ptr: usize,
    len: usize,
    access: AccessFlags,
) -> Result<Arc<MemoryRegion>, TransportError> {
    // SAFETY: forwarded from the caller's contract.
    match unsafe { pd.reg_mr(ptr, len, access) } {
        Ok(mr) => Ok(mr),
        Err(e) => match e.0 {
            RegisterMemoryRegionErrorKind::Ibverbs(io) => Err(registration_failed(len, io)),
            other => Err(verbs("ibv_reg_mr", other)),
        },
    }
}

/// Heap memory registered as one memory region, owned together with its registration.
pub(crate) struct RegisteredBuf {
    // Field order: the registration is dropped (deregistered) before the memory is freed.
    mr: Arc<MemoryRegion>,
    mem: Box<[u8]>,
}

impl fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegisteredBuf({} bytes, lkey={:#x})", self.mem.len(), self.mr.lkey())
    }
}

impl RegisteredBuf {
    /// Allocates and registers `len` (at least 1) zeroed bytes for local write.
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, len: usize) -> Result<Self, TransportError> {
        let mut mem = vec![0u8; len.max(1)].into_boxed_slice();
        // SAFETY: the boxed slice's heap allocation never moves and is freed only after `mr`
        // (field order), so it stays valid for the registration's whole life.
        let mr = unsafe { register_raw(pd, mem.as_mut_ptr() as usize, mem.len(), AccessFlags::LocalWrite)? };
        Ok(RegisteredBuf { mr, mem })
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Address of byte `offset`, as the NIC sees it.
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        self.mem.as_ptr() as u64 + offset as u64
    }

    pub(crate) fn bytes_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        &mut self.mem[offset..offset + len]
    }
}

/// Fixed-size slots of one registered buffer.
pub(crate) struct SlotPool {
    buf: RegisteredBuf,
    slot_size: usize,
    free: Vec<u32>,
    slots: u32,
}

impl fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPool")
            .field("slots", &self.slots)
            .field("slot_size", &self.slot_size)
            .field("free", &self.free.len())
            .finish()
    }
}

impl SlotPool {
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        slots: u32,
        slot_size: usize,
    ) -> Result<Self, TransportError> {
        let slot_size = slot_size.max(1);
        let buf = RegisteredBuf::new(pd, slots as usize * slot_size)?;
        Ok(SlotPool { buf, slot_size, free: (0..slots).rev().collect(), slots })
    }

    pub(crate) fn alloc(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub(crate) fn release(&mut self, slot: u32) {
        debug_assert!(slot < self.slots && !self.free.contains(&slot));
        self.free.push(slot);
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.buf.lkey()
    }

    pub(crate) fn addr(&self, slot: u32) -> u64 {
        self.buf.addr(slot as usize * self.slot_size)
    }

    pub(crate) fn bytes_mut(&mut self, slot: u32, len: usize) -> &mut [u8] {
        let size = self.slot_size;
        self.buf.bytes_mut(slot as usize * size, len.min(size))
    }
}

/// A region advertised to the peer: REMOTE_READ only, alive until deregistered.
pub(crate) struct AdvertisedRegion {
    // Field order: deregister (revoke the key) before releasing the bytes.
    mr: Arc<MemoryRegion>,
    _data: Bytes,
    _placeholder: Option<Box<[u8]>>,
}

impl fmt::Debug for AdvertisedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdvertisedRegion(rkey={:#x})", self.mr.rkey())
    }
}

/// Regions of at most this many bytes must not cross a page boundary: siw (soft-iWARP, Linux
/// 6.1 and later as of this writing) sends a READ response this short from its header buffer
/// (`MAX_HDR_INLINE` in `siw_qp_tx.c`), and `siw_try_1seg` splits one that crosses a page at
/// the wrong place: the bytes after the boundary arrive shifted, with garbage in between.
/// Found by `rdma_seam`'s `reads_across_page_boundaries`.
pub(crate) const SHORT_REGION_MAX: usize = 32;

const PAGE: usize = 4096;

/// `data` itself, or, if it is short enough for siw's short path and crosses a page boundary, a
/// copy (at most [`SHORT_REGION_MAX`] bytes) placed within one page. The protocol never
/// advertises so short a region; the seam allows it.
pub(crate) fn off_page_boundary(data: Bytes) -> Bytes {
    let (len, off) = (data.len(), data.as_ptr() as usize % PAGE);
    if len > SHORT_REGION_MAX || off + len <= PAGE {
        return data;
    }
    // Twice the length always holds `len` bytes that stay within one page: either from the
    // start, or from the page boundary the allocation crosses.
    let mut copy = vec![0u8; 2 * SHORT_REGION_MAX];
    let base = copy.as_ptr() as usize % PAGE;
    let start = if base + len <= PAGE { 0 } else { PAGE - base };
    copy[start..start + len].copy_from_slice(&data);
    Bytes::from(copy).slice(start..start + len)
}

impl AdvertisedRegion {
    /// Registers `data` for remote READ. An empty `Bytes` gets a one-byte private placeholder so
    /// that it still has a real, revocable key.
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, data: Bytes) -> Result<(Self, u64), TransportError> {
        let (placeholder, ptr, len) = if data.is_empty() {
            let b = vec![0u8; 1].into_boxed_slice();
            let ptr = b.as_ptr() as usize;
            (Some(b), ptr, 1)
        } else {
            (None, data.as_ptr() as usize, data.len())
        };
        // SAFETY: the memory is owned by `_data` (or `_placeholder`), which this struct keeps
        // until after `mr` is dropped; `Bytes` is immutable, and REMOTE_READ never writes.
        let mr = unsafe { register_raw(pd, ptr, len, AccessFlags::RemoteRead)? };
        Ok((AdvertisedRegion { mr, _data: data, _placeholder: placeholder }, ptr as u64))
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

/// A READ destination: a buffer of the connection's pool (its chunk's lkey), or memory from
/// elsewhere registered for the duration of this READ.
pub(crate) struct ReadDest {
    // Field order: deregister before the buffer can be handed back.
    mr: Option<Arc<MemoryRegion>>,
    lkey: u32,
    dst: Buf,
}

impl fmt::Debug for ReadDest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReadDest({} bytes, own registration: {})", self.dst.len(), self.mr.is_some())
    }
}

impl ReadDest {
    /// Uses the pool's keys for `dst` if it is pool memory; else registers it for local write
    /// (an empty `dst` needs nothing). Returns whether a registration was made.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        pool: &crate::MemPool,
        mut dst: Buf,
    ) -> Result<(Self, bool), TransportError> {
        if dst.is_empty() {
            return Ok((ReadDest { mr: None, lkey: 0, dst }, false));
        }
        if let Some(keys) = pool.keys_of_buf(&dst) {
            return Ok((ReadDest { mr: None, lkey: keys.lkey, dst }, false));
        }
        let (ptr, len) = (dst.as_mut_ptr() as usize, dst.len());
        // SAFETY: the buffer's memory stays where it is while this struct owns it (a `Buf` never
        // reallocates), and `into_buf` drops the registration before giving it back.
        let mr = unsafe { register_raw(pd, ptr, len, AccessFlags::LocalWrite)? };
        Ok((ReadDest { lkey: mr.lkey(), mr: Some(mr), dst }, true))
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    pub(crate) fn addr(&self, offset: u64) -> u64 {
        self.dst.as_ptr() as u64 + offset
    }

    pub(crate) fn len(&self) -> u64 {
        self.dst.len() as u64
    }

    /// Deregisters (if registered for this READ) and returns the destination, and whether a
    /// deregistration happened.
    pub(crate) fn into_buf(mut self) -> (Buf, bool) {
        let deregistered = self.mr.take().is_some();
        (std::mem::replace(&mut self.dst, Buf::zeroed(0)), deregistered)
    }
}

//! Registered memory: slab pools for eager receives and sends, READ destinations, and the
//! regions this side advertises for the peer to READ.
//!
//! # Why receives and sends are copied through pools
//!
//! A [`crate::RecvBuffer`] or a SEND's `Bytes` is owned by the caller between operations, and the
//! caller may free it at any time. A registration keyed by its address would outlive the memory
//! (the pages stay pinned, a new allocation at the same address gets other pages, and the NIC
//! would write where nobody reads). So eager messages land in, or leave from, slabs of one
//! registration per pool that the connection owns, and are copied (at most the receive size,
//! 8 KiB by default) into the caller's buffer. SENDs that fit the QP's `max_inline_data` are
//! posted inline and need no slab at all.
//!
//! # READ destinations
//!
//! The destination `Vec` of a READ is registered (LOCAL_WRITE) for the duration of that READ and
//! deregistered when it completes: the NIC writes into the caller's memory directly (zero copy).
//! For the same reason as above, a cache keyed by the caller's addresses would be unsound
//! without hooks on `munmap`, which Rust's allocator does not offer; the pinned memory that *is*
//! kept across calls is the connection's own pools.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use sideway::ibverbs::memory_region::{MemoryRegion, RegisterMemoryRegionErrorKind};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::AccessFlags;

use super::error::{registration_failed, verbs};
use crate::TransportError;

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

    pub(crate) fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        &self.mem[offset..offset + len]
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

    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
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

    /// The first `len` bytes of a slot (clamped to the slot size).
    pub(crate) fn bytes(&self, slot: u32, len: usize) -> &[u8] {
        self.buf.bytes(slot as usize * self.slot_size, len.min(self.slot_size))
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

/// A READ destination registered for the duration of one READ.
pub(crate) struct ReadDest {
    // Field order: deregister before the Vec can be handed back.
    mr: Option<Arc<MemoryRegion>>,
    dst: Vec<u8>,
}

impl fmt::Debug for ReadDest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReadDest({} bytes)", self.dst.len())
    }
}

impl ReadDest {
    /// Registers `dst` for local write (an empty `dst` needs no registration).
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, mut dst: Vec<u8>) -> Result<Self, TransportError> {
        if dst.is_empty() {
            return Ok(ReadDest { mr: None, dst });
        }
        // SAFETY: the Vec's heap buffer stays where it is while this struct owns the Vec (it is
        // never resized), and `into_vec` drops the registration before giving the Vec back.
        let mr = unsafe { register_raw(pd, dst.as_mut_ptr() as usize, dst.len(), AccessFlags::LocalWrite)? };
        Ok(ReadDest { mr: Some(mr), dst })
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, |m| m.lkey())
    }

    pub(crate) fn addr(&self, offset: u64) -> u64 {
        self.dst.as_ptr() as u64 + offset
    }

    pub(crate) fn len(&self) -> u64 {
        self.dst.len() as u64
    }

    /// Deregisters and returns the destination.
    pub(crate) fn into_vec(mut self) -> Vec<u8> {
        self.mr = None;
        std::mem::take(&mut self.dst)
    }
}

//! The table of registered regions of one endpoint, and the checks that guard a READ of them.

use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;

use crate::{RKey, ReadError, RegionDesc};

/// One registered region: its bytes, kept alive while registered, and the address advertised.
#[derive(Debug)]
struct Region {
    addr: u64,
    data: Bytes,
}

/// Regions readable by the peer, by remote key.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    regions: HashMap<RKey, Region>,
}

impl RegionTable {
    /// Registers `data` under a fresh random non-zero key that no registered region uses.
    pub(crate) fn register(&mut self, data: Bytes) -> RegionDesc {
        let rkey = loop {
            let candidate: RKey = rand::random();
            if candidate != 0 && !self.regions.contains_key(&candidate) {
                break candidate;
            }
        };
        // The address is the real location of the bytes, as an RDMA NIC would advertise it.
        let addr = data.as_ptr() as u64;
        let len = data.len() as u64;
        self.regions.insert(rkey, Region { addr, data });
        RegionDesc { addr, len, rkey }
    }

    /// Revokes `rkey`; `false` if it was not registered.
    pub(crate) fn deregister(&mut self, rkey: RKey) -> bool {
        self.regions.remove(&rkey).is_some()
    }

    /// The bytes `[addr, addr + len)` of the region `rkey`, after checking key and bounds.
    /// The result shares the region's storage (no copy).
    pub(crate) fn read(&self, addr: u64, len: u64, rkey: RKey) -> Result<Bytes, ReadError> {
        let region = self.regions.get(&rkey).ok_or(ReadError::InvalidKey(rkey))?;
        let range = range_in_region(region.addr, region.data.len(), addr, len)
            .ok_or(ReadError::OutOfBounds { addr, len })?;
        Ok(region.data.slice(range))
    }
}

/// The offsets of `[addr, addr + len)` inside a region of `region_len` bytes starting at `base`,
/// or `None` if any part of it lies outside. Overflow-safe for every input.
pub(crate) fn range_in_region(base: u64, region_len: usize, addr: u64, len: u64) -> Option<Range<usize>> {
    let start = addr.checked_sub(base)?;
    let end = start.checked_add(len)?;
    if end > region_len as u64 {
        return None;
    }
    // Both fit in usize: they are at most `region_len`.
    Some(start as usize..end as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_checks_bounds_without_overflow() {
        assert_eq!(range_in_region(100, 10, 100, 10), Some(0..10));
        assert_eq!(range_in_region(100, 10, 105, 5), Some(5..10));
        assert_eq!(range_in_region(100, 10, 110, 0), Some(10..10));
        assert_eq!(range_in_region(100, 10, 99, 1), None, "below the region");
        assert_eq!(range_in_region(100, 10, 105, 6), None, "past the end");
        assert_eq!(range_in_region(100, 10, 111, 0), None, "empty range past the end");
        assert_eq!(range_in_region(0, 10, 5, u64::MAX), None, "offset + len overflows");
        assert_eq!(range_in_region(u64::MAX - 4, 4, u64::MAX, 2), None, "addr + len overflows");
        assert_eq!(range_in_region(u64::MAX - 4, 4, u64::MAX - 4, 4), Some(0..4));
    }

    #[test]
    fn read_checks_key_and_bounds_and_shares_storage() {
        let mut table = RegionTable::default();
        let data = Bytes::from_static(b"0123456789");
        let desc = table.register(data.clone());
        assert_ne!(desc.rkey, 0);
        assert_eq!(desc.addr, data.as_ptr() as u64);
        assert_eq!(desc.len, 10);

        let got = table.read(desc.addr + 2, 3, desc.rkey).unwrap();
        assert_eq!(&got[..], b"234");
        assert_eq!(got.as_ptr(), data[2..].as_ptr(), "served without a copy");

        assert_eq!(
            table.read(desc.addr, 1, desc.rkey.wrapping_add(1)),
            Err(ReadError::InvalidKey(desc.rkey.wrapping_add(1)))
        );
        assert_eq!(
            table.read(desc.addr, 11, desc.rkey),
            Err(ReadError::OutOfBounds { addr: desc.addr, len: 11 })
        );
        assert!(table.deregister(desc.rkey));
        assert!(!table.deregister(desc.rkey), "double revoke is reported");
        assert_eq!(table.read(desc.addr, 1, desc.rkey), Err(ReadError::InvalidKey(desc.rkey)));
    }

    #[test]
    fn keys_are_unique_while_registered() {
        let mut table = RegionTable::default();
        let keys: std::collections::HashSet<_> =
            (0..1000).map(|_| table.register(Bytes::from_static(b"x")).rkey).collect();
        assert_eq!(keys.len(), 1000);
        assert!(!keys.contains(&0));
    }
}

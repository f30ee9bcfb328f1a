//! A small generational slab: the key of an entry is the `wr_id` of its work request.
//!
//! Keys are `generation << 32 | index`, so a completion carrying a stale or foreign `wr_id` never
//! reaches the wrong entry (it is looked up, not trusted). Generations have 31 bits: a key never
//! has bit 63 set ([`TAG_BIT`]), which the connection uses to mark work requests that have no
//! entry (unsignaled SENDs).

/// The key bit no slab key has.
pub(crate) const TAG_BIT: u64 = 1 << 63;
const GENERATION_MASK: u32 = 0x7fff_ffff;

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Entries addressed by 64-bit keys that encode an index and a generation.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { slots: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, value: T) -> u64 {
        self.len += 1;
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, value: None });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.value = Some(value);
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    fn slot(&self, key: u64) -> Option<&Slot<T>> {
        let slot = self.slots.get((key & 0xffff_ffff) as usize)?;
        (u64::from(slot.generation) == key >> 32 && slot.value.is_some()).then_some(slot)
    }

    pub(crate) fn get(&self, key: u64) -> Option<&T> {
        self.slot(key)?.value.as_ref()
    }

    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        self.slot(key)?;
        self.slots[(key & 0xffff_ffff) as usize].value.as_mut()
    }

    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        self.slot(key)?;
        let index = (key & 0xffff_ffff) as u32;
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
        self.free.push(index);
        self.len -= 1;
        slot.value.take()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Removes every entry.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len);
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(v) = slot.value.take() {
                slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
                self.free.push(i as u32);
                out.push(v);
            }
        }
        self.len = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_never_carry_the_tag_bit() {
        let mut s = Slab::default();
        s.slots.push(Slot { generation: GENERATION_MASK, value: None });
        s.free.push(0);
        let k = s.insert(1);
        assert_eq!(k & TAG_BIT, 0);
        assert_eq!(s.remove(k), Some(1));
        let k = s.insert(2);
        assert_eq!(k >> 32, 0, "the generation wraps within 31 bits");
        assert_eq!(s.get(k), Some(&2));
    }

    #[test]
    fn stale_keys_miss() {
        let mut s = Slab::default();
        let a = s.insert("a");
        assert_eq!(s.remove(a), Some("a"));
        let b = s.insert("b");
        assert_ne!(a, b, "reused index must get a new generation");
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get_mut(b), Some(&mut "b"));
        assert_eq!(s.len(), 1);
        assert_eq!(s.drain(), vec!["b"]);
        assert!(s.is_empty());
        assert_eq!(s.remove(u64::MAX), None);
    }
}

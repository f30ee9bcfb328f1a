//! Operations posted and not yet completed, in posting order.
//!
//! Ids grow with every post and operations mostly complete in the order they were posted (a
//! SEND when the writer wrote it), so a deque sorted by id serves the usual completion, the
//! oldest, from its front in O(1) with no allocation once it has grown, where a `BTreeMap` paid
//! a node search, an insert shift and a remove shift per operation. An operation that completes
//! out of order is found by binary search and removed with a shift of the shorter side. It holds
//! exactly the operations in progress, like the map it replaces.

use std::collections::VecDeque;

use super::OpId;

#[derive(Debug)]
pub(super) struct PendingOps<T> {
    ops: VecDeque<(OpId, T)>,
}

impl<T> Default for PendingOps<T> {
    fn default() -> Self {
        PendingOps { ops: VecDeque::new() }
    }
}

impl<T> PendingOps<T> {
    /// Adds an operation; `id` must be larger than every id added before.
    pub fn push(&mut self, id: OpId, op: T) {
        debug_assert!(self.ops.back().is_none_or(|(last, _)| *last < id), "ids must grow");
        self.ops.push_back((id, op));
    }

    fn index(&self, id: OpId) -> Option<usize> {
        match self.ops.front() {
            Some((first, _)) if *first == id => Some(0),
            _ => self.ops.binary_search_by_key(&id, |(k, _)| *k).ok(),
        }
    }

    pub fn get(&self, id: OpId) -> Option<&T> {
        self.index(id).map(|i| &self.ops[i].1)
    }

    pub fn get_mut(&mut self, id: OpId) -> Option<&mut T> {
        self.index(id).map(|i| &mut self.ops[i].1)
    }

    pub fn remove(&mut self, id: OpId) -> Option<T> {
        let i = self.index(id)?;
        let entry = if i == 0 { self.ops.pop_front() } else { self.ops.remove(i) };
        entry.map(|(_, op)| op)
    }

    /// The operations in posting order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (OpId, &mut T)> {
        self.ops.iter_mut().map(|(id, op)| (*id, op))
    }

    /// Takes every operation, in posting order.
    pub fn take_all(&mut self) -> impl Iterator<Item = T> {
        std::mem::take(&mut self.ops).into_iter().map(|(_, op)| op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids<T>(p: &mut PendingOps<T>) -> Vec<OpId> {
        p.iter_mut().map(|(id, _)| id).collect()
    }

    #[test]
    fn in_order_and_out_of_order_completions_keep_posting_order() {
        let mut p = PendingOps::default();
        for id in 1..=6 {
            p.push(id, id * 10);
        }
        assert_eq!(p.remove(1), Some(10), "the oldest, from the front");
        assert_eq!(p.remove(4), Some(40), "one in the middle");
        assert_eq!(p.remove(4), None, "only once");
        assert_eq!(p.remove(99), None);
        assert_eq!(p.get(3), Some(&30));
        *p.get_mut(5).unwrap() += 1;
        p.push(7, 70);
        assert_eq!(ids(&mut p), [2, 3, 5, 6, 7]);
        assert_eq!(p.take_all().collect::<Vec<_>>(), [20, 30, 51, 60, 70]);
        assert_eq!(ids(&mut p), Vec::<OpId>::new());
        assert_eq!(p.get(2), None);
    }

    #[test]
    fn agrees_with_a_btree_map_on_random_operations() {
        use std::collections::BTreeMap;
        let mut p = PendingOps::default();
        let mut m = BTreeMap::new();
        let mut next = 1;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match seed % 4 {
                0 | 1 => {
                    p.push(next, next);
                    m.insert(next, next);
                    next += 1;
                }
                2 => {
                    let oldest = m.keys().next().copied().unwrap_or(0);
                    assert_eq!(p.remove(oldest), m.remove(&oldest));
                }
                _ => {
                    let any = (seed >> 8) % next.max(1);
                    assert_eq!(p.remove(any), m.remove(&any));
                }
            }
        }
        assert_eq!(ids(&mut p), m.keys().copied().collect::<Vec<_>>());
    }
}

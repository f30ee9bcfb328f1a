//! Deadlines of calls in progress, ordered by expiry; time is passed in by the caller.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// The earlier of two times, either of which may be absent (`None`: neither is set).
#[inline]
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// A min-heap of `(expiry, call id)`. Entries of calls that finished early stay until they reach
/// the top, where [`DeadlineQueue::next`] and [`DeadlineQueue::expired`] skip them, or until
/// [`DeadlineQueue::push_pruned`] finds the heap more than twice as large as what is live: then
/// the dead entries are dropped, so a peer's call rate times its deadlines cannot grow the heap
/// (amortized O(1) per push).
#[derive(Debug, Default)]
pub(crate) struct DeadlineQueue {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl DeadlineQueue {
    /// Adds an entry; when the heap holds more than `2 * live + 64` entries, keeps only those
    /// for which `is_live(id, at)` holds, and the one just added.
    pub fn push_pruned(&mut self, at: Instant, id: u64, live: usize, is_live: impl Fn(u64, Instant) -> bool) {
        self.heap.push(Reverse((at, id)));
        if self.heap.len() > 2 * live + 64 {
            // The entry just pushed is kept whatever `is_live` says (its owner may not be
            // registered yet).
            let new = (at, id);
            self.heap.retain(|Reverse(entry)| *entry == new || is_live(entry.1, entry.0));
        }
    }

    /// No entry held, live or not: [`DeadlineQueue::next`] would return `None`.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Entries held, live or not (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// The earliest expiry of a call for which `live(call_id, at)` holds.
    pub fn next(&mut self, live: impl Fn(u64, Instant) -> bool) -> Option<Instant> {
        while let Some(Reverse((at, id))) = self.heap.peek().copied() {
            if live(id, at) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Removes and returns the calls whose deadline is at or before `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<(u64, Instant)> {
        let mut out = Vec::new();
        while let Some(Reverse((at, id))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            self.heap.pop();
            out.push((id, at));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn entries_of_finished_calls_are_pruned_so_the_heap_stays_bounded() {
        let mut q = DeadlineQueue::default();
        let now = Instant::now();
        let mut live = std::collections::HashSet::new();
        // A million calls with an hour's deadline, each finished right after the next starts
        // (and, as in the protocol, registered as live only after its deadline is pushed).
        for id in 0..1_000_000u64 {
            if id > 0 {
                live.remove(&(id - 1));
            }
            q.push_pruned(now + Duration::from_secs(3600), id, live.len() + 1, |i, _| live.contains(&i));
            live.insert(id);
            assert!(q.len() <= 2 * live.len() + 65);
        }
        assert_eq!(q.next(|i, _| live.contains(&i)), Some(now + Duration::from_secs(3600)));
        assert_eq!(
            q.expired(now + Duration::from_secs(3600)).last().map(|e| e.0),
            Some(999_999),
            "the live one survived"
        );
    }
}

//! Deadlines of calls in progress, ordered by expiry; time is passed in by the caller.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// A min-heap of `(expiry, call id)`. Entries of calls that finished early stay until they reach
/// the top, where [`DeadlineQueue::next`] and [`DeadlineQueue::expired`] skip them.
#[derive(Debug, Default)]
pub(crate) struct DeadlineQueue {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl DeadlineQueue {
    pub fn push(&mut self, at: Instant, call_id: u64) {
        self.heap.push(Reverse((at, call_id)));
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

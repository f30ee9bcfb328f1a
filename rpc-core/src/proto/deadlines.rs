//! Deadlines of calls in progress, ordered by expiry; time is passed in by the caller.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
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

/// Expiries of calls, `(expiry, call id)`, earliest first. Entries of calls that finished early
/// stay until they come first, where [`DeadlineQueue::next`] and [`DeadlineQueue::expired`] skip
/// them, or until [`DeadlineQueue::push_pruned`] finds more than twice as many entries as what
/// is live: then the dead entries are dropped, so a peer's call rate times its deadlines cannot
/// grow the queue (amortized O(1) per push).
///
/// Calls made with the same timeout expire in the order they started, so most entries arrive in
/// order: those go to the back of a deque (O(1) to add and to take, where a heap paid O(log n) for
/// each, about 400 instructions per call at 64 calls in flight). An entry earlier than the
/// deque's last goes to a min-heap instead; the earliest entry is the earlier of the two fronts.
#[derive(Debug, Default)]
pub(crate) struct DeadlineQueue {
    /// Entries added in non-decreasing order of expiry.
    ordered: VecDeque<(Instant, u64)>,
    /// Entries that came out of order.
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The earliest expiry added since [`DeadlineQueue::take_added`] last looked.
    added: Option<Instant>,
    /// Entries noted by [`DeadlineQueue::defer`], added at the next [`DeadlineQueue::settle`].
    deferred: Vec<(Instant, u64)>,
}

impl DeadlineQueue {
    /// Adds an entry; when the queue holds more than `2 * live + 64` entries, keeps only those
    /// for which `is_live(id, at)` holds, and the one just added.
    pub fn push_pruned(&mut self, at: Instant, id: u64, live: usize, is_live: impl Fn(u64, Instant) -> bool) {
        self.added = earliest(self.added, Some(at));
        match self.ordered.back() {
            Some(&(last, _)) if last > at => self.heap.push(Reverse((at, id))),
            _ => self.ordered.push_back((at, id)),
        }
        if self.ordered.len() + self.heap.len() > 2 * live + 64 {
            // The entry just pushed is kept whatever `is_live` says (its owner may not be
            // registered yet).
            let new = (at, id);
            let keep = |entry: &(Instant, u64)| *entry == new || is_live(entry.1, entry.0);
            self.ordered.retain(keep);
            self.heap.retain(|Reverse(entry)| keep(entry));
        }
    }

    /// Drops the entry `(at, id)` of a call that ended, when it is the last or the first of the
    /// ordered entries: the call started latest (a lone call always is) or the one that expires
    /// first (calls that end in the order they started). Those are the common ends, and they
    /// leave no dead entry behind to be skipped or pruned; any other stays until then, as before.
    /// `at` is the call's deadline as its owner keeps it: a call without one has no entry.
    #[inline]
    pub fn forget(&mut self, at: Option<Instant>, id: u64) {
        let Some(at) = at else { return };
        if self.ordered.back() == Some(&(at, id)) {
            self.ordered.pop_back();
        } else if self.ordered.front() == Some(&(at, id)) {
            self.ordered.pop_front();
        }
    }

    /// Notes an entry, added to the queue at the next [`DeadlineQueue::settle`] if its call is
    /// live then. The owner settles before it looks at the queue (its next expiry, what expired,
    /// what was added), and a driver looks at its timers once the round's messages are out: a
    /// call answered in the round it arrived in (a handler that finished at once) never enters
    /// the queue, and a call's entry is added after the message that started it has left, not
    /// on the way from one message to the next. Notes are bounded like the queue: past
    /// `2 * live + 64` of them they are settled at once.
    pub fn defer(&mut self, at: Instant, id: u64, live: usize, is_live: impl Fn(u64, Instant) -> bool) {
        if self.deferred.len() >= 2 * live + 64 {
            // `id` is not noted yet (its owner may not be registered yet either).
            self.settle(live, is_live);
        }
        self.deferred.push((at, id));
    }

    /// Adds the noted entries whose call `is_live` says is still live ([`DeadlineQueue::defer`]).
    /// `live` is the number of calls live: with none (a server whose calls were all answered in
    /// the round they came in), the notes are dropped without asking about each.
    #[inline]
    pub fn settle(&mut self, live: usize, is_live: impl Fn(u64, Instant) -> bool) {
        if !self.deferred.is_empty() {
            if live == 0 {
                self.deferred.clear();
            } else {
                self.settle_deferred(live, is_live);
            }
        }
    }

    #[inline(never)] // off the look of a driver with nothing noted
    fn settle_deferred(&mut self, live: usize, is_live: impl Fn(u64, Instant) -> bool) {
        let mut deferred = std::mem::take(&mut self.deferred);
        for (at, id) in deferred.drain(..) {
            if is_live(id, at) {
                self.push_pruned(at, id, live, &is_live);
            }
        }
        // Its memory is kept for the next notes.
        self.deferred = deferred;
    }

    /// The earliest expiry added since the last look, if any was: the only way this queue's next
    /// expiry can become earlier (finished calls only make it later). A driver whose timer is
    /// armed no later need not ask for the next expiry again.
    #[inline]
    pub fn take_added(&mut self) -> Option<Instant> {
        debug_assert!(self.deferred.is_empty(), "settle before looking");
        self.added.take()
    }

    /// No entry held, live or not: [`DeadlineQueue::next`] would return `None`.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ordered.is_empty() && self.heap.is_empty()
    }

    /// Entries held, live or not (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ordered.len() + self.heap.len()
    }

    /// The earliest entry, and whether it is the deque's.
    #[inline]
    fn first(&self) -> Option<((Instant, u64), bool)> {
        match (self.ordered.front(), self.heap.peek()) {
            (Some(&a), Some(&Reverse(b))) if b < a => Some((b, false)),
            (Some(&a), _) => Some((a, true)),
            (None, Some(&Reverse(b))) => Some((b, false)),
            (None, None) => None,
        }
    }

    fn pop_first(&mut self, from_ordered: bool) {
        if from_ordered {
            self.ordered.pop_front();
        } else {
            self.heap.pop();
        }
    }

    /// The earliest expiry of a call for which `live(call_id, at)` holds.
    pub fn next(&mut self, live: impl Fn(u64, Instant) -> bool) -> Option<Instant> {
        debug_assert!(self.deferred.is_empty(), "settle before looking");
        while let Some(((at, id), from_ordered)) = self.first() {
            if live(id, at) {
                return Some(at);
            }
            self.pop_first(from_ordered);
        }
        None
    }

    /// Removes and returns the calls whose deadline is at or before `now`, earliest first.
    pub fn expired(&mut self, now: Instant) -> Vec<(u64, Instant)> {
        debug_assert!(self.deferred.is_empty(), "settle before looking");
        let mut out = Vec::new();
        while let Some(((at, id), from_ordered)) = self.first() {
            if at > now {
                break;
            }
            self.pop_first(from_ordered);
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

    #[test]
    fn calls_that_end_first_or_alone_leave_no_entry_behind() {
        let now = Instant::now();
        let at = |ms: u64| now + Duration::from_millis(ms);
        let mut q = DeadlineQueue::default();
        // Lone calls, each ended before the next starts: the queue never holds more than one
        // entry, so nothing is ever pruned or skipped.
        for id in 0..1_000u64 {
            q.push_pruned(at(1_000 + id), id, 1, |_, _| panic!("nothing to prune"));
            assert_eq!(q.len(), 1);
            q.forget(Some(at(1_000 + id)), id);
            assert!(q.is_empty());
        }
        // Calls in flight together that end in the order they started (from the front), and the
        // latest started (from the back).
        for id in 0..5u64 {
            q.push_pruned(at(10 * (id + 1)), id, 5, |_, _| true);
        }
        q.forget(Some(at(10)), 0);
        q.forget(Some(at(50)), 4);
        assert_eq!(q.len(), 3);
        // One in the middle stays until it comes first, and is skipped there as before.
        q.forget(Some(at(30)), 2);
        assert_eq!(q.len(), 3);
        // An entry with the same id but another expiry (not this call's) is not touched.
        q.forget(Some(at(25)), 1);
        assert_eq!(q.len(), 3);
        assert_eq!(q.next(|id, _| id != 2), Some(at(20)));
        assert_eq!(q.expired(at(100)).into_iter().map(|(id, _)| id).collect::<Vec<_>>(), [1, 2, 3]);
        // Entries out of order (in the heap) are left there.
        q.push_pruned(at(50), 7, 4, |_, _| true);
        q.push_pruned(at(45), 8, 4, |_, _| true);
        q.forget(Some(at(45)), 8);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn deferred_entries_enter_at_the_settle_if_their_call_is_live_and_stay_bounded_without_one() {
        let now = Instant::now();
        let at = |ms: u64| now + Duration::from_millis(ms);
        let mut q = DeadlineQueue::default();
        let mut live = std::collections::HashSet::new();
        for id in 0..4u64 {
            q.defer(at(10 * (id + 1)), id, live.len() + 1, |i, _| live.contains(&i));
            live.insert(id);
        }
        assert_eq!(q.len(), 0, "noted, not added");
        // With no call live, a settle drops the notes without asking about each.
        let mut idle = DeadlineQueue::default();
        idle.defer(at(10), 9, 1, |_, _| true);
        idle.settle(0, |_, _| panic!("no call is live"));
        assert!(idle.deferred.is_empty() && idle.is_empty() && idle.take_added().is_none());
        // Calls 0 and 2 ended before the look: they never enter.
        live.remove(&0);
        live.remove(&2);
        q.settle(live.len(), |i, _| live.contains(&i));
        assert_eq!(q.len(), 2);
        assert_eq!(q.take_added(), Some(at(20)), "the earliest of those added");
        assert_eq!(q.next(|i, _| live.contains(&i)), Some(at(20)));
        assert_eq!(q.expired(at(40)).into_iter().map(|(id, _)| id).collect::<Vec<_>>(), [1, 3]);
        // Notes never settled by their owner stay bounded by the calls live: the oldest are
        // settled (dropped when their call ended) as new ones come.
        let mut live = std::collections::HashSet::new();
        for id in 100..100_000u64 {
            live.remove(&(id - 1));
            q.defer(at(1_000), id, live.len() + 1, |i, _| live.contains(&i));
            live.insert(id);
            assert!(q.deferred.len() <= 2 * live.len() + 64 && q.len() <= 2 * live.len() + 65);
        }
        q.settle(live.len(), |i, _| live.contains(&i));
        assert_eq!(q.next(|i, _| live.contains(&i)), Some(at(1_000)));
    }

    #[test]
    fn entries_in_any_order_come_out_earliest_first() {
        let now = Instant::now();
        let at = |ms: u64| now + Duration::from_millis(ms);
        let mut q = DeadlineQueue::default();
        // In order, then earlier ones (the heap), then later ones again (the deque).
        for (i, ms) in [10, 20, 30, 5, 25, 15, 40, 30, 1].into_iter().enumerate() {
            q.push_pruned(at(ms), i as u64, 100, |_, _| true);
        }
        assert_eq!(q.len(), 9);
        // Call 3 (5 ms) finished early: skipped, and dropped on the way.
        assert_eq!(q.next(|id, _| id != 8 && id != 3), Some(at(10)));
        assert_eq!(q.len(), 7);
        let order: Vec<u64> =
            q.expired(at(30)).into_iter().map(|(_, t)| (t - now).as_millis() as u64).collect();
        assert_eq!(order, [10, 15, 20, 25, 30, 30]);
        assert_eq!(q.next(|_, _| true), Some(at(40)));
        assert_eq!(q.expired(at(100)).len(), 1);
        assert!(q.is_empty());
    }

    #[test]
    fn agrees_with_a_sorted_list_on_random_operations() {
        let now = Instant::now();
        let mut q = DeadlineQueue::default();
        let mut model: Vec<(Instant, u64)> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut clock = 0u64;
        let mut forgotten = 0;
        for id in 0..5_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Mostly in order (the same timeout), sometimes earlier or much later.
            let ms = match seed % 8 {
                0 => clock.saturating_sub(seed >> 40 & 0xff),
                1 => clock + (seed >> 40 & 0xfff),
                _ => clock + 100,
            };
            clock += seed >> 50 & 3;
            q.push_pruned(now + Duration::from_millis(ms), id, usize::MAX / 4, |_, _| true);
            model.push((now + Duration::from_millis(ms), id));
            if seed % 7 == 0 {
                // A call ends early: whether its entry goes now or stays until it is first,
                // the live entries come out the same (here every entry left counts as live).
                // The one just started, the one that expires first, or any.
                let (at, gone) = match seed >> 20 & 3 {
                    0 => *model.last().unwrap(),
                    1 => *model.iter().min().unwrap(),
                    _ => model[(seed >> 24) as usize % model.len()],
                };
                let before = q.len();
                q.forget(Some(at), gone);
                if q.len() < before {
                    model.retain(|e| *e != (at, gone));
                    forgotten += 1;
                }
            }
            if seed % 5 == 0 {
                let until = now + Duration::from_millis(clock);
                model.sort();
                let cut = model.partition_point(|(at, _)| *at <= until);
                let want: Vec<Instant> = model.drain(..cut).map(|(at, _)| at).collect();
                let got: Vec<Instant> = q.expired(until).into_iter().map(|(_, at)| at).collect();
                assert_eq!(got, want);
            }
        }
        assert_eq!(q.len(), model.len());
        // (Most entries here sit in the heap, behind the far-off ones: few are first or last.)
        assert!(forgotten >= 10, "forget took only {forgotten} entries out");
    }

    #[test]
    fn the_earliest_expiry_added_since_the_last_look_is_reported_once() {
        let now = Instant::now();
        let at = |ms: u64| now + Duration::from_millis(ms);
        let mut q = DeadlineQueue::default();
        assert_eq!(q.take_added(), None);
        for (id, ms) in [30, 10, 20].into_iter().enumerate() {
            q.push_pruned(at(ms), id as u64, 100, |_, _| true);
        }
        assert_eq!(q.take_added(), Some(at(10)), "the earliest of the three");
        assert_eq!(q.take_added(), None, "taken");
        // Entries going (expired, or skipped as finished) add nothing.
        assert_eq!(q.expired(at(15)).len(), 1);
        assert_eq!(q.next(|_, _| false), None);
        assert_eq!(q.take_added(), None);
        q.push_pruned(at(50), 3, 100, |_, _| true);
        assert_eq!(q.take_added(), Some(at(50)));
    }
}

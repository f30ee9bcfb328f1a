//! A received message handed on without freezing it: decoded straight from the receive buffer,
//! turned into [`Bytes`] only when a decoder keeps a slice of it.

use std::cell::RefCell;
use std::fmt;
use std::ops::{Bound, Deref, RangeBounds};

use bytes::Bytes;

use crate::Buf;

/// A received message (or a part of one), owned: the buffer it arrived in, as it is, or
/// [`Bytes`].
///
/// Handing a message on as `Bytes` costs an allocation per message (freezing a pool [`Buf`]
/// boxes it); most messages are decoded into values that keep nothing of them, and then the
/// buffer simply returns to its pool when this is dropped. [`Received::lend`] decodes from the
/// buffer and freezes it only if the decoder keeps a slice ([`Received::share`]).
///
/// Derefs to the message's bytes; nothing writes through it.
pub struct Received {
    repr: Repr,
}

enum Repr {
    /// `buf[start..end]`, not frozen.
    Buf {
        buf: Buf,
        start: usize,
        end: usize,
    },
    Bytes(Bytes),
}

std::thread_local! {
    /// The message [`Received::lend`] lends on this thread (`None` outside it).
    static LENT: RefCell<Option<Received>> = const { RefCell::new(None) };
}

impl Received {
    /// An empty message.
    pub const fn new() -> Received {
        Received { repr: Repr::Bytes(Bytes::new()) }
    }

    /// The bytes in `range`, consuming the message (no copy, nothing frozen). Panics if the
    /// range is out of bounds, as [`Bytes::slice`] does.
    pub fn slice(self, range: impl RangeBounds<usize>) -> Received {
        let len = self.len();
        let start = match range.start_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => n.checked_add(1).expect("range start overflows"),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&n) => n.checked_add(1).expect("range end overflows"),
            Bound::Excluded(&n) => n,
            Bound::Unbounded => len,
        };
        assert!(start <= end && end <= len, "range {start}..{end} out of bounds of {len} bytes");
        match self.repr {
            Repr::Buf { buf, start: s, .. } => {
                Received { repr: Repr::Buf { buf, start: s + start, end: s + end } }
            }
            Repr::Bytes(b) => Received { repr: Repr::Bytes(b.slice(start..end)) },
        }
    }

    /// The message as [`Bytes`] (a buffer not yet frozen is frozen now: no copy, one allocation).
    pub fn into_bytes(self) -> Bytes {
        match self.repr {
            Repr::Buf { buf, start, end } => buf.freeze().slice(start..end),
            Repr::Bytes(b) => b,
        }
    }

    /// Whether the message is [`Bytes`] already (given as such, or frozen by [`Received::share`]).
    pub fn is_bytes(&self) -> bool {
        matches!(self.repr, Repr::Bytes(_))
    }

    /// Runs `f` on the message's bytes. While `f` runs, [`Received::share`] on this thread hands
    /// out slices of the message as [`Bytes`]: the first one freezes the buffer (the only
    /// allocation), later ones share it. Returns what `f` returned and the message (as `Bytes`
    /// if a slice was taken; else as it was, so that dropping it returns its buffer to the pool).
    ///
    /// Calls may nest: an inner `lend` shares its own message until it returns.
    pub fn lend<R>(self, f: impl FnOnce(&[u8]) -> R) -> (R, Received) {
        let (ptr, len) = (self.as_ptr(), self.len());
        let previous = LENT.with(|lent| lent.replace(Some(self)));
        // Puts the previous message back, even if `f` panics; yields the lent one.
        struct Restore(Option<Option<Received>>);
        impl Restore {
            fn take_back(&mut self) -> Option<Received> {
                let previous = self.0.take()?;
                LENT.with(|lent| lent.replace(previous))
            }
        }
        impl Drop for Restore {
            fn drop(&mut self) {
                drop(self.take_back());
            }
        }
        let mut restore = Restore(Some(previous));
        // SAFETY: `ptr..ptr + len` are the bytes of the message just moved into `LENT`, and the
        // slice lives only while `f` runs (its lifetime is that of `f`'s argument). Until `f`
        // returns (or unwinds) the message stays alive: in `LENT`, or while a nested `lend` runs,
        // in that call's `Restore`, which puts it back before that call returns; it leaves `LENT`
        // only through `take_back` below, after `f`. Its bytes do not move or change meanwhile:
        // moving a `Received` moves no bytes (they are a pool block of an `Arc`'d chunk, a
        // `Vec`'s heap memory, or a `Bytes`' memory); `share` turns a `Buf` into `Bytes` with
        // `Bytes::from_owner`, which keeps the `Buf` (and so its memory) as the owner and reads
        // its bytes where they lie; and nothing writes through a `Received`.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        let out = f(bytes);
        let lent = restore.take_back().expect("the lent message is back in place");
        (out, lent)
    }

    /// Inside [`Received::lend`] on this thread: `v` as a slice of the lent message, if `v` is a
    /// non-empty part of its bytes (the first such slice freezes its buffer). `None` otherwise
    /// (outside `lend`, or bytes from elsewhere): copy them.
    pub fn share(v: &[u8]) -> Option<Bytes> {
        LENT.with(|lent| {
            let mut lent = lent.try_borrow_mut().ok()?;
            let msg = lent.as_mut()?;
            within(msg, v).then(|| msg.freeze_in_place().slice_ref(v))
        })
    }

    /// Turns the buffer into `Bytes` where it lies (no copy).
    fn freeze_in_place(&mut self) -> &Bytes {
        if let Repr::Buf { .. } = self.repr {
            let Repr::Buf { buf, start, end } = std::mem::replace(&mut self.repr, Repr::Bytes(Bytes::new()))
            else {
                unreachable!("checked above")
            };
            // `from_owner`, not `Buf::freeze`: the bytes stay where they are whatever the
            // buffer's storage (`lend` relies on it).
            self.repr = Repr::Bytes(Bytes::from_owner(buf).slice(start..end));
        }
        match &self.repr {
            Repr::Bytes(b) => b,
            Repr::Buf { .. } => unreachable!("frozen above"),
        }
    }
}

/// Whether `v` is a non-empty range of `src`'s memory.
fn within(src: &[u8], v: &[u8]) -> bool {
    let (start, end) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
    let (a, b) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
    !v.is_empty() && start <= a && b <= end
}

impl Default for Received {
    fn default() -> Received {
        Received::new()
    }
}

impl Deref for Received {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.repr {
            Repr::Buf { buf, start, end } => &buf[*start..*end],
            Repr::Bytes(b) => b,
        }
    }
}

impl AsRef<[u8]> for Received {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Bytes> for Received {
    fn from(b: Bytes) -> Received {
        Received { repr: Repr::Bytes(b) }
    }
}

impl From<Buf> for Received {
    fn from(buf: Buf) -> Received {
        let end = buf.len();
        Received { repr: Repr::Buf { buf, start: 0, end } }
    }
}

impl From<Vec<u8>> for Received {
    fn from(v: Vec<u8>) -> Received {
        Received::from(Bytes::from(v))
    }
}

impl From<&'static [u8]> for Received {
    fn from(s: &'static [u8]) -> Received {
        Received::from(Bytes::from_static(s))
    }
}

/// Equal when the bytes are.
impl PartialEq for Received {
    fn eq(&self, other: &Received) -> bool {
        **self == **other
    }
}

impl Eq for Received {}

impl PartialEq<[u8]> for Received {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Bytes> for Received {
    fn eq(&self, other: &Bytes) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Received {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Received").field("len", &self.len()).field("bytes", &self.is_bytes()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemPool, PoolLimits};

    fn message(pool: &MemPool) -> Received {
        let mut buf = pool.alloc(64).unwrap();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = i as u8;
        }
        Received::from(buf).slice(8..)
    }

    #[test]
    fn a_decoder_that_keeps_nothing_leaves_the_buffer_unfrozen() {
        let pool = MemPool::heap(PoolLimits::default());
        let msg = message(&pool);
        assert_eq!(msg[0], 8);
        let (sum, back) = msg.lend(|b| b.iter().map(|&x| u64::from(x)).sum::<u64>());
        assert_eq!(sum, (8..64).sum::<u64>());
        assert!(!back.is_bytes(), "nothing shared: still the buffer");
        assert_eq!(Received::share(&back[..4]), None, "outside lend: nothing is shared");
    }

    #[test]
    fn the_first_slice_freezes_the_buffer_where_it_lies() {
        let pool = MemPool::heap(PoolLimits::default());
        let msg = message(&pool);
        let ptr = msg.as_ptr();
        let ((a, b, foreign), back) = msg.lend(|bytes| {
            let a = Received::share(&bytes[2..6]).expect("inside the message");
            let b = Received::share(&bytes[10..12]).expect("a second slice");
            // Still readable after the freeze, and the same memory.
            assert_eq!(bytes[2], 10);
            assert_eq!(a.as_ptr(), bytes[2..].as_ptr());
            (a, b, Received::share(&[1, 2, 3]))
        });
        assert_eq!(&a[..], &[10, 11, 12, 13]);
        assert_eq!(&b[..], &[18, 19]);
        assert_eq!(foreign, None, "bytes from elsewhere are not shared");
        assert!(back.is_bytes());
        let frozen = back.into_bytes();
        assert_eq!((frozen.as_ptr(), frozen.len()), (ptr, 56), "frozen without a copy");
        assert!(pool.contains(&a));
    }

    #[test]
    fn nested_loans_share_their_own_message_and_restore_the_outer_one() {
        let pool = MemPool::heap(PoolLimits::default());
        let outer = message(&pool);
        let inner = Received::from(Bytes::from_static(b"inner message"));
        let ((from_inner, from_outer), back) = outer.lend(|o| {
            let (from_inner, _) = inner.lend(|i| {
                assert_eq!(Received::share(&o[..2]), None, "the outer message is not lent here");
                Received::share(&i[..5])
            });
            (from_inner, Received::share(&o[..2]))
        });
        assert_eq!(from_inner.as_deref(), Some(&b"inner"[..]));
        assert_eq!(from_outer.as_deref(), Some(&[8u8, 9][..]));
        assert!(back.is_bytes());
    }

    #[test]
    fn a_panicking_decoder_leaves_nothing_lent() {
        let pool = MemPool::heap(PoolLimits::default());
        let msg = message(&pool);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            msg.lend(|_| panic!("decoder failed"));
        }));
        assert!(caught.is_err());
        assert!(LENT.with(|l| l.borrow().is_none()));
        assert_eq!(pool.counters().registered_bytes, pool.counters().pooled_bytes);
    }

    #[test]
    fn slices_and_conversions() {
        let pool = MemPool::heap(PoolLimits::default());
        let msg = message(&pool).slice(1..=3);
        assert_eq!(&msg[..], &[9, 10, 11]);
        assert_eq!(msg, Received::from(vec![9u8, 10, 11]));
        assert_eq!(msg.into_bytes(), Bytes::from_static(&[9, 10, 11]));
        let b = Received::from(Bytes::from_static(b"abcdef")).slice(2..);
        assert!(b.is_bytes());
        assert_eq!(b, Bytes::from_static(b"cdef"));
        assert!(Received::new().is_empty());
    }
}

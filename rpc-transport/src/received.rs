//! A received message handed on without freezing it: decoded straight from the receive buffer,
//! turned into [`Bytes`] only when a decoder keeps a slice of it.

use std::cell::Cell;
use std::fmt;
use std::ops::{Bound, Deref, RangeBounds};

use bytes::{Buf as _, Bytes};

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
    /// The message's bytes: `len` bytes at `ptr`, inside the memory `owner` holds.
    ptr: *const u8,
    len: usize,
    owner: Owner,
}

/// What keeps a message's memory alive.
enum Owner {
    /// Not frozen (the message may be a part of it).
    Buf(Buf),
    Bytes(Bytes),
}

// SAFETY: `ptr` points into memory that `owner` (a `Buf` or `Bytes`, both `Send` and `Sync`)
// keeps alive and that nothing writes while the `Received` exists; the pointer is only read.
unsafe impl Send for Received {}
// SAFETY: as above; a shared `Received` only reads its bytes.
unsafe impl Sync for Received {}

std::thread_local! {
    /// The message [`Received::lend`] lends on this thread (null outside it): a local of that
    /// call's frame.
    static LENT: Cell<*mut Received> = const { Cell::new(std::ptr::null_mut()) };
}

impl Received {
    /// An empty message.
    pub fn new() -> Received {
        Received::from(Bytes::new())
    }

    fn with_owner(owner: Owner) -> Received {
        let (ptr, len) = match &owner {
            Owner::Buf(buf) => (buf.as_ptr(), buf.len()),
            Owner::Bytes(b) => (b.as_ptr(), b.len()),
        };
        Received { ptr, len, owner }
    }

    /// The bytes in `range`, consuming the message (no copy, nothing frozen). Panics if the
    /// range is out of bounds, as [`Bytes::slice`] does.
    pub fn slice(mut self, range: impl RangeBounds<usize>) -> Received {
        let len = self.len;
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
        // Still inside the owner's memory: a part of the range checked above.
        self.ptr = self.ptr.wrapping_add(start);
        self.len = end - start;
        if let Owner::Bytes(b) = &mut self.owner {
            // `Bytes` are narrowed too (no reference count taken), so that `into_bytes` returns
            // them as they are.
            let offset = self.ptr as usize - b.as_ptr() as usize;
            b.truncate(offset + self.len);
            b.advance(offset);
        }
        self
    }

    /// The message as [`Bytes`] (a buffer not yet frozen is frozen now: no copy, one allocation).
    pub fn into_bytes(self) -> Bytes {
        let at = self.ptr as usize;
        let len = self.len;
        match self.owner {
            Owner::Buf(buf) => {
                let offset = at - buf.as_ptr() as usize;
                buf.freeze().slice(offset..offset + len)
            }
            Owner::Bytes(b) => {
                let offset = at - b.as_ptr() as usize;
                if offset == 0 && len == b.len() {
                    b
                } else {
                    b.slice(offset..offset + len)
                }
            }
        }
    }

    /// Whether the message is [`Bytes`] already (given as such, or frozen by [`Received::share`]).
    pub fn is_bytes(&self) -> bool {
        matches!(self.owner, Owner::Bytes(_))
    }

    /// Runs `f` on the message's bytes. While `f` runs, [`Received::share`] on this thread hands
    /// out slices of the message as [`Bytes`]: the first one freezes the buffer (the only
    /// allocation), later ones share it. Returns what `f` returned and the message (as `Bytes`
    /// if a slice was taken; else as it was, so that dropping it returns its buffer to the pool).
    ///
    /// Calls may nest: an inner `lend` shares its own message until it returns.
    pub fn lend<R>(mut self, f: impl FnOnce(&[u8]) -> R) -> (R, Received) {
        let out = self.lend_in_place(f);
        (out, self)
    }

    /// [`Received::lend`], the message staying where it is (no move in and out: a decoder's
    /// result and the message are not carried back together).
    pub fn lend_in_place<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> R {
        // Puts the previous loan back when `f` returns or unwinds.
        struct Restore(*mut Received);
        impl Drop for Restore {
            fn drop(&mut self) {
                LENT.with(|lent| lent.set(self.0));
            }
        }
        // SAFETY: the message's bytes (see `deref`), for as long as `f` runs only (the slice's
        // lifetime is that of `f`'s argument): `*self` stays where it is until then (borrowed by
        // this call), and `share` (the only code that reaches it meanwhile, through `LENT`)
        // changes only its owner, from the `Buf` to `Bytes::from_owner` of that `Buf`, which
        // keeps the memory where it is.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        let this: *mut Received = self;
        let restore = Restore(LENT.with(|lent| lent.replace(this)));
        let out = f(bytes);
        drop(restore);
        out
    }

    /// Inside [`Received::lend`] on this thread: `v` as a slice of the lent message, if `v` is a
    /// non-empty part of its bytes (the first such slice freezes its buffer). `None` otherwise
    /// (outside `lend`, or bytes from elsewhere): copy them.
    pub fn share(v: &[u8]) -> Option<Bytes> {
        with_lent(|msg| within(msg, v).then(|| msg.freeze_in_place().slice_ref(v)))
    }

    /// [`Received::share`], but only from a lent message that is [`Bytes`] already (nothing is
    /// frozen) and at most `max_len` bytes long: a reference count instead of a copy. Such a
    /// message is a copy made as it arrived, or bytes the caller had: a slice of it holds no
    /// receive buffer that the message did not hold already. `None` otherwise.
    pub fn share_if_small_bytes(v: &[u8], max_len: usize) -> Option<Bytes> {
        with_lent(|msg| match &msg.owner {
            Owner::Bytes(b) if msg.len <= max_len && within(msg, v) => Some(b.slice_ref(v)),
            _ => None,
        })
    }

    /// Turns the buffer into `Bytes` where it lies (no copy: `ptr` stays valid).
    fn freeze_in_place(&mut self) -> &Bytes {
        if let Owner::Buf(_) = self.owner {
            let Owner::Buf(buf) = std::mem::replace(&mut self.owner, Owner::Bytes(Bytes::new())) else {
                unreachable!("checked above")
            };
            let offset = self.ptr as usize - buf.as_ptr() as usize;
            // `from_owner`, not `Buf::freeze`: the bytes stay where they are whatever the
            // buffer's storage (`ptr`, and `lend`'s slice, rely on it). Narrowed to the message
            // in place (no reference count taken), so that `into_bytes` returns it as it is.
            let mut frozen = Bytes::from_owner(buf);
            frozen.advance(offset);
            frozen.truncate(self.len);
            self.owner = Owner::Bytes(frozen);
        }
        match &self.owner {
            Owner::Bytes(b) => b,
            Owner::Buf(_) => unreachable!("frozen above"),
        }
    }
}

/// `f` on the message of the innermost [`Received::lend`] running on this thread; `None` outside
/// one.
fn with_lent<R>(f: impl FnOnce(&mut Received) -> Option<R>) -> Option<R> {
    let lent = LENT.with(Cell::get);
    if lent.is_null() {
        return None;
    }
    // SAFETY: a non-null `LENT` points to the message of the innermost `lend` running on this
    // thread, alive in that call's frame, which does not touch it until its `f` returns (and
    // `LENT` is reset before it does); nothing else holds a reference to it (the decoder holds
    // only a slice of its bytes, which `Received::share` leaves where they are).
    f(unsafe { &mut *lent })
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
        // SAFETY: `ptr..ptr + len` lies inside the memory `owner` keeps alive (a `Buf`'s first
        // `len()` bytes, or a `Bytes`' bytes, narrowed only by `slice`), which does not move when
        // the `Received` moves or its `Buf` is frozen into `Bytes` (`from_owner` keeps it in
        // place), and which nothing writes while the `Received` exists.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsRef<[u8]> for Received {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Bytes> for Received {
    fn from(b: Bytes) -> Received {
        Received::with_owner(Owner::Bytes(b))
    }
}

impl From<Buf> for Received {
    fn from(buf: Buf) -> Received {
        Received::with_owner(Owner::Buf(buf))
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
        assert!(LENT.with(Cell::get).is_null());
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

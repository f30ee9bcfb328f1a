//! Small byte strings carved from a shared block, so that a small frame or payload costs no
//! allocation of its own: each one is a [`Bytes`] slice of the block (a reference count, no
//! copy), and the block is reused in place once every slice of it has dropped, or replaced by a
//! fresh one when some are still held.
//!
//! Used where a message is small enough that copying it costs less than giving it a buffer of
//! its own: frames of at most [`SMALL`] bytes are assembled here when there is no pool (a frame
//! the transport copies anyway goes as its header and body side by side instead, assembled by
//! nobody: `SendBuf::Headed`), received ones are copied here so that their
//! receive buffer is re-posted as it is, small payloads are encoded here, and small `Bytes`
//! values are decoded here (`codec::SharedBytes`).
//!
//! Memory: [`BLOCK`] bytes per arena, plus blocks still held by slices (a slice kept alive keeps
//! its whole block: at most [`BLOCK`] bytes per slice, less than the receive buffer a received
//! message would otherwise keep).

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};

/// Largest byte string taken from an arena; larger ones get buffers of their own.
pub(crate) const SMALL: usize = 1024;
/// Bytes per block.
pub(crate) const BLOCK: usize = 16 << 10;

/// A block being carved into small byte strings.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    block: BytesMut,
}

impl Arena {
    /// `len` bytes written by `fill` (which gets them zeroed), as a slice of the block.
    pub(crate) fn write<E>(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Bytes, E> {
        self.room(len);
        self.block.resize(len, 0);
        match fill(&mut self.block) {
            Ok(()) => Ok(self.block.split().freeze()),
            Err(e) => {
                self.block.clear();
                Err(e)
            }
        }
    }

    /// The concatenation of `parts`, as a slice of the block.
    pub(crate) fn copy(&mut self, parts: &[&[u8]]) -> Bytes {
        self.room(parts.iter().map(|p| p.len()).sum());
        for part in parts {
            self.block.extend_from_slice(part);
        }
        self.block.split().freeze()
    }

    /// Makes room for `len` more bytes: the rest of the block, the block again if no slice of
    /// it is alive, or a new block.
    fn room(&mut self, len: usize) {
        if self.block.capacity() < len {
            self.block.reserve(len.max(BLOCK));
        }
    }
}

thread_local! {
    /// The arena of this thread, for code that owns none (encoding on the caller's task).
    static LOCAL: RefCell<Arena> = RefCell::new(Arena::default());
}

/// [`Arena::write`] on this thread's arena.
pub(crate) fn write_local<E>(len: usize, fill: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<Bytes, E> {
    LOCAL.with(|a| match a.try_borrow_mut() {
        Ok(mut arena) => arena.write(len, fill),
        // Re-entered from inside `fill` (an encoder that encodes): a buffer of its own.
        Err(_) => {
            let mut buf = vec![0u8; len];
            fill(&mut buf)?;
            Ok(Bytes::from(buf))
        }
    })
}

/// [`Arena::copy`] of one byte string on this thread's arena.
pub(crate) fn copy_local(bytes: &[u8]) -> Bytes {
    LOCAL.with(|a| match a.try_borrow_mut() {
        Ok(mut arena) => arena.copy(&[bytes]),
        Err(_) => Bytes::copy_from_slice(bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_one_block_and_keep_their_bytes() {
        let mut arena = Arena::default();
        let a = arena.copy(&[b"hello", b" ", b"world"]);
        let b = arena.write::<()>(4, |buf| {
            buf.copy_from_slice(b"abcd");
            Ok(())
        });
        let b = b.unwrap();
        assert_eq!(&a[..], b"hello world");
        assert_eq!(&b[..], b"abcd");
        assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + a.len(), "carved from the same block");
        // A failed fill leaves nothing behind.
        assert_eq!(arena.write(3, |_| Err("no")), Err("no"));
        let c = arena.copy(&[b"x"]);
        assert_eq!(c.as_ptr() as usize, b.as_ptr() as usize + b.len());
    }

    #[test]
    fn a_block_is_reused_once_its_slices_drop() {
        let mut arena = Arena::default();
        let start = arena.copy(&[&[1u8; 600]]).as_ptr() as usize;
        let reused = (0..3 * BLOCK / 600).any(|_| arena.copy(&[&[2u8; 600]]).as_ptr() as usize == start);
        assert!(reused, "the block was reused in place once full");
    }

    #[test]
    fn a_held_slice_is_never_overwritten() {
        let mut arena = Arena::default();
        let held = arena.copy(&[&[7u8; 600]]);
        let range = held.as_ptr() as usize..held.as_ptr() as usize + held.len();
        for i in 0..3 * BLOCK / 600 {
            let s = arena.copy(&[&[i as u8; 600]]);
            let at = s.as_ptr() as usize;
            assert!(at + s.len() <= range.start || at >= range.end, "slice {i} overlaps the held one");
        }
        assert_eq!(&held[..], &[7u8; 600][..], "the held slice is intact");
    }
}

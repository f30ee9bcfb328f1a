//! [`take_each`]: a `Vec` emptied item by item without a `Drain`, for the short batches of the
//! hot path (completions, receive buffers and SENDs of one poll: one or two items, where the
//! `Drain`'s setup and `Drop` cost more than the loop).

use std::ptr;

/// Moves each item of `items` out, in order, into `f`, and leaves `items` empty with its
/// capacity kept (as `for item in items.drain(..)` would). Stops at the first error `f`
/// returns and returns it: the items after it are dropped, as they are if `f` panics.
#[inline]
pub fn take_each<T, E>(items: &mut Vec<T>, mut f: impl FnMut(T) -> Result<(), E>) -> Result<(), E> {
    /// The items not yet taken: `items[next..len]`, dropped with this guard.
    struct Rest<'a, T> {
        items: &'a mut Vec<T>,
        next: usize,
        len: usize,
    }

    impl<T> Drop for Rest<'_, T> {
        #[inline]
        fn drop(&mut self) {
            let rest = self.len - self.next;
            if rest > 0 {
                // SAFETY: `items[next..len]` are initialized and were not moved out (`next`
                // counts those that were); the vector's length is 0, so it never touches them
                // again and each is dropped exactly once, here.
                unsafe {
                    let first = self.items.as_mut_ptr().add(self.next);
                    ptr::drop_in_place(ptr::slice_from_raw_parts_mut(first, rest));
                }
            }
        }
    }

    let len = items.len();
    // SAFETY: 0 is within capacity and there is nothing to initialize; the `len` items stay
    // in the buffer, owned by `Rest` from now on (moved out or dropped by it).
    unsafe { items.set_len(0) };
    let mut rest = Rest { items, next: 0, len };
    while rest.next < rest.len {
        // SAFETY: `next < len`: the item is initialized and not yet moved out; `next` moves
        // past it before `f` runs, so it is read exactly once (and not dropped by `Rest`).
        let item = unsafe { ptr::read(rest.items.as_ptr().add(rest.next)) };
        rest.next += 1;
        f(item)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn items_come_in_order_and_the_capacity_stays() {
        let mut items = Vec::with_capacity(8);
        items.extend([1, 2, 3]);
        let mut seen = Vec::new();
        take_each(&mut items, |i| {
            seen.push(i);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(seen, [1, 2, 3]);
        assert!(items.is_empty());
        assert_eq!(items.capacity(), 8);
    }

    #[test]
    fn an_error_stops_and_the_rest_is_dropped_as_on_a_panic() {
        let held = Arc::new(());
        let mut items = vec![held.clone(), held.clone(), held.clone()];
        let mut taken = 0;
        let result = take_each(&mut items, |_| {
            taken += 1;
            if taken == 2 {
                return Err("stop");
            }
            Ok(())
        });
        assert_eq!(result, Err("stop"));
        assert!(items.is_empty());
        assert_eq!(Arc::strong_count(&held), 1, "every item dropped once");

        let mut items = vec![held.clone(), held.clone(), held.clone()];
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            take_each(&mut items, |_| -> Result<(), ()> {
                panic!("a panicking callback (expected by this test)")
            })
        }));
        assert!(panicked.is_err());
        assert!(items.is_empty());
        assert_eq!(Arc::strong_count(&held), 1, "the rest dropped while unwinding");
    }
}

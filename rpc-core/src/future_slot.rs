//! Where a service puts the future of a call: a box its connection lends it, reused from call
//! to call ([`FutureSlot`]), so that a handler whose future has the layout of an earlier one
//! allocates nothing.
//!
//! The box holds the service's future, its panics caught; the call's context and the
//! connection's pool are kept beside it and made current around each of its polls
//! ([`context::enter`]). When the handler finishes, what the future kept is dropped at once and
//! the empty box goes back to the connection; the next future of the same size and alignment is
//! written into it. The call's context and the pool come back with the box
//! ([`HandlerBoxes::give_back`]), for the next call (no reference count taken and dropped per
//! call). A handler that waits takes its box into its task and sends it back with its answer.
//!
//! A connection keeps the boxes and contexts of as many handlers as ran at once (handlers in
//! tasks of their own, many calls in flight: each holds its box and context until it
//! finishes), up to [`SPARE_BYTES`], so that the next burst allocates nothing either.

use std::alloc::Layout;
use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};

use std::pin::Pin;

use bytes::Bytes;
use rpc_transport::MemPool;
use tokio_util::sync::ReusableBoxFuture;

use crate::context;
use crate::error::ServiceError;

/// What a handler ends with: the service's answer, or the payload of its panic.
pub(crate) type Caught = Result<Result<Bytes, ServiceError>, Box<dyn Any + Send>>;

/// Empty boxes a connection keeps whatever their size: enough for a service whose methods'
/// futures have a few different layouts, called in turn. A box is as large as the future made
/// in it (a few hundred bytes for most handlers).
const SPARE_BOXES: usize = 4;

/// What a connection keeps of its finished handlers' boxes and contexts, in bytes (a box
/// counts its future's size, a context [`context::Context::KEPT_BYTES`], one of them not
/// counted): with handlers of a few hundred bytes, those of 64 or more handlers that ran at
/// once. The oldest go first, but never below [`SPARE_BOXES`] boxes and one context, whatever
/// their size.
pub(crate) const SPARE_BYTES: usize = 32 << 10;

/// Where a service puts the future of one call ([`Service::call_in`](crate::Service::call_in)):
/// a box the connection lends, reused when the future has the layout of an earlier call's.
/// Put one future in it with [`FutureSlot::put`].
pub struct FutureSlot<'a> {
    boxes: &'a mut HandlerBoxes,
    ctx: context::Context,
    pool: MemPool,
}

impl fmt::Debug for FutureSlot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FutureSlot").field("method", &self.ctx.method()).finish_non_exhaustive()
    }
}

impl FutureSlot<'_> {
    /// Puts the call's future in this slot: in one of the connection's empty boxes if one has
    /// its layout, else in a new box (kept for later calls when the handler finishes). The
    /// server polls it with the call's [`Context`](crate::Context) as
    /// [`context::current()`](crate::context::current) and catches its panics (answered as a
    /// `Handler` error).
    #[inline(always)]
    pub fn put<F>(self, future: F) -> ServiceFuture
    where
        F: Future<Output = Result<Bytes, ServiceError>> + Send + 'static,
    {
        let FutureSlot { boxes, ctx, pool } = self;
        boxes.place(Run { future: Some(future) }, ctx.with_pool(pool))
    }
}

pin_project_lite::pin_project! {
    /// A handler as the server runs it: the service's future, its panics caught. What it holds
    /// is dropped as soon as it finishes (a panic included), not when its box is next used.
    struct Run<F> {
        #[pin]
        future: Option<F>,
    }
}

impl<F: Future<Output = Result<Bytes, ServiceError>>> Future for Run<F> {
    type Output = Caught;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Caught> {
        let mut this = self.project();
        // Not polled again once ended (`ServiceFuture::poll` sees to it).
        let Some(mut future) = this.future.as_mut().as_pin_mut() else { return Poll::Pending };
        let caught = match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(answer)) => Ok(answer),
            Err(panic) => Err(panic),
        };
        // Dropped while the handler's context is still current (`ServiceFuture::poll`).
        this.future.set(None);
        Poll::Ready(caught)
    }
}

/// A call's future in the box a [`FutureSlot`] lent: what
/// [`Service::call_in`](crate::Service::call_in) returns, for the server to run.
pub struct ServiceFuture {
    /// `None` only once given back, or while dropped ([`ServiceFuture`]'s `Drop`).
    boxed: Option<ReusableBoxFuture<'static, Caught>>,
    /// The layout of the future written in the box (the box's size and alignment).
    layout: Layout,
    /// Whether the future finished (its box then holds nothing of it).
    done: bool,
    /// The context and pool the handler runs with, current around each of its polls (`None`
    /// once it panicked: they went with it).
    handler: Option<context::Handler>,
}

impl fmt::Debug for ServiceFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceFuture").field("layout", &self.layout).field("done", &self.done).finish()
    }
}

impl ServiceFuture {
    /// Polls the handler (not again once it has finished).
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Caught> {
        let (false, Some(boxed)) = (self.done, self.boxed.as_mut()) else { return Poll::Pending };
        let caught = std::task::ready!(context::enter(&mut self.handler, || boxed.poll(cx)));
        self.done = true;
        if caught.is_err() {
            // A handler that panicked keeps nothing for the next: its context and pool go.
            self.handler = None;
        }
        Poll::Ready(caught)
    }
}

impl Drop for ServiceFuture {
    /// A handler dropped before it finished (cancelled, or its connection gone) is dropped with
    /// its context current, as while it ran.
    fn drop(&mut self) {
        if !self.done {
            if let Some(boxed) = self.boxed.take() {
                context::enter(&mut self.handler, || drop(boxed));
            }
        }
    }
}

/// A connection's empty handler boxes, each with the layout of the future it was made for,
/// the contexts (and the pool) its finished handlers ran with, and how many boxes were made.
/// Bounded by [`SPARE_BOXES`] and [`SPARE_BYTES`]; the least recently given back go first.
#[derive(Debug, Default)]
pub(crate) struct HandlerBoxes {
    spares: Vec<(Layout, ReusableBoxFuture<'static, Caught>)>,
    /// A context and pool kept as its handler left it (its metadata is replaced by the next
    /// call's): the one a lone call, or an inline handler, reuses. Not counted in `kept_bytes`.
    context: Option<(context::Context, MemPool)>,
    /// More of them, emptied of their calls' metadata (the last given back at the end).
    contexts: Vec<(context::Context, MemPool)>,
    /// What `spares` and `contexts` count against [`SPARE_BYTES`].
    kept_bytes: usize,
    made: u64,
}

impl HandlerBoxes {
    /// The slot one call's future goes in, run with `ctx` and `pool`.
    pub(crate) fn slot(&mut self, ctx: context::Context, pool: MemPool) -> FutureSlot<'_> {
        FutureSlot { boxes: self, ctx, pool }
    }

    /// The context and pool of a finished handler, for the next call's (see
    /// [`context::Context::new_in`]); `None` when none is kept.
    #[inline]
    pub(crate) fn take_context(&mut self) -> Option<(context::Context, MemPool)> {
        if let Some(kept) = self.context.take() {
            return Some(kept);
        }
        let kept = self.contexts.pop()?;
        self.kept_bytes -= context::Context::KEPT_BYTES;
        Some(kept)
    }

    /// Boxes made so far (each allocated once; the others were reused).
    pub(crate) fn made(&self) -> u64 {
        self.made
    }

    /// `future` in an empty box of its layout, or in a new one, to run with `handler`.
    #[inline(always)]
    fn place<F>(&mut self, future: F, handler: context::Handler) -> ServiceFuture
    where
        F: Future<Output = Caught> + Send + 'static,
    {
        let handler = Some(handler);
        let layout = Layout::new::<F>();
        let mut future = future;
        // The layout is checked here: a `try_set` that fails frees the box it is called on. The
        // latest given back first (the end of the list: nothing after it moves).
        if let Some(i) = self.spares.iter().rposition(|(l, _)| *l == layout) {
            let (_, mut boxed) = self.spares.remove(i);
            self.kept_bytes -= layout.size();
            match boxed.try_set(future) {
                Ok(()) => return ServiceFuture { boxed: Some(boxed), layout, done: false, handler },
                // Not with the layout checked above; boxed anew below.
                Err(back) => future = back,
            }
        }
        self.made += 1;
        ServiceFuture { boxed: Some(ReusableBoxFuture::new(future)), layout, done: false, handler }
    }

    /// Keeps the box of a finished handler for a later one (one that has not finished is
    /// dropped: its box still holds it), and the context and pool it ran with (not after a
    /// panic: they went with it). Beyond the bounds the oldest go.
    pub(crate) fn give_back(&mut self, mut fut: ServiceFuture) {
        if !fut.done {
            return;
        }
        if let Some(boxed) = fut.boxed.take() {
            self.spares.push((fut.layout, boxed));
            self.kept_bytes += fut.layout.size();
        }
        if let Some((ctx, pool)) = fut.handler.take().map(context::Handler::into_parts) {
            if self.context.is_none() {
                self.context = Some((ctx, pool));
            } else if let Some(ctx) = ctx.recycled() {
                self.contexts.push((ctx, pool));
                self.kept_bytes += context::Context::KEPT_BYTES;
            }
        }
        // They come back in pairs: a context goes first while there are no fewer of them than
        // boxes, or once the boxes are down to the few always kept.
        while self.kept_bytes > SPARE_BYTES {
            let spares = self.spares.len();
            if !self.contexts.is_empty() && (self.contexts.len() >= spares || spares <= SPARE_BOXES) {
                self.contexts.remove(0);
                self.kept_bytes -= context::Context::KEPT_BYTES;
            } else if spares > SPARE_BOXES {
                let (layout, _) = self.spares.remove(0);
                self.kept_bytes -= layout.size();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn ctx() -> context::Context {
        ctx_named("T.m")
    }

    fn ctx_named(method: &'static str) -> context::Context {
        context::Context::new_in(None, method, 1, 1, &Arc::from("peer"), None, context::Metadata::new())
    }

    fn pool() -> MemPool {
        MemPool::heap(rpc_transport::PoolLimits::default())
    }

    fn run(fut: &mut ServiceFuture) -> Caught {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        match fut.poll(&mut cx) {
            Poll::Ready(caught) => caught,
            Poll::Pending => panic!("a ready future is pending"),
        }
    }

    #[test]
    fn a_finished_handler_box_is_reused_by_a_future_of_its_layout_only() {
        let mut boxes = HandlerBoxes::default();
        let small = |n: u64| async move { Ok(Bytes::from(n.to_le_bytes().to_vec())) };
        let large = |n: [u64; 16]| async move { Ok(Bytes::from(n[0].to_le_bytes().to_vec())) };
        let mut fut = boxes.slot(ctx(), pool()).put(small(1));
        assert_eq!(run(&mut fut).unwrap().unwrap(), Bytes::from(1u64.to_le_bytes().to_vec()));
        boxes.give_back(fut);
        assert_eq!(boxes.made(), 1);
        for round in 0..10u64 {
            let mut a = boxes.slot(ctx(), pool()).put(small(round));
            assert!(run(&mut a).is_ok());
            boxes.give_back(a);
            let mut b = boxes.slot(ctx(), pool()).put(large([round; 16]));
            assert!(run(&mut b).is_ok());
            boxes.give_back(b);
        }
        assert_eq!(boxes.made(), 2, "one box per layout, then reused");
        assert_eq!(boxes.spares.len(), 2);
    }

    /// A future of `N` bytes (and a few more) that finishes at once.
    fn sized<const N: usize>() -> impl Future<Output = Result<Bytes, ServiceError>> + Send {
        let pad = [0u8; N];
        async move { Ok(Bytes::from(pad.len().to_string())) }
    }

    #[test]
    fn an_unfinished_handler_box_is_not_kept_and_large_spares_are_bounded() {
        let mut boxes = HandlerBoxes::default();
        let pending = boxes.slot(ctx(), pool()).put(futures::future::pending());
        boxes.give_back(pending);
        assert!(boxes.spares.is_empty(), "a box that still holds a future is dropped");
        // Five boxes of 12 KiB are more than SPARE_BYTES: the first SPARE_BOXES are kept
        // whatever their size, and the oldest goes.
        let mut futs = vec![
            boxes.slot(ctx(), pool()).put(sized::<12_000>()),
            boxes.slot(ctx(), pool()).put(sized::<12_001>()),
            boxes.slot(ctx(), pool()).put(sized::<12_002>()),
            boxes.slot(ctx(), pool()).put(sized::<12_003>()),
            boxes.slot(ctx(), pool()).put(sized::<12_004>()),
        ];
        for fut in &mut futs {
            assert!(run(fut).is_ok());
        }
        for fut in futs {
            boxes.give_back(fut);
        }
        assert_eq!(boxes.spares.len(), SPARE_BOXES);
        let made = boxes.made();
        // The first (12,000 bytes of padding) was dropped; the last is still there.
        let mut again = boxes.slot(ctx(), pool()).put(sized::<12_004>());
        assert!(run(&mut again).is_ok());
        assert_eq!(boxes.made(), made);
        let mut first = boxes.slot(ctx(), pool()).put(sized::<12_000>());
        assert!(run(&mut first).is_ok());
        assert_eq!(boxes.made(), made + 1);
    }

    #[test]
    fn the_boxes_and_contexts_of_handlers_that_ran_at_once_are_kept_up_to_spare_bytes() {
        let mut boxes = HandlerBoxes::default();
        // 64 handlers at once (each holds its box and context until it finishes), twice: the
        // second burst makes no box and no context.
        let mut addrs = Vec::new();
        for burst in 0..2 {
            let mut futs: Vec<_> = (0..64)
                .map(|_| {
                    let spare = boxes.take_context().map(|(c, _)| c);
                    let c = context::Context::new_in(
                        spare,
                        "T.m",
                        1,
                        1,
                        &Arc::from("peer"),
                        None,
                        Default::default(),
                    );
                    if burst == 1 {
                        assert!(addrs.contains(&c.addr()), "a context of the first burst");
                    } else {
                        addrs.push(c.addr());
                    }
                    boxes.slot(c, pool()).put(sized::<100>())
                })
                .collect();
            for fut in &mut futs {
                assert!(run(fut).is_ok());
            }
            for fut in futs {
                boxes.give_back(fut);
            }
            assert_eq!((boxes.spares.len(), 1 + boxes.contexts.len()), (64, 64), "burst {burst}");
            assert_eq!(boxes.made(), 64, "burst {burst}");
        }
        // Past SPARE_BYTES the oldest go, boxes and contexts alike; what is kept stays under
        // the bound.
        let futs: Vec<_> = (0..2_000).map(|_| boxes.slot(ctx(), pool()).put(sized::<100>())).collect();
        let mut futs = futs;
        for fut in &mut futs {
            assert!(run(fut).is_ok());
        }
        for fut in futs {
            boxes.give_back(fut);
        }
        let box_size = boxes.spares[0].0.size();
        let held = boxes.spares.len() * box_size + boxes.contexts.len() * context::Context::KEPT_BYTES;
        assert!(held <= SPARE_BYTES, "{held} bytes kept");
        assert!(boxes.spares.len() > 64, "as many boxes as fit: {}", boxes.spares.len());
        assert!((1 + boxes.contexts.len()).abs_diff(boxes.spares.len()) <= 1, "about as many contexts");
        assert_eq!(held, boxes.kept_bytes);
        // Taking everything back leaves nothing counted.
        while boxes.take_context().is_some() {}
        assert_eq!(boxes.kept_bytes, boxes.spares.len() * box_size);
    }

    #[test]
    fn a_kept_context_beyond_the_first_holds_no_metadata_and_a_shared_one_is_not_kept() {
        let mut boxes = HandlerBoxes::default();
        let with_metadata = || {
            let mut m = context::Metadata::new();
            m.insert("k", "v").unwrap();
            context::Context::new_in(None, "T.m", 1, 1, &Arc::from("peer"), None, m)
        };
        let (kept_tx, kept_rx) = std::sync::mpsc::channel();
        let mut futs = vec![
            boxes.slot(with_metadata(), pool()).put(sized::<8>()),
            boxes.slot(with_metadata(), pool()).put(sized::<8>()),
            boxes.slot(with_metadata(), pool()).put(async move {
                kept_tx.send(context::current()).unwrap();
                Ok(Bytes::new())
            }),
        ];
        for fut in &mut futs {
            assert!(run(fut).is_ok());
        }
        for fut in futs {
            boxes.give_back(fut);
        }
        let _held_by_the_handler = kept_rx.recv().unwrap();
        assert_eq!(1 + boxes.contexts.len(), 2, "the shared one is not kept");
        let (first, _) = boxes.take_context().unwrap();
        assert_eq!(first.metadata().get("k"), Some("v"), "the first is kept as it is");
        let (second, _) = boxes.take_context().unwrap();
        assert!(second.metadata().is_empty(), "emptied");
        assert!(boxes.take_context().is_none());
        assert_eq!(boxes.kept_bytes, boxes.spares.iter().map(|(l, _)| l.size()).sum::<usize>());
    }

    #[test]
    fn a_panic_is_caught_and_its_box_reused() {
        let mut boxes = HandlerBoxes::default();
        let boom = |panics: bool| async move {
            if panics {
                panic!("a handler that panics (expected by this test)");
            }
            Ok(Bytes::new())
        };
        let mut fut = boxes.slot(ctx(), pool()).put(boom(true));
        assert!(run(&mut fut).is_err(), "the panic is caught");
        boxes.give_back(fut);
        let mut fut = boxes.slot(ctx(), pool()).put(boom(false));
        assert!(run(&mut fut).unwrap().is_ok());
        assert_eq!(boxes.made(), 1);
    }

    #[test]
    fn a_finished_handler_keeps_nothing_of_its_call() {
        let mut boxes = HandlerBoxes::default();
        let held = Arc::new(());
        let kept = held.clone();
        let mut fut = boxes.slot(ctx(), pool()).put(async move {
            let _kept = kept;
            let current = context::current().expect("the call's context is set");
            Ok(Bytes::from(current.method().to_string()))
        });
        assert_eq!(Arc::strong_count(&held), 2);
        assert_eq!(run(&mut fut).unwrap().unwrap(), Bytes::from_static(b"T.m"));
        assert_eq!(Arc::strong_count(&held), 1, "the future's captures are dropped when it finishes");
        boxes.give_back(fut);
        assert_eq!(boxes.spares.len(), 1);
        assert!(boxes.context.is_some(), "its context is kept");
    }

    #[test]
    fn the_context_is_current_only_while_the_handler_is_polled_or_dropped_unfinished() {
        /// Sends what is current when it is dropped.
        struct Witness(std::sync::mpsc::Sender<Option<String>>);
        impl Drop for Witness {
            fn drop(&mut self) {
                let _ = self.0.send(context::current().map(|c| c.method().to_string()));
            }
        }
        let mut boxes = HandlerBoxes::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let witness = Witness(tx.clone());
        let mut fut = boxes.slot(ctx(), pool()).put(async move {
            let _witness = witness;
            tx.send(context::current().map(|c| c.method().to_string())).unwrap();
            futures::future::pending::<()>().await;
            Ok(Bytes::new())
        });
        assert!(context::current().is_none(), "not before the first poll");
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(fut.poll(&mut cx).is_pending());
        assert_eq!(rx.try_recv().unwrap().as_deref(), Some("T.m"), "current while polled");
        assert!(context::current().is_none(), "not after the poll");
        drop(fut);
        assert_eq!(rx.try_recv().unwrap().as_deref(), Some("T.m"), "current while dropped unfinished");
        assert!(context::current().is_none(), "not after the drop");

        // A handler polled inside another's poll: each sees its own, and the outer one's is
        // current again after the inner poll.
        let inner = boxes
            .slot(ctx_named("T.inner"), pool())
            .put(async { Ok(Bytes::from(context::current().expect("inner context").method().to_string())) });
        let mut outer = boxes.slot(ctx(), pool()).put(async move {
            let mut inner = inner;
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            let Poll::Ready(Ok(Ok(seen))) = inner.poll(&mut cx) else { panic!("the inner one is ready") };
            assert_eq!(seen, Bytes::from_static(b"T.inner"));
            Ok(Bytes::from(context::current().expect("outer context").method().to_string()))
        });
        assert_eq!(run(&mut outer).unwrap().unwrap(), Bytes::from_static(b"T.m"));
        assert!(context::current().is_none());
    }

    #[test]
    fn a_finished_handler_gives_back_its_context_and_pool_and_a_panicked_one_does_not() {
        let mut boxes = HandlerBoxes::default();
        let (c, p) = (ctx(), pool());
        let mut fut = boxes.slot(c, p.clone()).put(async { Ok(Bytes::new()) });
        assert!(run(&mut fut).is_ok());
        boxes.give_back(fut);
        let (mut c, back) = boxes.take_context().expect("a finished handler's context and pool");
        let buf = p.alloc(64).unwrap().freeze();
        assert!(back.contains(&buf), "the connection's pool");
        // Nothing else holds the context: the next call's is written in its memory.
        let at = c.addr();
        let next =
            context::Context::new_in(Some(c), "T.n", 2, 2, &Arc::from("peer"), None, Default::default());
        assert_eq!(next.addr(), at);
        assert_eq!(next.method(), "T.n");
        c = next;
        // A handler that kept a clone: its context comes back, shared (the next call's is new).
        let (kept_tx, kept_rx) = std::sync::mpsc::channel();
        let mut fut = boxes.slot(c, back).put(async move {
            kept_tx.send(context::current()).unwrap();
            Ok(Bytes::new())
        });
        assert!(run(&mut fut).is_ok());
        boxes.give_back(fut);
        let (c, _) = boxes.take_context().expect("a finished handler's context and pool");
        let kept = kept_rx.recv().unwrap().expect("the context was current");
        assert_eq!(kept.call_id(), c.call_id());
        // A handler that panicked: its context and pool went with it; an unfinished one keeps them.
        let boom = async {
            panic!("a handler that panics (expected by this test)");
        };
        let mut fut = boxes.slot(c, pool()).put(boom);
        assert!(run(&mut fut).is_err());
        boxes.give_back(fut);
        assert!(boxes.take_context().is_none());
        let pending = boxes.slot(ctx(), pool()).put(futures::future::pending());
        boxes.give_back(pending);
        assert!(boxes.take_context().is_none());
    }
}

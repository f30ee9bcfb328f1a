//! A counting global allocator: bytes currently allocated by the whole test process, and the
//! peak since the last reset. It measures what the server *holds* (allocated and not freed),
//! which RSS does not: a READ destination allocated with `calloc` is untouched virtual memory
//! until written, yet it is exactly the kind of reservation a hostile peer can make us hold.
//!
//! A test binary opts in with
//! `#[global_allocator] static ALLOC: common::counting_alloc::Counting = common::counting_alloc::Counting;`.
//! Every call is forwarded to [`System`] unchanged (`alloc_zeroed` stays `calloc`, `realloc`
//! stays `realloc`), so measuring a 1 GiB zeroed destination does not touch 1 GiB of pages.
//!
//! The counts are process-wide: the attacker and the legitimate client of a test live in the
//! same process as the server. They allocate little (frames of a few bytes; any large buffer an
//! attacker serves is allocated before the baseline is taken), and measuring tests in one binary
//! take [`serial`] so that they never run at the same time.
//!
//! This is the only `unsafe` outside rpc-transport: a global allocator cannot be written without
//! it, and the published counting allocators either do not keep a resettable peak or implement
//! `alloc_zeroed` by writing zeros (which would commit the gigabytes this file exists to count).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicUsize = AtomicUsize::new(0);
/// Allocations made (a reallocation counts as one: a buffer that grows).
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// The allocator: [`System`], counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

fn grow(n: usize) {
    INSTALLED.store(1, Relaxed);
    ALLOCATIONS.fetch_add(1, Relaxed);
    let now = CURRENT.fetch_add(n, Relaxed).wrapping_add(n);
    PEAK.fetch_max(now, Relaxed);
}

fn shrink(n: usize) {
    CURRENT.fetch_sub(n, Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and returns
// what `System` returned; the counters are plain atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`; `System` zeroes (calloc: fresh pages stay untouched).
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was returned by this allocator, i.e. by `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was returned by `System` with `layout`; the caller upholds the rest of
        // `GlobalAlloc::realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grow(new_size - layout.size());
            } else {
                ALLOCATIONS.fetch_add(1, Relaxed);
                shrink(layout.size() - new_size);
            }
        }
        p
    }
}

/// Bytes allocated and not yet freed, process-wide.
pub fn current() -> usize {
    CURRENT.load(Relaxed)
}

/// Allocations made so far, process-wide (`alloc`, `alloc_zeroed` and `realloc` calls that
/// succeeded).
pub fn allocations() -> usize {
    ALLOCATIONS.load(Relaxed)
}

/// The most bytes allocated at once since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Relaxed)
}

/// Starts a new peak from the current level; returns that level.
pub fn reset_peak() -> usize {
    let now = current();
    PEAK.store(now, Relaxed);
    now
}

/// Panics unless this binary installed [`Counting`] as its global allocator (else every
/// figure would be a silent zero).
pub fn assert_installed() {
    let _probe = std::hint::black_box(vec![0u8; 64]);
    assert_eq!(INSTALLED.load(Relaxed), 1, "common::counting_alloc::Counting is not the global allocator");
}

/// Serializes the tests of one binary that measure memory (the counts are process-wide).
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// One measurement: a baseline, then the peak and the current level relative to it.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    baseline: usize,
}

impl Window {
    /// Takes the current level as the baseline and resets the peak to it.
    pub fn start() -> Window {
        Window { baseline: reset_peak() }
    }

    /// The baseline, in bytes.
    pub fn baseline(&self) -> usize {
        self.baseline
    }

    /// Peak held above the baseline since [`Window::start`] (0 if never above).
    pub fn peak_above(&self) -> usize {
        peak().saturating_sub(self.baseline)
    }

    /// Held above the baseline now (0 if below).
    pub fn held_above(&self) -> usize {
        current().saturating_sub(self.baseline)
    }
}

/// Formats a byte count for tables: `512 B`, `3.2 KiB`, `1.50 GiB`.
pub fn human(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

//! What a handler knows about the call it serves, and the metadata a caller attaches to a call.
//!
//! The server runs every handler inside its call's [`Context`]; a handler reads it with
//! [`current()`], so service traits keep their signatures:
//!
//! ```
//! #[rpc_core::service]
//! pub trait Greeter {
//!     async fn hello(&self, name: String) -> String;
//! }
//!
//! struct MyGreeter;
//! impl Greeter for MyGreeter {
//!     async fn hello(&self, name: String) -> String {
//!         let ctx = rpc_core::context::current().expect("runs inside a call");
//!         let user = ctx.metadata().get("user").unwrap_or("anonymous");
//!         format!("hello {name}, from {user} at {} (call {} of {})", ctx.peer(), ctx.call_id(), ctx.method())
//!     }
//! }
//! ```
//!
//! Or, as in tarpc, a method may take the context as its first argument (written
//! `rpc_core::Context`); the client stub has no such parameter:
//!
//! ```
//! #[rpc_core::service]
//! pub trait Clock {
//!     async fn remaining_ms(&self, ctx: rpc_core::Context) -> Option<u128>;
//! }
//!
//! struct MyClock;
//! impl Clock for MyClock {
//!     async fn remaining_ms(&self, ctx: rpc_core::Context) -> Option<u128> {
//!         ctx.remaining().map(|d| d.as_millis())
//!     }
//! }
//! ```
//!
//! A caller attaches metadata with [`CallOptions::metadata`](crate::CallOptions::metadata):
//! small key-value pairs (a trace id, an auth token), bounded in count and bytes.
//!
//! Trace ids: a call made while `tracing`'s `call` span is enabled (or from inside a handler
//! whose call carried one) carries a trace id in the metadata key [`TRACE_ID_KEY`]: the caller's
//! own if it set one, else the one of the call being served, else a fresh one. Both sides' `call`
//! spans record it as `trace_id`, so one id follows a request through every service it touches.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes};

use crate::proto::{MethodId, MAX_METADATA_LEN};

/// Most entries in one call's metadata.
pub const MAX_METADATA_ENTRIES: usize = 16;
/// Most bytes of one call's metadata, encoded (keys, values and 3 bytes per entry, plus 1).
pub const MAX_METADATA_BYTES: usize = MAX_METADATA_LEN;
/// Longest metadata key.
pub const MAX_KEY_LEN: usize = 64;
/// The metadata key a trace id travels under.
pub const TRACE_ID_KEY: &str = "trace-id";

/// Why metadata was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// More than [`MAX_METADATA_ENTRIES`] entries.
    #[error("{count} metadata entries exceed the limit of {max}")]
    TooManyEntries {
        /// Entries there would be.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More than [`MAX_METADATA_BYTES`] bytes encoded.
    #[error("metadata of {bytes} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Encoded bytes there would be.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A key that is empty, longer than [`MAX_KEY_LEN`], or has a character other than
    /// lower-case ASCII letters, digits, `-`, `_` and `.`.
    #[error("invalid metadata key {0:?} (1 to 64 of a-z 0-9 - _ .)")]
    BadKey(String),
    /// Received metadata that does not decode.
    #[error("malformed metadata: {0}")]
    Malformed(&'static str),
}

/// Key-value pairs a caller attaches to a call, e.g. a trace id or an auth token. At most
/// [`MAX_METADATA_ENTRIES`] entries and [`MAX_METADATA_BYTES`] bytes encoded, checked on insert.
/// Keys are unique (inserting a key again replaces its value).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<(String, String)>,
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may be secrets (auth tokens): keys only.
        f.debug_set().entries(self.entries.iter().map(|(k, _)| k)).finish()
    }
}

impl Metadata {
    /// No entries.
    pub fn new() -> Self {
        Metadata::default()
    }

    /// Sets `key` to `value`, or refuses with the limit it would break (leaving `self` as it was).
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Result<(), MetadataError> {
        let (key, value) = (key.into(), value.into());
        check_key(&key)?;
        let existing = self.entries.iter().position(|(k, _)| *k == key);
        let count = self.entries.len() + usize::from(existing.is_none());
        if count > MAX_METADATA_ENTRIES {
            return Err(MetadataError::TooManyEntries { count, max: MAX_METADATA_ENTRIES });
        }
        let replaced = existing.map_or(0, |i| entry_len(&self.entries[i].0, &self.entries[i].1));
        let bytes = self.encoded_len() - replaced + entry_len(&key, &value);
        if bytes > MAX_METADATA_BYTES || value.len() > usize::from(u16::MAX) {
            return Err(MetadataError::TooLarge { bytes, max: MAX_METADATA_BYTES });
        }
        match existing {
            Some(i) => self.entries[i].1 = value,
            None => self.entries.push((key, value)),
        }
        Ok(())
    }

    /// Builder form of [`Metadata::insert`].
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Result<Self, MetadataError> {
        self.insert(key, value)?;
        Ok(self)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The entries, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Size of [`Metadata::encode`]'s output (0 when empty).
    pub fn encoded_len(&self) -> usize {
        if self.entries.is_empty() {
            return 0;
        }
        1 + self.entries.iter().map(|(k, v)| entry_len(k, v)).sum::<usize>()
    }

    /// `count u8 | (key_len u8 | key | value_len u16 | value)*`; empty when there are no entries.
    /// (A slice of a block this thread carves small byte strings from: no allocation of its own.)
    pub fn encode(&self) -> Bytes {
        if self.entries.is_empty() {
            return Bytes::new();
        }
        let written = crate::arena::write_local(self.encoded_len(), |mut out: &mut [u8]| {
            out.put_u8(self.entries.len() as u8);
            for (k, v) in &self.entries {
                out.put_u8(k.len() as u8);
                out.put_slice(k.as_bytes());
                out.put_u16_le(v.len() as u16);
                out.put_slice(v.as_bytes());
            }
            Ok::<(), std::convert::Infallible>(())
        });
        match written {
            Ok(bytes) => bytes,
            Err(never) => match never {},
        }
    }

    /// Decodes what [`Metadata::encode`] wrote, with the same limits as [`Metadata::insert`].
    pub fn decode(mut bytes: &[u8]) -> Result<Metadata, MetadataError> {
        let mut md = Metadata::new();
        if bytes.is_empty() {
            return Ok(md);
        }
        if bytes.len() > MAX_METADATA_BYTES {
            return Err(MetadataError::TooLarge { bytes: bytes.len(), max: MAX_METADATA_BYTES });
        }
        let count = take(&mut bytes, 1)?[0];
        if count == 0 {
            // No entries are sent as no section at all: one encoding per value.
            return Err(MetadataError::Malformed("a section with no entries"));
        }
        for _ in 0..count {
            let key_len = usize::from(take(&mut bytes, 1)?[0]);
            let key = utf8(take(&mut bytes, key_len)?)?;
            let len = take(&mut bytes, 2)?;
            let value = utf8(take(&mut bytes, usize::from(u16::from_le_bytes([len[0], len[1]])))?)?;
            if md.get(&key).is_some() {
                return Err(MetadataError::Malformed("duplicate key"));
            }
            md.insert(key, value)?;
        }
        if !bytes.is_empty() {
            return Err(MetadataError::Malformed("trailing bytes"));
        }
        Ok(md)
    }
}

fn entry_len(key: &str, value: &str) -> usize {
    3 + key.len() + value.len()
}

fn check_key(key: &str) -> Result<(), MetadataError> {
    let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.');
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(ok_char) {
        return Err(MetadataError::BadKey(key.to_string()));
    }
    Ok(())
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], MetadataError> {
    if bytes.len() < n {
        return Err(MetadataError::Malformed("truncated"));
    }
    let (head, tail) = bytes.split_at(n);
    *bytes = tail;
    Ok(head)
}

fn utf8(bytes: &[u8]) -> Result<String, MetadataError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| MetadataError::Malformed("not UTF-8"))
}

/// The call a handler serves: its method, id, peer, deadline and metadata. Cheap to clone.
/// Read it with [`current()`].
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    method: &'static str,
    method_id: MethodId,
    call_id: u64,
    peer: Arc<str>,
    deadline: Option<tokio::time::Instant>,
    metadata: Metadata,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("method", &self.inner.method)
            .field("call_id", &self.inner.call_id)
            .field("peer", &self.inner.peer)
            .field("remaining", &self.remaining())
            .field("metadata", &self.inner.metadata)
            .finish()
    }
}

impl Context {
    /// A call's context, in the memory of `spare` (the context of an earlier call) if nothing
    /// else holds it any more (no allocation, and `peer` not cloned again if it is the one
    /// `spare` has: a connection's calls share it); else a new one.
    pub(crate) fn new_in(
        spare: Option<Context>,
        method: &'static str,
        method_id: MethodId,
        call_id: u64,
        peer: &Arc<str>,
        deadline: Option<tokio::time::Instant>,
        metadata: Metadata,
    ) -> Context {
        if let Some(mut ctx) = spare {
            if let Some(inner) = Arc::get_mut(&mut ctx.inner) {
                if !Arc::ptr_eq(&inner.peer, peer) {
                    inner.peer = peer.clone();
                }
                inner.method = method;
                inner.method_id = method_id;
                inner.call_id = call_id;
                inner.deadline = deadline;
                inner.metadata = metadata;
                return ctx;
            }
        }
        let peer = peer.clone();
        Context { inner: Arc::new(Inner { method, method_id, call_id, peer, deadline, metadata }) }
    }

    /// This context emptied of its call's metadata, to be kept for a later call; `None` if
    /// something else still holds it (a handler that kept a clone): it cannot be reused.
    pub(crate) fn recycled(mut self) -> Option<Context> {
        let inner = Arc::get_mut(&mut self.inner)?;
        inner.metadata = Metadata::new();
        Some(self)
    }

    /// Heap bytes a kept context holds (its metadata emptied: [`Context::recycled`]).
    pub(crate) const KEPT_BYTES: usize = std::mem::size_of::<Inner>() + 2 * std::mem::size_of::<usize>();

    /// Where its state lives (tests of its reuse).
    #[cfg(test)]
    pub(crate) fn addr(&self) -> *const () {
        Arc::as_ptr(&self.inner).cast()
    }

    /// The method, as `"Service.method"` (`"unknown"` for an id the server does not have).
    pub fn method(&self) -> &'static str {
        self.inner.method
    }

    /// The method's id.
    pub fn method_id(&self) -> MethodId {
        self.inner.method_id
    }

    /// The call's id on its connection (the client chose it; unique among that connection's
    /// calls in progress).
    pub fn call_id(&self) -> u64 {
        self.inner.call_id
    }

    /// The client's address, as the transport reports it.
    pub fn peer(&self) -> &str {
        &self.inner.peer
    }

    /// When the call's deadline passes (the handler is aborted then), if it has one.
    pub fn deadline(&self) -> Option<tokio::time::Instant> {
        self.inner.deadline
    }

    /// Time left before the deadline (zero once passed); `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.inner.deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// The metadata the caller attached.
    pub fn metadata(&self) -> &Metadata {
        &self.inner.metadata
    }

    /// The trace id the call carried ([`TRACE_ID_KEY`]).
    pub fn trace_id(&self) -> Option<&str> {
        self.inner.metadata.get(TRACE_ID_KEY)
    }

    /// What a handler runs with: this context as [`current()`] and `pool` as the pool
    /// [`crate::codec::encode`] writes into, both current while the handler is polled
    /// ([`enter`]).
    pub(crate) fn with_pool(self, pool: rpc_transport::MemPool) -> Handler {
        Handler { ctx: self, pool }
    }
}

/// What a server handler runs with: its call's context and its connection's pool.
#[derive(Debug)]
pub(crate) struct Handler {
    ctx: Context,
    pool: rpc_transport::MemPool,
}

impl Handler {
    /// The context and pool, for the connection's next handler.
    pub(crate) fn into_parts(self) -> (Context, rpc_transport::MemPool) {
        (self.ctx, self.pool)
    }
}

std::thread_local! {
    /// The handler being polled on this thread, if any (see [`enter`]): a task-local in effect,
    /// set around each poll of a handler's future, wherever it runs (the connection's driver or
    /// the handler's own task).
    static CURRENT: RefCell<Option<Handler>> = const { RefCell::new(None) };
}

/// Runs `f` (a poll of a handler's future, or its drop) with the handler in `handler` current on
/// this thread: it is swapped into this thread's slot for the while, and back when `f` returns
/// or unwinds, so that whatever was current before is current again.
pub(crate) fn enter<R>(handler: &mut Option<Handler>, f: impl FnOnce() -> R) -> R {
    /// Puts back what was current, and the handler in its place, when `f` returns or unwinds.
    struct Restore<'a> {
        handler: &'a mut Option<Handler>,
    }
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            // Not reachable while this thread's locals are being destroyed (`enter` could not
            // have swapped either).
            let _ = CURRENT.try_with(|current| {
                if let Ok(mut current) = current.try_borrow_mut() {
                    std::mem::swap(self.handler, &mut *current);
                }
            });
        }
    }
    let swapped = CURRENT.try_with(|current| match current.try_borrow_mut() {
        Ok(mut current) => {
            std::mem::swap(handler, &mut *current);
            true
        }
        // Borrowed by `with_current` (which runs no handler code: cannot happen): run without.
        Err(_) => false,
    });
    if swapped != Ok(true) {
        return f();
    }
    let _restore = Restore { handler };
    f()
}

/// `f` on the handler being polled on this thread; `None` outside one.
fn with_current<R>(f: impl FnOnce(&Handler) -> R) -> Option<R> {
    CURRENT.try_with(|current| current.try_borrow().ok().and_then(|h| h.as_ref().map(f))).ok().flatten()
}

/// Inside a server handler: the pool of the connection it answers on.
pub(crate) fn handler_pool() -> Option<rpc_transport::MemPool> {
    with_current(|h| h.pool.clone())
}

/// The context of the call the current task serves: `Some` inside a handler run by
/// [`Server`](crate::Server), `None` elsewhere (including tasks the handler spawns: pass them a
/// clone).
pub fn current() -> Option<Context> {
    with_current(|h| h.ctx.clone())
}

/// The current call's context, for handlers that take `ctx: rpc_core::Context` (a detached one,
/// with no deadline or metadata, when the service is called outside a server).
pub fn current_or_detached() -> Context {
    current()
        .unwrap_or_else(|| Context::new_in(None, "detached", 0, 0, &Arc::from(""), None, Metadata::new()))
}

/// A fresh trace id: 16 hex digits, unique enough to tell traces apart: a per-process seed (the
/// clock and an address, so two processes differ) and a counter, mixed by splitmix64. (Not the
/// standard library's hasher: using it here would change how the protocol's hash maps inline.)
pub(crate) fn new_trace_id() -> String {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (&COUNTER as *const AtomicU64 as u64).rotate_left(32) ^ u64::from(std::process::id())
    });
    let mut z =
        seed.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    format!("{:016x}", z ^ (z >> 31))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_nothing_else_holds_is_reused_in_place() {
        let peer: Arc<str> = Arc::from("peer");
        let first = Context::new_in(None, "S.a", 1, 1, &peer, None, Metadata::new());
        let at = Arc::as_ptr(&first.inner);
        let md = Metadata::new().with("k", "v").unwrap();
        let second = Context::new_in(Some(first), "S.b", 2, 2, &peer, None, md);
        assert_eq!(Arc::as_ptr(&second.inner), at, "the same memory");
        assert_eq!(Arc::strong_count(&peer), 2, "the peer is kept, not cloned again");
        assert_eq!(second.peer(), "peer");
        assert_eq!((second.method(), second.method_id(), second.call_id()), ("S.b", 2, 2));
        assert_eq!(second.metadata().get("k"), Some("v"));
        // A clone kept elsewhere (a handler that spawned work with it): a new one, the kept one
        // unchanged.
        let kept = second.clone();
        let third = Context::new_in(Some(second), "S.c", 3, 3, &peer, None, Metadata::new());
        assert_ne!(Arc::as_ptr(&third.inner), at);
        assert_eq!((kept.call_id(), third.call_id()), (2, 3));
    }

    #[test]
    fn round_trips_and_replaces() {
        let mut md = Metadata::new().with("trace-id", "abc").unwrap().with("auth", "t0k3n").unwrap();
        md.insert("auth", "other").unwrap();
        assert_eq!(md.len(), 2);
        let back = Metadata::decode(&md.encode()).unwrap();
        assert_eq!(back, md);
        assert_eq!(back.get("auth"), Some("other"));
        assert_eq!(Metadata::decode(&[]).unwrap(), Metadata::new());
        assert!(Metadata::new().encode().is_empty());
        assert_eq!(md.encoded_len(), md.encode().len());
    }

    #[test]
    fn a_section_with_no_entries_is_malformed() {
        // Found by the proto_decode fuzz target: `[0]` decoded as empty metadata, which encodes
        // as no section at all, so one value had two encodings.
        assert!(matches!(Metadata::decode(&[0]), Err(MetadataError::Malformed(_))));
    }

    #[test]
    fn limits_are_typed_errors_and_leave_the_map_unchanged() {
        let mut md = Metadata::new();
        for i in 0..MAX_METADATA_ENTRIES {
            md.insert(format!("k{i}"), "v").unwrap();
        }
        let before = md.clone();
        assert_eq!(
            md.insert("one-more", "v"),
            Err(MetadataError::TooManyEntries { count: MAX_METADATA_ENTRIES + 1, max: MAX_METADATA_ENTRIES })
        );
        assert_eq!(md, before);
        let mut md = Metadata::new();
        assert!(matches!(
            md.insert("big", "x".repeat(MAX_METADATA_BYTES)),
            Err(MetadataError::TooLarge { .. })
        ));
        assert!(md.is_empty());
        for bad in ["", "Upper", "sp ace", &"k".repeat(MAX_KEY_LEN + 1)] {
            assert!(matches!(md.insert(bad, "v"), Err(MetadataError::BadKey(_))), "{bad:?}");
        }
    }

    #[test]
    fn malformed_input_is_an_error_never_a_panic() {
        let good = Metadata::new().with("a", "b").unwrap().encode();
        for cut in 0..good.len() {
            assert!(Metadata::decode(&good[..cut]).is_err() || cut == 0, "cut at {cut}");
        }
        let mut trailing = good.to_vec();
        trailing.push(0);
        assert_eq!(Metadata::decode(&trailing), Err(MetadataError::Malformed("trailing bytes")));
        assert!(Metadata::decode(&[2, 1, b'a', 0, 0, 1, b'a', 0, 0]).is_err(), "duplicate key");
        assert!(Metadata::decode(&[1, 1, b'A', 0, 0]).is_err(), "bad key");
        assert!(Metadata::decode(&[1, 1, b'a', 1, 0, 0xff]).is_err(), "bad utf-8");
    }

    #[test]
    fn debug_hides_values() {
        let md = Metadata::new().with("auth", "secret").unwrap();
        assert!(!format!("{md:?}").contains("secret"));
    }

    #[test]
    fn trace_ids_differ() {
        assert_ne!(new_trace_id(), new_trace_id());
        assert_eq!(new_trace_id().len(), 16);
    }
}

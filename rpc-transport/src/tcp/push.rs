//! Pushed regions: the tcp backend's shortcut for a READ it would otherwise emulate with a round
//! trip (wire frames PUSH, REVOKE and WINDOW; see `wire.rs`).
//!
//! **Owner side.** When a region is registered and its whole length fits the window the peer
//! has left, its bytes go to the peer at once, ahead of whatever frame advertises the region (the
//! stream is ordered, so they arrive first). The region stays registered exactly as before: the
//! peer may still READ it. The peer reports each pushed region it no longer holds (consumed or
//! dropped) with WINDOW, which gives its window back; revoking a region the peer still holds
//! sends REVOKE so that it drops the bytes (the protocol revokes after the peer's READ, whose
//! WINDOW precedes its done report on the stream, so REVOKE is rare).
//!
//! **Reader side.** Pushed bytes are kept by key, within the window we announced. A READ is
//! served from them when it is the first READ of that key since they arrived and covers exactly
//! the pushed region (key, address and length); it then completes at once, with no request to
//! the owner. Any other READ goes to the owner, which checks key and bounds as always, and drops
//! the pushed bytes of that key: after the first READ of a key, every READ of it is checked by
//! the owner, so a READ posted after the owner's REVOKE arrived is refused and closes the
//! connection exactly as without push. (A READ racing the revoke, posted before the REVOKE
//! arrives, may complete from the pushed bytes, which the owner chose to send us; the protocol
//! never issues one: it revokes a region only once the peer is done READing it.) Bytes of a key
//! that arrive while a READ of it is in flight to the owner are dropped on arrival (the owner
//! pushed them before it served that READ). Each pushed region is handed back (WINDOW, with its
//! key and length) exactly once, as soon as its bytes are consumed or dropped.
//!
//! Memory: at most the window we announced is held for the peer; the connections of one
//! listener together hold at most [`crate::TcpSettings::push_listener_total`] (a push beyond
//! that is read off the socket and discarded, its window handed back at once, and its READ goes
//! to the owner as if it had never been pushed). Pushed bytes are read off the socket into a
//! buffer of the connection's pool, which a READ served from them hands to the caller as its
//! destination (no copy; the caller's own destination goes back to the pool), so a steady stream
//! of pushes reuses the same memory. The owner side holds nothing more than its registered
//! regions (a push shares the region's `Bytes`).

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Buf, RKey, RegionDesc};

/// The push state of one connection, shared by the connection object and its reader task.
#[derive(Debug)]
pub(crate) struct Push {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The connection died: nothing is pushed or kept any more.
    closed: bool,
    outbound: Outbound,
    inbound: Inbound,
}

/// What we push to the peer.
#[derive(Debug)]
struct Outbound {
    /// The window the peer announced.
    granted: u64,
    /// What is left of it: `granted` minus bytes pushed and not yet handed back.
    left: u64,
    /// Our regions the peer holds (or is sent), by key: their length, and whether REVOKE was
    /// sent. An entry leaves when the peer hands the region back.
    pushed: HashMap<RKey, OutPushed>,
}

#[derive(Debug)]
struct OutPushed {
    len: u64,
    revoked: bool,
}

/// What the peer pushed to us.
#[derive(Debug)]
struct Inbound {
    /// The window we announced.
    window: u64,
    /// Bytes accepted (arrived or arriving) and not yet handed back.
    held: u64,
    regions: HashMap<RKey, Pushed>,
    /// READs of each key in flight to the owner (bytes of such a key are dropped on arrival).
    reading: HashMap<RKey, u32>,
    /// Shared with the other connections of our listener, if any.
    pool: Option<Arc<PushPool>>,
}

impl Inbound {
    /// `len` pushed bytes are no longer held (consumed, dropped, or the connection died).
    fn release(&mut self, len: u64) {
        self.held -= len;
        if let Some(pool) = &self.pool {
            pool.give(len);
        }
    }
}

/// Pushed bytes the connections of one listener may hold at once, together.
#[derive(Debug)]
pub(crate) struct PushPool {
    left: AtomicU64,
}

impl PushPool {
    pub(crate) fn new(bytes: u64) -> Arc<PushPool> {
        Arc::new(PushPool { left: AtomicU64::new(bytes) })
    }

    /// Takes `n` bytes if that many are left.
    fn take(&self, n: u64) -> bool {
        self.left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| left.checked_sub(n)).is_ok()
    }

    fn give(&self, n: u64) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }

    /// Bytes left.
    #[cfg(test)]
    pub(crate) fn left(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
struct Pushed {
    addr: u64,
    data: Buf,
}

/// How a READ is to be carried out.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Completed from pushed bytes: hand the region back to the peer (WINDOW).
    Pushed { data: Buf },
    /// Sent to the owner; `dropped`: bytes of that key were pushed and are now dropped (hand
    /// them back).
    Remote { dropped: Option<u64> },
}

impl Push {
    /// `ours`: the window we announced; `theirs`: the window the peer announced; `pool`: what
    /// the connections of our listener share, if we were accepted by one.
    pub(crate) fn new(ours: u64, theirs: u64, pool: Option<Arc<PushPool>>) -> Push {
        Push {
            state: Mutex::new(State {
                closed: false,
                outbound: Outbound { granted: theirs, left: theirs, pushed: HashMap::new() },
                inbound: Inbound {
                    window: ours,
                    held: 0,
                    regions: HashMap::new(),
                    reading: HashMap::new(),
                    pool,
                },
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update below leaves the state consistent before anything can panic.
        self.state.lock()
    }

    /// The connection died: drops every pushed byte and pushes nothing more.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.inbound.regions.clear();
        st.inbound.reading.clear();
        let held = st.inbound.held;
        st.inbound.release(held);
        st.outbound.pushed.clear();
    }

    // ---- owner side ----

    /// Whether to push the region just registered: only when its whole length fits the window
    /// the peer has left (which it then takes), and its key is not one the peer has yet to hand
    /// back (a key revoked and registered again).
    pub(crate) fn start_push(&self, desc: &RegionDesc) -> bool {
        let mut st = self.lock();
        if st.closed {
            return false;
        }
        let out = &mut st.outbound;
        if out.granted == 0 || desc.len > out.left || out.pushed.contains_key(&desc.rkey) {
            return false;
        }
        out.left -= desc.len;
        out.pushed.insert(desc.rkey, OutPushed { len: desc.len, revoked: false });
        true
    }

    /// The region `rkey` was revoked: whether the peer may still hold its pushed bytes (then
    /// it must be told, once).
    pub(crate) fn revoke_pushed(&self, rkey: RKey) -> bool {
        match self.lock().outbound.pushed.get_mut(&rkey) {
            Some(p) if !p.revoked => {
                p.revoked = true;
                true
            }
            _ => false,
        }
    }

    /// The peer handed back region `rkey` of `len` bytes; one we did not push to it (or not
    /// with that length) is a violation.
    pub(crate) fn window_back(&self, rkey: RKey, len: u64) -> Result<(), String> {
        let mut st = self.lock();
        let out = &mut st.outbound;
        match out.pushed.get(&rkey) {
            Some(p) if p.len == len => {
                out.pushed.remove(&rkey);
                out.left += len;
                Ok(())
            }
            Some(p) => Err(format!("peer handed back {len} bytes of key {rkey:#x}, pushed with {}", p.len)),
            None => Err(format!("peer handed back key {rkey:#x}, which it does not hold")),
        }
    }

    /// Window the peer has left for our pushes.
    #[cfg(test)]
    pub(crate) fn window_left(&self) -> u64 {
        self.lock().outbound.left
    }

    // ---- reader side ----

    /// A PUSH header arrived: `len` bytes of key `rkey` follow. Takes them from our window
    /// and returns `Ok(true)` (read them into a buffer of the connection's pool); `Err` (a
    /// violation) if they do not fit what is left or the key is held already. `Ok(false)`: the
    /// bytes are to be read and discarded, and the region handed back at once (our listener's
    /// connections hold all the pushed bytes they may, or the connection died).
    pub(crate) fn accept(&self, rkey: RKey, len: u64) -> Result<bool, String> {
        let mut st = self.lock();
        if st.closed {
            return Ok(false);
        }
        let inb = &mut st.inbound;
        let left = inb.window - inb.held;
        if len > left {
            return Err(format!(
                "peer pushed {len} bytes with {left} bytes of the {} byte push window left",
                inb.window
            ));
        }
        if inb.regions.contains_key(&rkey) {
            return Err(format!("peer pushed key {rkey:#x} twice"));
        }
        if inb.pool.as_ref().is_some_and(|pool| !pool.take(len)) {
            return Ok(false);
        }
        inb.held += len;
        Ok(true)
    }

    /// The bytes of a PUSH accepted with [`Push::accept`] have arrived. Returns their length if
    /// they are not kept and the region is to be handed back at once (a READ of that key is in
    /// flight to the owner).
    pub(crate) fn arrived(&self, rkey: RKey, addr: u64, data: Buf) -> Option<u64> {
        let mut st = self.lock();
        if st.closed {
            return None;
        }
        let inb = &mut st.inbound;
        if inb.reading.contains_key(&rkey) {
            let len = data.len() as u64;
            inb.release(len);
            return Some(len);
        }
        inb.regions.insert(rkey, Pushed { addr, data });
        None
    }

    /// The owner revoked `rkey`: its pushed bytes, if still here, are dropped. Returns their
    /// length (the region is to be handed back).
    pub(crate) fn revoked(&self, rkey: RKey) -> Option<u64> {
        let mut st = self.lock();
        let inb = &mut st.inbound;
        let gone = inb.regions.remove(&rkey)?;
        let len = gone.data.len() as u64;
        inb.release(len);
        Some(len)
    }

    /// How our READ of `remote` is carried out (see the module doc). A READ sent to the owner
    /// must be reported with [`Push::read_done`] when its response arrives.
    pub(crate) fn lookup(&self, remote: &RegionDesc) -> Lookup {
        let mut st = self.lock();
        if st.closed {
            return Lookup::Remote { dropped: None };
        }
        let inb = &mut st.inbound;
        let mut dropped = None;
        if let Some(pushed) = inb.regions.remove(&remote.rkey) {
            let len = pushed.data.len() as u64;
            inb.release(len);
            if pushed.addr == remote.addr && len == remote.len {
                return Lookup::Pushed { data: pushed.data };
            }
            dropped = Some(len);
        }
        *inb.reading.entry(remote.rkey).or_insert(0) += 1;
        Lookup::Remote { dropped }
    }

    /// A READ of `rkey` sent to the owner was answered (or never left).
    pub(crate) fn read_done(&self, rkey: RKey) {
        let mut st = self.lock();
        if let Some(n) = st.inbound.reading.get_mut(&rkey) {
            *n -= 1;
            if *n == 0 {
                st.inbound.reading.remove(&rkey);
            }
        }
    }

    /// Pushed bytes held now.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn held(&self) -> u64 {
        self.lock().inbound.held
    }

    /// Pushed regions held now.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn regions_held(&self) -> usize {
        self.lock().inbound.regions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(rkey: RKey, addr: u64, len: u64) -> RegionDesc {
        RegionDesc { addr, len, rkey }
    }

    #[test]
    fn owner_pushes_only_what_fits_and_gets_it_back() {
        let p = Push::new(0, 100, None);
        assert!(p.start_push(&desc(1, 0, 60)));
        assert!(!p.start_push(&desc(2, 0, 41)), "does not fit the 40 left");
        assert!(p.start_push(&desc(3, 0, 40)));
        assert_eq!(p.window_left(), 0);
        assert!(p.revoke_pushed(1), "held by the peer: tell it");
        assert!(!p.revoke_pushed(1), "told once");
        assert!(!p.revoke_pushed(2), "never pushed");
        assert!(!p.start_push(&desc(1, 0, 0)), "key 1 not handed back yet");
        assert!(p.window_back(1, 59).is_err(), "not the length pushed");
        assert!(p.window_back(2, 41).is_err(), "never pushed");
        p.window_back(1, 60).unwrap();
        assert!(p.window_back(1, 60).is_err(), "handed back twice");
        p.window_back(3, 40).unwrap();
        assert!(!p.revoke_pushed(3), "handed back already: no REVOKE needed");
        assert_eq!(p.window_left(), 100);
        let off = Push::new(0, 0, None);
        assert!(!off.start_push(&desc(1, 0, 0)), "a zero window means no push at all");
    }

    #[test]
    fn reader_serves_the_first_exact_read_only() {
        let p = Push::new(100, 0, None);
        p.accept(7, 4).unwrap();
        assert_eq!(p.arrived(7, 0x10, Buf::from(b"abcd".to_vec())), None);
        assert!(p.accept(7, 1).is_err(), "a key held is pushed again");
        assert!(matches!(p.lookup(&desc(7, 0x10, 4)), Lookup::Pushed { ref data } if data == b"abcd"));
        assert_eq!(p.held(), 0);
        // A second READ of the key goes to the owner.
        assert!(matches!(p.lookup(&desc(7, 0x10, 4)), Lookup::Remote { dropped: None }));
        p.read_done(7);

        // A READ of part of a pushed region goes to the owner and drops the pushed bytes.
        p.accept(8, 4).unwrap();
        p.arrived(8, 0x20, Buf::from(b"wxyz".to_vec()));
        assert!(matches!(p.lookup(&desc(8, 0x21, 2)), Lookup::Remote { dropped: Some(4) }));
        assert_eq!((p.held(), p.regions_held()), (0, 0));
    }

    #[test]
    fn bytes_arriving_while_their_key_is_read_remotely_are_dropped() {
        let p = Push::new(100, 0, None);
        assert!(matches!(p.lookup(&desc(3, 0, 5)), Lookup::Remote { dropped: None }));
        p.accept(3, 5).unwrap();
        assert_eq!(p.arrived(3, 0, Buf::from(vec![0; 5])), Some(5));
        assert_eq!((p.held(), p.regions_held()), (0, 0));
        p.read_done(3);
        p.accept(3, 5).unwrap();
        assert_eq!(p.arrived(3, 0, Buf::from(vec![0; 5])), None, "kept once no READ of the key is in flight");
        assert_eq!(p.revoked(3), Some(5));
        assert_eq!(p.revoked(3), None);
        assert_eq!(p.held(), 0);
    }

    #[test]
    fn a_listeners_connections_share_one_pool_and_discard_beyond_it() {
        let pool = PushPool::new(100);
        let (a, b) = (Push::new(80, 0, Some(pool.clone())), Push::new(80, 0, Some(pool.clone())));
        assert!(a.accept(1, 70).unwrap());
        assert!(!b.accept(1, 40).unwrap(), "30 left in the pool: read and discarded");
        assert!(b.accept(2, 30).unwrap());
        assert_eq!((pool.left(), b.held()), (0, 30));
        assert!(b.accept(3, 60).is_err(), "beyond b's own window is still a violation");
        a.arrived(1, 0, Buf::from(vec![0; 70]));
        assert_eq!(a.revoked(1), Some(70));
        assert_eq!(pool.left(), 70);
        b.close();
        assert_eq!(pool.left(), 100, "a dead connection gives back what it held");
        assert!(!b.accept(4, 10).unwrap(), "nothing is kept after death");
        assert_eq!(pool.left(), 100);
    }

    #[test]
    fn reader_window_is_enforced_and_closing_drops_everything() {
        let p = Push::new(10, 0, None);
        p.accept(1, 6).unwrap();
        assert!(p.accept(2, 5).is_err(), "beyond the window");
        p.accept(2, 4).unwrap();
        p.arrived(1, 0, Buf::from(vec![0; 6]));
        p.close();
        assert_eq!(p.arrived(2, 0, Buf::from(vec![0; 4])), None);
        assert_eq!((p.held(), p.regions_held()), (0, 0));
        assert!(matches!(p.lookup(&desc(1, 0, 6)), Lookup::Remote { dropped: None }));
    }
}

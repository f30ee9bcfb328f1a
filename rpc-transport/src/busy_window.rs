//! A busy-poll window: how long a poller that finds nothing keeps looking (waking its own task,
//! so that the runtime's other tasks run between looks) before it sleeps until the runtime
//! reports readiness. Shared by the verbs CQ poller (`rdma/cq.rs`) and the tcp reader
//! (`tcp/read_after_send.rs`).
//!
//! The window opens at the first empty look after something arrived and closes `window` later:
//! a poller spins while messages keep coming, and sleeps when they stop. The clock is read when a
//! window opens and then every [`SPINS_PER_CLOCK_READ`] empty looks, not at each: where the clock
//! has no vDSO (a VM on the HPET) a read is a system call, which would make every spin one.

use std::time::{Duration, Instant};

/// Empty looks between two readings of the clock (a window overshoots by at most this many
/// spins: tens of microseconds).
pub(crate) const SPINS_PER_CLOCK_READ: u64 = 16;

#[derive(Debug)]
pub(crate) struct BusyWindow {
    window: Duration,
    /// When the current window opened (`None`: not yet, since the last arrival).
    since: Option<Instant>,
    /// The current window ran out (until something arrives).
    spent: bool,
    /// Empty looks inside windows (their CPU cost, for counters).
    spins: u64,
}

impl BusyWindow {
    /// A window of `window` (zero: never spin).
    pub(crate) fn new(window: Duration) -> Self {
        BusyWindow { window, since: None, spent: false, spins: 0 }
    }

    /// Something arrived: the next empty look opens a new window.
    pub(crate) fn arrived(&mut self) {
        self.since = None;
        self.spent = false;
    }

    /// A look found nothing: whether to spin (counted) rather than sleep. After a window ran
    /// out, none opens until something arrives.
    pub(crate) fn spin(&mut self) -> bool {
        if self.window.is_zero() || self.spent {
            return false;
        }
        let open = match self.since {
            None => {
                self.since = Some(Instant::now());
                true
            }
            // `spins` counts every empty look inside a window: one in this many reads the clock.
            Some(_) if self.spins % SPINS_PER_CLOCK_READ != 0 => true,
            Some(since) => {
                // A window that ran out is spent until something arrives.
                self.spent = since.elapsed() >= self.window;
                !self.spent
            }
        };
        if open {
            self.spins += 1;
        }
        open
    }

    /// Empty looks spent inside windows so far.
    pub(crate) fn spins(&self) -> u64 {
        self.spins
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty looks until the window says sleep (bounded: a window that never closes fails).
    fn spins_until_closed(w: &mut BusyWindow) -> u64 {
        let began = Instant::now();
        let mut n = 0;
        while w.spin() {
            n += 1;
            assert!(began.elapsed() < Duration::from_secs(5), "the window never closed");
        }
        n
    }

    #[test]
    fn a_zero_window_never_spins() {
        let mut w = BusyWindow::new(Duration::ZERO);
        assert!(!w.spin());
        w.arrived();
        assert!(!w.spin());
        assert_eq!(w.spins(), 0);
    }

    #[test]
    fn a_window_spins_until_it_runs_out_then_waits_for_an_arrival() {
        let mut w = BusyWindow::new(Duration::from_millis(2));
        // Opens at the first empty look; spins (counted) while it lasts.
        let first = spins_until_closed(&mut w);
        assert!(first >= 1);
        assert_eq!(w.spins(), first);
        // It ran out, after a clock reading: the reading comes every SPINS_PER_CLOCK_READ spins.
        assert_eq!(first % SPINS_PER_CLOCK_READ, 0, "{first}");
        // Spent: no spin until something arrives, however long the poller waits.
        std::thread::sleep(Duration::from_millis(3));
        assert!(!w.spin());
        assert_eq!(w.spins(), first);
        // An arrival opens a new window at the next empty look.
        w.arrived();
        let second = spins_until_closed(&mut w);
        assert!(second >= 1);
        assert_eq!(w.spins(), first + second);
    }

    #[test]
    fn arrivals_inside_the_window_keep_it_open() {
        // (A window long enough that a stall of a loaded machine between two looks does not
        // close it.)
        let mut w = BusyWindow::new(Duration::from_millis(300));
        let began = Instant::now();
        // Something arrives every few spins for longer than the window: it never runs out.
        while began.elapsed() < Duration::from_millis(450) {
            for _ in 0..3 {
                assert!(w.spin(), "closed with arrivals coming");
            }
            w.arrived();
        }
    }
}

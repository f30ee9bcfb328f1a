//! The look after a SEND: when the policy asks for one (deterministic, told each write's time),
//! and what the reader's look reads from a real loopback socket.

use std::sync::atomic::AtomicUsize;
use std::task::Waker;
use std::time::Duration;

use futures::task::ArcWake;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// One microsecond, in a unit of the tests' own ([`stamp`]'s unit is not fixed either).
const US: u64 = 1000;

/// Feeds `n` SENDs that each took `took`; returns how many asked for a look. Each look is
/// answered at once as `found` says (as the reader would record it).
fn sends(policy: &mut LookPolicy, shared: &ReadAfterSend, n: u32, took: u64, found: bool) -> u32 {
    let mut asked = 0;
    for _ in 0..n {
        if policy.after_send(took, shared) {
            assert!(shared.take_ask(), "a look asked for is pending for the reader");
            shared.record(found);
            asked += 1;
        }
    }
    asked
}

/// A window of SENDs whose first write is fast (4 us) and the others slow (10 us); returns the
/// looks asked for.
fn window(policy: &mut LookPolicy, shared: &ReadAfterSend, found: bool) -> u32 {
    sends(policy, shared, 1, 4 * US, found) + sends(policy, shared, WINDOW - 1, 10 * US, found)
}

#[test]
fn no_look_before_a_window_of_writes_is_timed() {
    let (mut policy, shared) = (LookPolicy::new(true), ReadAfterSend::default());
    assert_eq!(sends(&mut policy, &shared, WINDOW - 1, 100 * US, true), 0);
    assert!(!shared.take_ask());
}

#[test]
fn a_write_twice_the_window_fastest_asks_for_a_look() {
    let (mut policy, shared) = (LookPolicy::new(true), ReadAfterSend::default());
    // A window of 4 us writes, and one of 3 us: the floor is 3 us.
    assert_eq!(sends(&mut policy, &shared, WINDOW - 1, 4 * US, true), 0);
    assert_eq!(sends(&mut policy, &shared, 1, 3 * US, true), 0);
    assert_eq!(sends(&mut policy, &shared, 10, 5 * US, true), 0, "below 2 x 3 us");
    assert_eq!(sends(&mut policy, &shared, 10, 6 * US, true), 10, "at 2 x 3 us");
    assert_eq!(sends(&mut policy, &shared, 10, 11 * US, true), 10);
    assert_eq!(shared.looks(), (20, 20));
}

#[test]
fn the_floor_is_the_last_window_fastest() {
    let (mut policy, shared) = (LookPolicy::new(true), ReadAfterSend::default());
    assert_eq!(sends(&mut policy, &shared, WINDOW, 4 * US, true), 0);
    // The second window's writes are all slower (the host became slower): 10 us each. They
    // look while the floor is the first window's 4 us...
    assert_eq!(sends(&mut policy, &shared, WINDOW - 1, 10 * US, true), WINDOW - 1);
    // ...and its last ends the window: the floor is 10 us, and 10 us writes look no more.
    assert_eq!(sends(&mut policy, &shared, 1, 10 * US, true), 0);
    assert_eq!(sends(&mut policy, &shared, 100, 10 * US, true), 0);
    assert_eq!(sends(&mut policy, &shared, 1, 20 * US, true), 1);
}

#[test]
fn looks_that_mostly_miss_pause_one_window_then_two_then_four() {
    let (mut policy, shared) = (LookPolicy::new(true), ReadAfterSend::default());
    assert_eq!(sends(&mut policy, &shared, WINDOW, 4 * US, true), 0);
    // Most SENDs slow (something else runs in our writes), and no look finds anything.
    let windows: Vec<u32> = (0..12).map(|_| window(&mut policy, &shared, false)).collect();
    // A window of misses (all its SENDs but the last, which ends it and sets the pause), a pause
    // of one window, a window of misses, a pause of two, one of misses, a pause of four, ...
    let w = WINDOW - 2;
    assert_eq!(windows, [w, 0, w, 0, 0, w, 0, 0, 0, 0, w, 0]);
    // Looks that find again: the pause's length starts over at one window.
    let (mut policy, shared) = (LookPolicy::new(true), ReadAfterSend::default());
    sends(&mut policy, &shared, WINDOW, 4 * US, true);
    let mut pattern = Vec::new();
    for found in [false, false, false, false, false, true, false, false] {
        pattern.push(window(&mut policy, &shared, found));
    }
    // miss (pause 1), paused, miss (pause 2), paused, paused, found (the pause's length back to
    // one window), miss (a pause of one window, not four), paused.
    assert_eq!(pattern, [w, 0, w, 0, 0, w, w, 0]);
}

#[test]
fn a_pause_grows_to_its_bound() {
    let (mut policy, shared) = (LookPolicy::new(true), ReadAfterSend::default());
    sends(&mut policy, &shared, WINDOW, 4 * US, true);
    // Pauses of 1 + 2 + 4 + ... + 64 + 64 windows, each after a window of misses, and the window
    // of misses that ends the last.
    let mut paused_runs = Vec::new();
    let mut run = 0;
    for _ in 0..(1 + 2 + 4 + 8 + 16 + 32 + 64 + 64 + 8 + 1) {
        if window(&mut policy, &shared, false) == 0 {
            run += 1;
        } else if run > 0 {
            paused_runs.push(run);
            run = 0;
        }
    }
    assert_eq!(paused_runs, [1, 2, 4, 8, 16, 32, 64, 64]);
}

#[test]
fn disabled_never_asks() {
    let (mut policy, shared) = (LookPolicy::new(false), ReadAfterSend::default());
    assert_eq!(sends(&mut policy, &shared, WINDOW, 4 * US, true), 0);
    assert_eq!(sends(&mut policy, &shared, WINDOW, 100 * US, true), 0);
    assert_eq!(shared.looks(), (0, 0));
}

/// A waker that counts its wakes.
#[derive(Default)]
struct Count(AtomicUsize);

impl ArcWake for Count {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.fetch_add(1, Ordering::SeqCst);
    }
}

async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (ours.unwrap(), theirs.unwrap().0)
}

/// A reader over our end of a fresh loopback pair with a busy-poll window of `busy_poll`; the
/// peer's end, what the reader shares with the sending side, and a waker that counts its wakes.
async fn looking_reader(
    busy_poll: Duration,
) -> (LookingReader, TcpStream, Arc<ReadAfterSend>, Arc<Count>, Waker) {
    let (ours, theirs) = pair().await;
    let shared = Arc::new(ReadAfterSend::default());
    let reader = LookingReader::new(super::super::halves::split(ours).unwrap().0, shared.clone(), busy_poll);
    let count = Arc::new(Count::default());
    let waker = futures::task::waker(count.clone());
    (reader, theirs, shared, count, waker)
}

fn poll_read(reader: &mut LookingReader, waker: &Waker, buf: &mut [u8]) -> Poll<io::Result<usize>> {
    let mut read = ReadBuf::new(buf);
    Pin::new(reader).poll_read(&mut Context::from_waker(waker), &mut read).map_ok(|()| read.filled().len())
}

#[tokio::test(flavor = "current_thread")]
async fn a_look_reads_what_lies_in_the_socket_and_an_ask_wakes_the_reader() {
    let (mut reader, mut theirs, shared, count, waker) = looking_reader(Duration::ZERO).await;
    let mut buf = [0u8; 64];

    // Nothing there: a look finds nothing, counted, and the reader waits with its waker left.
    shared.ask();
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!(shared.looks(), (1, 0));
    // An ask wakes the waiting reader (once, however many asks before its next poll).
    shared.ask();
    shared.ask();
    assert_eq!(count.0.load(Ordering::SeqCst), 1);

    // The peer's bytes lie in our socket once its write returns (loopback delivers within the
    // write). The asked look reads them at this very poll, with no turn of the runtime's I/O
    // driver in between.
    theirs.write_all(b"the answer").await.unwrap();
    match poll_read(&mut reader, &waker, &mut buf) {
        Poll::Ready(Ok(n)) => assert_eq!(&buf[..n], b"the answer"),
        other => panic!("the look did not read the answer: {other:?}"),
    }
    assert_eq!(shared.looks(), (2, 1));
    // The reader waits again: the next ask wakes it too (the look's ask took the waker; the
    // reader left it again).
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    shared.ask();
    assert_eq!(count.0.load(Ordering::SeqCst), 2);
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!(shared.looks(), (3, 1));
    // Polls with the same waker and no ask leave it once: an ask still wakes the reader.
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    shared.ask();
    assert_eq!(count.0.load(Ordering::SeqCst), 3);
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!(shared.looks(), (4, 1));

    // The peer closes: a look finds the end of the stream.
    drop(theirs);
    shared.ask();
    assert!(matches!(poll_read(&mut reader, &waker, &mut buf), Poll::Ready(Ok(0))));
    assert_eq!(shared.looks(), (5, 2));
}

#[tokio::test(flavor = "current_thread")]
async fn a_look_that_meets_a_reset_counts_as_found_and_returns_the_error() {
    let (mut reader, theirs, shared, _count, waker) = looking_reader(Duration::ZERO).await;
    // The peer resets the connection (closed with a zero linger: RST, not FIN).
    socket2::SockRef::from(&theirs).set_linger(Some(Duration::ZERO)).unwrap();
    drop(theirs);
    shared.ask();
    let mut buf = [0u8; 64];
    match poll_read(&mut reader, &waker, &mut buf) {
        Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
        other => panic!("the look did not return the reset: {other:?}"),
    }
    // It found the connection's end, as a look that reads its closing does: not a miss.
    assert_eq!(shared.looks(), (1, 1));
}

/// On a runtime with several threads the reader can run between an ask's flag and its wake: it
/// makes the look and leaves its waker again, and the wake then takes that waker. The reader
/// must leave its waker again at the poll that wake causes, or the next ask wakes nobody.
#[tokio::test(flavor = "current_thread")]
async fn a_waker_taken_after_the_reader_left_it_again_is_left_once_more() {
    let (mut reader, _theirs, shared, count, waker) = looking_reader(Duration::ZERO).await;
    let mut buf = [0u8; 64];
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());

    // The ask raises its flag; the reader runs in between, looks, and leaves its waker again.
    assert!(shared.raise());
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!(shared.looks(), (1, 0));
    // The ask's wake takes the waker the reader just left, and wakes it (for nothing).
    shared.wake_reader();
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    // The next ask still wakes the reader.
    shared.ask();
    assert_eq!(count.0.load(Ordering::SeqCst), 2, "the reader's waker was not left again");
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!(shared.looks(), (2, 0));
}

/// Inside a busy-poll window, a poll that finds nothing wakes the reader again at once, and the
/// next poll reads the socket whatever the runtime's readiness says; a window that ran out
/// sleeps on readiness until bytes arrive.
#[tokio::test(flavor = "current_thread")]
async fn inside_a_busy_poll_window_the_reader_wakes_itself_and_reads_the_socket() {
    let (mut reader, mut theirs, shared, count, waker) = looking_reader(Duration::from_millis(300)).await;
    let mut buf = [0u8; 64];

    // Nothing there: the reader spins (wakes itself), counted.
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!((count.0.load(Ordering::SeqCst), shared.spins()), (1, 1));
    // The peer's bytes lie in our socket; the spun poll reads them with no turn of the runtime's
    // I/O driver in between. No look was asked for: none is counted.
    theirs.write_all(b"the answer").await.unwrap();
    match poll_read(&mut reader, &waker, &mut buf) {
        Poll::Ready(Ok(n)) => assert_eq!(&buf[..n], b"the answer"),
        other => panic!("the spin did not read the answer: {other:?}"),
    }
    assert_eq!(shared.looks(), (0, 0));

    // A window that runs out: the reader then sleeps (no more self-wakes) until bytes arrive.
    let (mut reader, mut theirs, shared, count, waker) = looking_reader(Duration::from_micros(1)).await;
    let mut polls = 0;
    while poll_read(&mut reader, &waker, &mut buf).is_pending() && count.0.load(Ordering::SeqCst) > polls {
        polls += 1;
        assert!(polls <= 256, "the window never ran out");
        // Every clock reading then finds the window past.
        std::thread::sleep(Duration::from_micros(20));
    }
    assert!(polls >= 1, "the window did not open");
    let spent = shared.spins();
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!(shared.spins(), spent, "a spent window spun again");
    // Bytes arrive (read through the runtime's readiness once it reports them): a new window.
    theirs.write_all(b"more").await.unwrap();
    let n =
        tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut reader, &mut buf))
            .await
            .expect("the sleeping reader was not woken by readiness")
            .unwrap();
    assert_eq!(&buf[..n], b"more");
    let woken = count.0.load(Ordering::SeqCst);
    assert!(poll_read(&mut reader, &waker, &mut buf).is_pending());
    assert_eq!(count.0.load(Ordering::SeqCst), woken + 1, "no window after an arrival");
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use super::*;

struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker that counts its wake-ups, and the count.
fn counting_waker() -> (Arc<CountingWaker>, Waker) {
    let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
    (counter.clone(), Waker::from(counter))
}

fn params(depth: u32, size: u32) -> ConnParams {
    ConnParams { recv_depth: depth, recv_size: size, ..ConnParams::default() }
}

fn drain(soft: &Soft) -> (Vec<Completion>, Poll<Result<(), TransportError>>) {
    let waker = Waker::from(Arc::new(CountingWaker(AtomicUsize::new(0))));
    let mut cx = Context::from_waker(&waker);
    let mut out = Vec::new();
    loop {
        match soft.poll_completions(&mut cx, &mut out, 16) {
            Poll::Ready(Ok(())) => continue,
            other => return (out, other),
        }
    }
}

fn recv_bytes(c: &Completion) -> Vec<u8> {
    match c {
        Completion::Recv { buf } => buf.bytes().to_vec(),
        other => panic!("expected a receive, got {other:?}"),
    }
}

#[test]
fn initial_receives_are_posted_and_counted() {
    let soft = Soft::new(&params(3, 16));
    assert_eq!(soft.counters().recvs_posted, 3);
    for i in 0..3u8 {
        soft.deliver(&[i]).unwrap();
    }
    let (done, state) = drain(&soft);
    assert!(state.is_pending());
    assert_eq!(done.iter().map(recv_bytes).collect::<Vec<_>>(), vec![vec![0], vec![1], vec![2]]);
    assert_eq!(soft.counters().recvs, 3);
    assert_eq!(soft.counters().recv_unexpected, 0);
}

#[test]
fn unexpected_messages_wait_for_receives_in_order() {
    let soft = Soft::new(&params(1, 16));
    for msg in [&b"a"[..], b"b", b"c"] {
        soft.deliver(msg).unwrap();
    }
    assert_eq!(soft.counters().recv_unexpected, 2);
    let (first, _) = drain(&soft);
    assert_eq!(first.iter().map(recv_bytes).collect::<Vec<_>>(), vec![b"a".to_vec()]);
    soft.post_recv(RecvBuffer::new(16)).unwrap();
    soft.post_recv(RecvBuffer::new(16)).unwrap();
    soft.post_recv(RecvBuffer::new(16)).unwrap();
    soft.deliver(b"d").unwrap();
    let (rest, _) = drain(&soft);
    assert_eq!(
        rest.iter().map(recv_bytes).collect::<Vec<_>>(),
        vec![b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
    );
    assert_eq!(soft.counters().recv_unexpected, 2, "d found a posted receive");
}

#[test]
fn unbounded_overrun_kills_the_endpoint() {
    let soft = Soft::new(&params(2, 16));
    for _ in 0..2 + 64 {
        soft.deliver(b"m").unwrap();
    }
    assert_eq!(soft.counters().recv_unexpected, 64);
    assert!(matches!(soft.deliver(b"one too many"), Err(Death::Malformed(_))));
    let (done, state) = drain(&soft);
    assert_eq!(done.len(), 2, "the two delivered messages stay readable");
    assert!(matches!(state, Poll::Ready(Err(TransportError::Malformed(_)))));
}

#[test]
fn oversized_message_kills_the_endpoint_as_malformed() {
    let soft = Soft::new(&params(1, 4));
    assert!(matches!(soft.deliver(b"12345"), Err(Death::Malformed(_))));
    let (done, state) = drain(&soft);
    assert!(done.is_empty());
    assert!(matches!(state, Poll::Ready(Err(TransportError::Malformed(_)))));
}

#[test]
fn death_flushes_pending_operations_in_order_then_errors_forever() {
    let soft = Soft::new(&params(2, 16));
    let region = RegionDesc { addr: 0x1000, len: 4, rkey: 7 };
    let s1 = soft.begin_send(10).unwrap();
    let r1 = soft.begin_read(11, region, vec![0; 4].into()).unwrap();
    let _s2 = soft.begin_send(12).unwrap();
    soft.complete_send(s1, Ok(()));
    assert!(soft.take_read(r1).is_some(), "a backend holds the destination while the peer dies");

    soft.fail(Death::Closed("peer gone".into()));
    soft.fail(Death::Malformed("second death is ignored".into()));
    soft.complete_read(r1, Ok(vec![1; 4].into())); // arrives too late: already flushed

    let (done, state) = drain(&soft);
    let summary: Vec<String> = done
        .iter()
        .map(|c| match c {
            Completion::Send { wr_id, result } => format!("send {wr_id} {}", result.is_ok()),
            Completion::Read { wr_id, result } => format!("read {wr_id} {result:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(summary, ["send 10 true", "read 11 Err(Flushed)", "send 12 false"]);
    match state {
        Poll::Ready(Err(TransportError::Disconnected(reason))) => assert_eq!(reason, "peer gone"),
        other => panic!("expected Disconnected, got {other:?}"),
    }
    let (more, again) = drain(&soft);
    assert!(more.is_empty());
    assert!(matches!(again, Poll::Ready(Err(TransportError::Disconnected(_)))));
    assert!(matches!(soft.begin_send(13), Err(TransportError::Disconnected(_))));
    assert!(matches!(soft.post_recv(RecvBuffer::new(1)), Err(TransportError::Disconnected(_))));
    assert_eq!(soft.serve_read(0, 0, 1), Err(ReadError::Flushed));
}

#[test]
fn direct_sends_are_recorded_only_when_queued_and_complete_once_if_the_endpoint_dies() {
    let soft = Soft::new(&params(2, 16));
    soft.begin_direct_sends(3).unwrap();
    assert_eq!((soft.counters().sends, soft.counters().sends_direct), (3, 3));
    // 20 written whole: complete, never pending. 21 goes to the writer: pending, and no longer
    // direct. 22 goes to the writer after the endpoint died: not recorded, flushed.
    soft.complete_direct_send(20);
    let queued = soft.record_direct_send(21).expect("alive: recorded");
    soft.fail(Death::Closed("peer gone".into()));
    assert_eq!(soft.record_direct_send(22), None, "dead: the frame must be dropped");
    soft.complete_send(queued, Ok(())); // the writer, too late: already flushed
    let (done, _) = drain(&soft);
    let summary: Vec<(WrId, bool)> = done
        .iter()
        .map(|c| match c {
            Completion::Send { wr_id, result } => (*wr_id, result.is_ok()),
            other => panic!("expected a SEND, got {other:?}"),
        })
        .collect();
    assert_eq!(summary, [(20, true), (21, false), (22, false)], "each SEND completes exactly once");
    assert_eq!((soft.counters().sends, soft.counters().sends_direct), (3, 1));
    assert!(matches!(soft.begin_direct_sends(1), Err(TransportError::Disconnected(_))));
}

#[test]
fn queued_completion_wakes_the_registered_poller() {
    let soft = Soft::new(&params(1, 16));
    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    let mut out = Vec::new();
    assert!(soft.poll_completions(&mut cx, &mut out, 8).is_pending());
    soft.deliver(b"x").unwrap();
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    assert!(soft.poll_completions(&mut cx, &mut out, 8).is_ready());
    assert!(soft.poll_completions(&mut cx, &mut out, 8).is_pending());
    soft.fail(Death::Closed("bye".into()));
    assert_eq!(counter.0.load(Ordering::SeqCst), 2, "death wakes the poller");
}

#[test]
fn a_run_of_messages_and_a_batch_of_receives_go_in_order_under_one_lock_and_one_wake() {
    let soft = Soft::new(&params(2, 16));
    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    let mut out = Vec::new();
    assert!(soft.poll_completions(&mut cx, &mut out, 8).is_pending());
    // Four messages for two posted receives: two wait (unexpected) until receives come.
    let mut run = [&b"a"[..], b"b", b"c", b"d"].into_iter();
    soft.deliver_run(|| run.next()).unwrap();
    assert_eq!(counter.0.load(Ordering::SeqCst), 1, "one wake for the run");
    assert_eq!(soft.counters().recv_unexpected, 2);
    let mut bufs = vec![RecvBuffer::new(16), RecvBuffer::new(16), RecvBuffer::new(16)];
    soft.post_recv_batch(&mut bufs).unwrap();
    assert!(bufs.is_empty(), "all posted");
    assert_eq!(soft.counters().recvs_posted, 5);
    let (done, _) = drain(&soft);
    assert_eq!(done.iter().map(recv_bytes).collect::<Vec<_>>(), [b"a", b"b", b"c", b"d"].map(|m| m.to_vec()));
    // The third receive of the batch stays posted for the next message.
    soft.deliver(b"e").unwrap();
    assert_eq!(drain(&soft).0.iter().map(recv_bytes).collect::<Vec<_>>(), vec![b"e".to_vec()]);
    // A message that does not fit stops the run and kills the endpoint; those before it stay.
    soft.post_recv_batch(&mut vec![RecvBuffer::new(16), RecvBuffer::new(16)]).unwrap();
    let mut run = [&b"f"[..], &[0u8; 17][..], b"g"].into_iter();
    assert!(matches!(soft.deliver_run(|| run.next()), Err(Death::Malformed(_))));
    assert_eq!(run.next(), Some(&b"g"[..]), "nothing after the bad message is taken");
    assert!(soft.is_dead());
    assert!(
        soft.post_recv_batch(&mut vec![RecvBuffer::new(16)]).is_err(),
        "a dead endpoint refuses receives"
    );
}

#[test]
fn a_poll_that_found_nothing_is_repeated_without_the_lock_until_something_comes() {
    let soft = Soft::new(&params(2, 16));
    let ((a, wa), (b, wb)) = (counting_waker(), counting_waker());
    let mut out = Vec::new();
    assert!(soft.poll_completions(&mut Context::from_waker(&wa), &mut out, 8).is_pending());
    // The same waker again, with the state locked elsewhere: answered without the lock.
    let (tx, rx) = std::sync::mpsc::channel();
    let guard = soft.state.lock();
    std::thread::scope(|s| {
        let (soft, wa) = (&soft, wa.clone());
        s.spawn(move || {
            let mut out = Vec::new();
            let _ = tx.send(soft.poll_completions(&mut Context::from_waker(&wa), &mut out, 8).is_pending());
        });
        let answered = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(guard);
        assert_eq!(answered, Ok(true), "answered Pending without waiting for the lock");
    });
    // Another waker takes the lock and is the one woken from then on.
    assert!(soft.poll_completions(&mut Context::from_waker(&wb), &mut out, 8).is_pending());
    soft.deliver(b"x").unwrap();
    assert_eq!((a.0.load(Ordering::SeqCst), b.0.load(Ordering::SeqCst)), (0, 1));
    // After a delivery the fast answer is off: the completion is found.
    assert!(soft.poll_completions(&mut Context::from_waker(&wb), &mut out, 8).is_ready());
    assert_eq!(out.len(), 1);
    assert!(soft.poll_completions(&mut Context::from_waker(&wb), &mut out, 8).is_pending());
    // Death too.
    soft.fail(Death::Closed("bye".into()));
    assert_eq!(b.0.load(Ordering::SeqCst), 2);
    assert!(matches!(soft.poll_completions(&mut Context::from_waker(&wb), &mut out, 8), Poll::Ready(Err(_))));
}

/// Wakes a thread parked in [`std::thread::park_timeout`].
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Another thread queues completions while the poller polls and waits: no wake-up is lost.
#[test]
fn no_wakeup_is_lost_between_threads() {
    const MESSAGES: u32 = 20_000;
    let soft = Soft::new(&params(MESSAGES, 8));
    let sender = {
        let soft = soft.clone();
        std::thread::spawn(move || {
            for i in 0..MESSAGES {
                soft.deliver(&i.to_le_bytes()).unwrap();
                if i % 64 == 0 {
                    std::thread::yield_now();
                }
            }
        })
    };
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut out = Vec::new();
    let mut parks = 0u32;
    while out.len() < MESSAGES as usize {
        if soft.poll_completions(&mut cx, &mut out, 64).is_pending() {
            // Pending: only a wake-up (or a spurious return) ends the wait; a lost one would
            // leave us here for the whole timeout.
            let started = std::time::Instant::now();
            std::thread::park_timeout(std::time::Duration::from_secs(10));
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "a wake-up was lost");
            parks += 1;
            assert!(parks <= MESSAGES + 1, "bounded: at most one wait per message");
        }
    }
    sender.join().unwrap();
    let got: Vec<u32> =
        out.iter().map(|c| u32::from_le_bytes(recv_bytes(c).try_into().expect("4 bytes"))).collect();
    assert_eq!(got, (0..MESSAGES).collect::<Vec<_>>(), "every message, in order");
}

#[test]
fn poll_moves_at_most_max() {
    let soft = Soft::new(&params(4, 16));
    for _ in 0..4 {
        soft.deliver(b"m").unwrap();
    }
    let waker = Waker::from(Arc::new(CountingWaker(AtomicUsize::new(0))));
    let mut cx = Context::from_waker(&waker);
    let mut out = Vec::new();
    assert!(soft.poll_completions(&mut cx, &mut out, 3).is_ready());
    assert_eq!(out.len(), 3);
    assert!(soft.poll_completions(&mut cx, &mut out, 3).is_ready());
    assert_eq!(out.len(), 4);
}

#[test]
fn serve_read_counts_served_and_refused() {
    let soft = Soft::new(&params(1, 16));
    let desc = soft.register(Bytes::from_static(b"abcdef"));
    assert_eq!(&soft.serve_read(desc.addr + 1, 2, desc.rkey).unwrap()[..], b"bc");
    assert!(soft.serve_read(desc.addr, 7, desc.rkey).is_err());
    soft.deregister(desc.rkey).unwrap();
    assert!(matches!(soft.deregister(desc.rkey), Err(TransportError::UnknownKey(_))));
    assert_eq!(soft.serve_read(desc.addr, 1, desc.rkey), Err(ReadError::InvalidKey(desc.rkey)));
    let c = soft.counters();
    assert_eq!((c.reads_served, c.reads_refused, c.regions_registered, c.regions_revoked), (1, 2, 1, 1));
}

#[test]
fn params_are_validated() {
    assert!(validate_params(&ConnParams::default()).is_ok());
    assert!(validate_params(&params(0, 16)).is_err());
    assert!(validate_params(&params(1, 0)).is_err());
    assert!(validate_params(&params(1, MAX_RECV_SIZE + 1)).is_err());
    let big = ConnParams { private_data: Bytes::from(vec![0; MAX_PRIVATE_DATA + 1]), ..Default::default() };
    assert!(matches!(validate_params(&big), Err(TransportError::Handshake(_))));
}

#[test]
fn reads_completed_at_once_wait_for_earlier_reads_and_die_with_them() {
    let soft = Soft::new(&ConnParams::default());
    let remote = RegionDesc { addr: 0, len: 2, rkey: 1 };
    let first = soft.begin_read(1, remote, vec![0; 2].into()).unwrap();
    soft.read_at_once(2, remote, b"pp".to_vec().into()).unwrap();
    soft.read_at_once(3, remote, b"qq".to_vec().into()).unwrap();
    let (done, _) = drain(&soft);
    assert!(done.is_empty(), "held back by READ 1: {done:?}");
    soft.complete_read(first, Ok(b"ab".to_vec().into()));
    let (done, _) = drain(&soft);
    let ids: Vec<u64> = done
        .iter()
        .map(|c| match c {
            Completion::Read { wr_id, result: Ok(_) } => *wr_id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, [1, 2, 3], "in posting order");
    assert_eq!(soft.counters().bytes_read, 6);

    // Behind a READ that fails, they are flushed with the connection.
    let first = soft.begin_read(4, remote, vec![0; 2].into()).unwrap();
    soft.read_at_once(5, remote, b"rr".to_vec().into()).unwrap();
    soft.complete_read(first, Err(ReadError::InvalidKey(1)));
    soft.fail(Death::Closed("refused".into()));
    let (done, _) = drain(&soft);
    assert!(
        matches!(
            &done[..],
            [
                Completion::Read { wr_id: 4, result: Err(ReadError::InvalidKey(1)) },
                Completion::Read { wr_id: 5, result: Err(ReadError::Flushed) },
            ]
        ),
        "{done:?}"
    );
}

#[test]
fn arming_leaves_the_waker_only_when_nothing_is_queued_and_takes_nothing() {
    // Receives for every message below.
    let soft = Soft::new(&params(4, 16));
    let ((a, wa), (b, wb)) = (counting_waker(), counting_waker());
    let mut out = Vec::new();
    // Something queued: not armed, and nothing is taken (nor is anyone woken).
    soft.deliver(b"x").unwrap();
    assert!(!soft.arm(&wa), "a completion is queued");
    assert_eq!(a.0.load(Ordering::SeqCst), 0);
    assert!(soft.poll_completions(&mut Context::from_waker(&wa), &mut out, 8).is_ready());
    assert_eq!(out.iter().map(recv_bytes).collect::<Vec<_>>(), vec![b"x".to_vec()]);
    // Emptied by that poll, which left no waker: arming leaves this one, and the next
    // completion wakes it, once.
    assert!(soft.arm(&wa));
    assert!(soft.arm(&wa), "armed already: again true");
    soft.deliver(b"y").unwrap();
    assert_eq!(a.0.load(Ordering::SeqCst), 1);
    assert!(!soft.arm(&wa), "the delivery is queued");
    assert!(soft.poll_completions(&mut Context::from_waker(&wa), &mut out, 8).is_ready());
    // Armed for `a`, a poll with `a` answers Pending without a look; arming with `b` moves the
    // wake-up to `b`.
    assert!(soft.arm(&wa));
    assert!(soft.poll_completions(&mut Context::from_waker(&wa), &mut out, 8).is_pending());
    assert!(soft.arm(&wb));
    soft.deliver(b"z").unwrap();
    assert_eq!((a.0.load(Ordering::SeqCst), b.0.load(Ordering::SeqCst)), (1, 1));
    // A dead endpoint is not armed: its error is for a poll to take.
    assert!(soft.poll_completions(&mut Context::from_waker(&wb), &mut out, 8).is_ready());
    soft.fail(Death::Closed("bye".into()));
    assert!(!soft.arm(&wb));
    assert!(matches!(soft.poll_completions(&mut Context::from_waker(&wb), &mut out, 8), Poll::Ready(Err(_))));
}

//! `poll_op`'s quick "nothing to do" ([`Link::has_work`]) against the full path
//! ([`Link::poll_op_slow`]): random sequences of everything that moves a link's credits, queues,
//! keepalive and READs, run on two links, one polled the quick way and one the full way. Both
//! must yield the same operations and reach the same state at every step, and the quick look
//! must be exact: it says "nothing" exactly when the full path yields nothing and changes
//! nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use rpc_transport::RegionDesc;

use crate::proto::link::{Body, Link, Role};
use crate::proto::*;

/// One input to a link.
#[derive(Debug, Clone)]
enum Input {
    /// A frame arrives, returning `credits`.
    Receive { kind: Kind, credits: u16 },
    /// A data frame is queued (as `Body::Framed` when `framed`).
    Queue { framed: bool },
    /// A finished READ of the peer's region is to be reported.
    ReportDone,
    /// The oldest SEND completes.
    SendComplete,
    /// Time passes and the timers run (may make a ping due).
    Advance { ms: u64 },
    /// A READ of `len` bytes is queued.
    QueueRead { len: u64 },
    /// The oldest READ issued completes.
    ReadComplete,
    /// The endpoint's budget is taken or given back (another connection's READs).
    Shared { take: bool },
    /// `poll_op` up to `n` times.
    Poll { n: usize },
}

fn input() -> impl Strategy<Value = Input> {
    let kind = prop_oneof![
        Just(Kind::Request),
        Just(Kind::Response),
        Just(Kind::Credit),
        Just(Kind::Ping),
        Just(Kind::Pong),
    ];
    prop_oneof![
        3 => (kind, 0u16..4).prop_map(|(kind, credits)| Input::Receive { kind, credits }),
        3 => any::<bool>().prop_map(|framed| Input::Queue { framed }),
        1 => Just(Input::ReportDone),
        2 => Just(Input::SendComplete),
        1 => (0u64..3000).prop_map(|ms| Input::Advance { ms }),
        1 => (1u64..3000).prop_map(|len| Input::QueueRead { len }),
        1 => Just(Input::ReadComplete),
        1 => any::<bool>().prop_map(|take| Input::Shared { take }),
        4 => (1usize..4).prop_map(|n| Input::Poll { n }),
    ]
}

/// A link and what the test keeps of its outputs (SENDs and READs not yet completed).
struct End {
    link: Link,
    sends: usize,
    reads: Vec<u64>,
}

fn end(role: Role, depth: u32, queued: u32, reads: u32, now: Instant, shared: &Arc<SharedBudget>) -> End {
    let config = ProtoConfig::default()
        .recv_depth(depth)
        .max_queued_frames(queued)
        .max_rendezvous_bytes(4096)
        .keepalive_interval(Duration::from_secs(1));
    let peer = PeerLimits {
        recv_depth: depth,
        recv_size: config.recv_size(),
        hello: config.hello(),
        max_reads_in_flight: reads,
        max_read_size: 1 << 20,
    };
    let mut link = Link::new(role, &config, &peer, now);
    link.rdv.budget.set_shared(shared.clone());
    End { link, sends: 0, reads: Vec::new() }
}

impl End {
    /// Applies an input other than `Poll`; errors (a credit violation, a silent peer) would close
    /// the connection, but the link's state is still a state `poll_op` may meet.
    fn apply(&mut self, input: &Input, now: Instant, call_id: u64) {
        let link = &mut self.link;
        match *input {
            Input::Receive { kind, credits } => {
                let mut h = Header::new(kind);
                h.credits = credits;
                let _ = link.on_frame_received(&h, now);
            }
            Input::Queue { framed } => {
                let mut h = Header::new(Kind::Request);
                h.call_id = call_id;
                match framed {
                    true => {
                        let buf = link.frame_buffer(&[b"framed body"]);
                        link.queue_body(h, Body::Framed(buf));
                    }
                    false => link.queue(h, Bytes::from_static(b"body")),
                }
            }
            Input::ReportDone => link.report_done(call_id),
            Input::SendComplete => {
                if self.sends > 0 {
                    self.sends -= 1;
                    let _ = link.on_send_complete(Ok(()));
                }
            }
            Input::Advance { .. } => {
                let _ = link.check_timeouts(now);
            }
            Input::QueueRead { len } => {
                link.rdv.queue_read(call_id, RegionDesc { addr: 0x1000, len, rkey: 7 });
            }
            Input::ReadComplete => {
                if !self.reads.is_empty() {
                    let wr_id = self.reads.remove(0);
                    link.rdv.read_complete(wr_id);
                }
            }
            Input::Shared { .. } | Input::Poll { .. } => unreachable!("applied by the caller"),
        }
    }

    fn took(&mut self, op: &Option<Op>) {
        match op {
            Some(Op::Send { .. }) => self.sends += 1,
            Some(Op::Read { wr_id, .. }) => self.reads.push(*wr_id),
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_quick_look_is_exact_and_changes_nothing(
        server in any::<bool>(),
        depth in 1u32..6,
        queued in 1u32..5,
        reads in 1u32..3,
        inputs in proptest::collection::vec(input(), 1..120),
    ) {
        let role = if server { Role::Server } else { Role::Client };
        let mut now = Instant::now();
        // Each link's endpoint budget; `held` is what "other connections" took of each.
        let shared = [SharedBudget::new(4096), SharedBudget::new(4096)];
        let mut held = 0u64;
        let mut quick = end(role, depth, queued, reads, now, &shared[0]);
        let mut full = end(role, depth, queued, reads, now, &shared[1]);
        for (i, input) in inputs.iter().enumerate() {
            let call_id = i as u64 + 1;
            match *input {
                Input::Poll { n } => {
                    for _ in 0..n {
                        // Exactness, on the full link (in the same state as the quick one): the
                        // quick look says "nothing" exactly when the full path does nothing.
                        let quiet = !full.link.has_work();
                        prop_assert_eq!(quiet, !quick.link.has_work());
                        let before = full.link.fingerprint();
                        let b = full.link.poll_op_slow();
                        let changed = before != full.link.fingerprint();
                        prop_assert_eq!(quiet, b.is_none() && !changed, "quiet {} op {:?}", quiet, b);
                        let a = quick.link.poll_op();
                        prop_assert_eq!(&a, &b);
                        prop_assert_eq!(quick.link.fingerprint(), full.link.fingerprint());
                        quick.took(&a);
                        full.took(&b);
                    }
                }
                Input::Shared { take } => {
                    // The links' READs count on their endpoint's budget too; take or give back
                    // a share of the rest, as other connections would (the same on both).
                    let (q, f) = (&shared[0], &shared[1]);
                    if take && q.held() + 1024 <= q.limit() {
                        prop_assert!(q.try_reserve(1024) && f.try_reserve(1024));
                        held += 1024;
                    } else if !take && held > 0 {
                        q.release(1024);
                        f.release(1024);
                        held -= 1024;
                    }
                }
                Input::Advance { ms } => {
                    now += Duration::from_millis(ms);
                    quick.apply(input, now, call_id);
                    full.apply(input, now, call_id);
                }
                _ => {
                    quick.apply(input, now, call_id);
                    full.apply(input, now, call_id);
                }
            }
            prop_assert_eq!(quick.link.fingerprint(), full.link.fingerprint());
        }
    }
}

/// The quick look returns at once on the states the driver polls most: nothing queued, credits
/// to spare, nothing to report; and it sees each kind of work.
#[test]
fn the_quick_look_sees_each_kind_of_work() {
    let shared = SharedBudget::new(1 << 20);
    let now = Instant::now();
    let mut e = end(Role::Client, 8, 4, 2, now, &shared);
    assert!(!e.link.has_work(), "a new link has nothing to do");
    assert_eq!(e.link.poll_op(), None);

    e.link.queue(Header::new(Kind::Request), Bytes::from_static(b"x"));
    assert!(e.link.has_work(), "a queued frame");
    assert!(matches!(e.link.poll_op(), Some(Op::Send { .. })));
    assert!(!e.link.has_work());

    e.link.report_done(9);
    assert!(e.link.has_work(), "a done report");
    assert!(matches!(e.link.poll_op(), Some(Op::Send { .. })));

    e.link.rdv.queue_read(3, RegionDesc { addr: 1, len: 10, rkey: 2 });
    assert!(e.link.has_work(), "a READ to issue");
    assert!(matches!(e.link.poll_op(), Some(Op::Read { .. })));

    let ping = Header::new(Kind::Ping);
    e.link.on_frame_received(&ping, now).expect("within credits");
    assert!(e.link.has_work(), "a pong due");
    assert!(matches!(e.link.poll_op(), Some(Op::Send { .. })));

    // Credits to return reach the threshold (half the receive depth): a credit frame.
    let credit = Header::new(Kind::Credit);
    for _ in 0..3 {
        e.link.on_frame_received(&credit, now).expect("within credits");
        assert!(!e.link.has_work(), "credits to return below the threshold");
    }
    e.link.on_frame_received(&credit, now).expect("within credits");
    assert!(e.link.has_work(), "credits to return");
    assert!(matches!(e.link.poll_op(), Some(Op::Send { .. })));
    assert!(!e.link.has_work());
    assert_eq!(e.link.poll_op(), None);
}

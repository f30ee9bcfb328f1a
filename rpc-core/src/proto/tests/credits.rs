//! The credit rule's exception (a queued frame may take the last credit when it returns credits
//! itself; see `proto::link`): a batch as deep as the peer's receive queue leaves whole, and no
//! interleaving of the two ends' work ever overruns a receive queue or stops both ends.

use proptest::prelude::*;

use super::harness::{config, payload, Pair};
use super::{assert_clean, round_trip, T};

#[test]
fn a_batch_as_deep_as_the_receive_queue_leaves_whole_both_ways() {
    for (depth, batched) in [4u32, 8, 64].into_iter().flat_map(|d| [(d, false), (d, true)]) {
        let mut p = Pair::with(T, depth);
        p.batched = batched;
        // Before any frame came in, a side has no re-post to report, so its batch stops at the
        // last credit once; a round trip gives the client one.
        round_trip(&mut p, 1, 16, 16);
        let mut id = 1;
        for round in 0..5 {
            for _ in 0..depth {
                id += 1;
                p.call(id, payload(16, id as u8));
            }
            let sent = p.client_sends;
            p.client_ops();
            assert_eq!(
                p.client_sends - sent,
                depth as usize,
                "depth {depth}, round {round}: every request leaves in the client's batch"
            );
            p.deliver_to_server(usize::MAX);
            let requests = p.take_requests();
            assert_eq!(requests.len(), depth as usize);
            for (call_id, body, _) in requests {
                assert!(p.server.respond(call_id, Ok(body)));
            }
            let sent = p.server_sends;
            p.server_ops();
            assert_eq!(
                p.server_sends - sent,
                depth as usize,
                "depth {depth}, round {round}: every response leaves in the server's batch"
            );
            p.deliver_to_client(usize::MAX);
            assert_eq!(p.take_completions().len(), depth as usize);
        }
        assert_eq!(p.client.stats().credit_stalls, 0, "depth {depth}: no request waited for credits");
        assert_eq!(p.server.stats().credit_stalls, 0, "depth {depth}: no response waited for credits");
        assert_eq!(p.client.stats().credit_frames + p.server.stats().credit_frames, 0);
        assert_clean(&p);
    }
}

/// One step of the two ends' work, in an order the test chooses.
#[derive(Debug, Clone)]
enum Step {
    /// The client starts this many calls.
    Start(usize),
    /// The client posts what it has to post.
    ClientOps,
    /// The server posts what it has to post.
    ServerOps,
    /// The server handles at most this many frames that reached it.
    ToServer(usize),
    /// The client handles at most this many frames that reached it.
    ToClient(usize),
    /// The server answers one request it has (which one: this index, modulo how many).
    Respond(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1usize..5).prop_map(Step::Start),
        3 => Just(Step::ClientOps),
        3 => Just(Step::ServerOps),
        3 => (1usize..5).prop_map(Step::ToServer),
        3 => (1usize..5).prop_map(Step::ToClient),
        3 => (0usize..8).prop_map(Step::Respond),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any interleaving, with operations taken one by one or as the driver batches them: no
    /// SEND meets an empty receive queue, no frame breaks a credit rule (the harness fails on
    /// any frame an end rejects), and once both ends just keep working, every call completes:
    /// the ends never both wait for credits. A server that withholds credits (a short
    /// `max_queued_frames`) is in the mix.
    #[test]
    fn no_interleaving_overruns_a_receive_queue_or_stalls_both_ends(
        client_depth in 4u32..9,
        server_depth in 4u32..9,
        server_queue in 1u32..6,
        batched in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..150),
    ) {
        let mut p = Pair::new(
            config(T, client_depth),
            config(T, server_depth).max_queued_frames(server_queue),
        );
        p.batched = batched;
        let mut started = 0u64;
        let mut completed = 0usize;
        let mut requests = Vec::new();
        for step in &steps {
            match *step {
                Step::Start(n) => {
                    for _ in 0..n {
                        started += 1;
                        p.call(started, payload(16, started as u8));
                    }
                }
                Step::ClientOps => {
                    p.client_ops();
                }
                Step::ServerOps => {
                    p.server_ops();
                }
                Step::ToServer(n) => {
                    p.deliver_to_server(n);
                }
                Step::ToClient(n) => {
                    p.deliver_to_client(n);
                }
                Step::Respond(i) => {
                    requests.extend(p.take_requests());
                    if !requests.is_empty() {
                        let (call_id, body, _) = requests.swap_remove(i % requests.len());
                        prop_assert!(p.server.respond(call_id, Ok(body)));
                    }
                }
            }
            completed += p.take_completions().len();
        }
        // Both ends keep working and the server answers whatever reaches it: bounded, and a
        // round that moves nothing with calls still open is a deadlock.
        for _ in 0..10_000 {
            if completed as u64 == started {
                break;
            }
            let mut moved = p.client_ops() + p.server_ops();
            moved += p.deliver_to_server(usize::MAX) + p.deliver_to_client(usize::MAX);
            requests.extend(p.take_requests());
            for (call_id, body, _) in requests.drain(..) {
                prop_assert!(p.server.respond(call_id, Ok(body)));
                moved += 1;
            }
            let done = p.take_completions().len();
            completed += done;
            prop_assert!(moved + done > 0, "both ends wait with {} of {} calls open", started - completed as u64, started);
        }
        prop_assert_eq!(completed as u64, started);
        assert_clean(&p);
    }
}

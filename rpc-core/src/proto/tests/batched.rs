//! The driver takes a state machine's SENDs straight into its batch (`poll_op_into`), the other
//! operations one by one; tests and tools take everything with `poll_op`. Both must send the
//! same frames in the same order.

use super::harness::{payload, Pair};
use super::{assert_clean, HEADER_LEN, T};

/// A frame as compared: its header, and its length.
type Seen = (Vec<u8>, usize);

/// Runs a fixed mix of calls (eager and rendezvous both ways, bursts deeper than the receive
/// queue, a cancel, keepalive) and returns the frames each side was sent: the header and the
/// length of each (a rendezvous body holds buffer addresses, which differ from run to run).
fn frames_sent(batched: bool) -> (Vec<Seen>, Vec<Seen>) {
    let mut p = Pair::with(T, 8);
    p.batched = batched;
    let sizes = [16, T + 100, 0, 3 * T, 200, T];
    let mut id = 0u64;
    for burst in 0..6 {
        for k in 0..(3 + 2 * burst) {
            id += 1;
            p.call(id, payload(sizes[(id as usize + k) % sizes.len()], id as u8));
        }
        if burst == 2 {
            assert!(p.client.cancel(id), "the last call of the burst is in progress");
        }
        p.pump();
        for (call_id, body, _) in p.take_requests() {
            let len = sizes[(call_id as usize * 7) % sizes.len()];
            let answer = if call_id % 5 == 0 { body } else { payload(len, call_id as u8) };
            p.server.respond(call_id, Ok(answer));
        }
        p.pump();
        p.take_completions();
        // Long enough for a keepalive ping and its pong.
        p.now += std::time::Duration::from_secs(20);
        p.client.handle_timeout(p.now).expect("client timeout");
        p.server.handle_timeout(p.now).expect("server timeout");
        p.pump();
    }
    p.pump();
    assert_clean(&p);
    // What the run covered, on each end: frames that waited for credits and credit frames,
    // rendezvous both ways (READs, revocations), pings, and the cancel.
    for stats in [p.client.stats(), p.server.stats()] {
        assert!(stats.credit_stalls > 0 && stats.credit_frames > 0, "{stats:?}");
        assert!(stats.rendezvous_sent > 0 && stats.reads_issued > 0 && stats.keys_revoked > 0, "{stats:?}");
        assert!(stats.pings_sent > 0, "{stats:?}");
    }
    assert_eq!(p.client.stats().cancels, 1);
    let heads =
        |frames: &[bytes::Bytes]| frames.iter().map(|f| (f[..HEADER_LEN].to_vec(), f.len())).collect();
    (heads(&p.s.delivered), heads(&p.c.delivered))
}

#[test]
fn the_drivers_batches_send_the_same_frames_in_the_same_order() {
    let (to_server, to_client) = frames_sent(false);
    assert!(to_server.len() > 60 && to_client.len() > 60, "a run of some length");
    let (batched_to_server, batched_to_client) = frames_sent(true);
    assert_eq!(batched_to_server, to_server, "frames to the server");
    assert_eq!(batched_to_client, to_client, "frames to the client");
}

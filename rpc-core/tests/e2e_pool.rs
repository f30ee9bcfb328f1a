//! Registered memory in steady state, over every transport: repeated calls take every buffer
//! from the connections' pools (no new chunk, so no registration on rdma), nothing is copied
//! into or registered from memory outside the pools, and what a call receives (eager or by READ)
//! is handed on where it landed (a `Bytes` value of more than 1 KiB; a smaller one is copied
//! out, its buffer back in the pool at once). Prints `registrations per call (steady state): N` (the rdma
//! suite shows it per device).

mod common;

use bytes::Bytes;
use common::{pattern, setup_with, Kind, THRESHOLD};
use rpc_core::codec;
use rpc_core::transport::{KeyPolicy, TransportCounters};
use rpc_core::{CallOptions, ClientConfig, ServerConfig};

const SIZES: [usize; 4] = [32, 2 * THRESHOLD, 64 << 10, 1 << 20];
/// The largest `Bytes` value decoded by a copy rather than as a slice of the message (1 KiB, as
/// `rpc_core::codec::SharedBytes` documents).
const SMALL: usize = 1024;
const WARMUP: usize = 4;
const ROUNDS: usize = 16;
const BATCHES: usize = 4;

fn sum(a: &TransportCounters, b: &TransportCounters) -> (u64, u64, u64) {
    let t = a.merged(b);
    (t.mr_registrations, t.mr_deregistrations, t.bytes_outside_pool)
}

async fn counters(s: &common::Setup) -> (u64, u64, u64) {
    let client = s.client.client().stats().await.expect("stats").transport;
    sum(&client, &s.server.stats().transport)
}

/// One echo round trip per size, raw (so that the response bytes are seen as they arrived).
async fn round(s: &common::Setup, check_zero_copy: bool) {
    let client = s.client.client();
    let id = common::EchoClient::ECHO;
    for &size in &SIZES {
        let data = pattern(size, size as u8);
        let payload = codec::encode_in(&client.pool(), &(data.clone(),)).expect("encode");
        assert!(client.pool().contains(&payload), "arguments are encoded in the pool");
        let response = client.call(id, payload, &CallOptions::default()).await.expect("echo");
        if check_zero_copy && size > SMALL {
            assert!(
                client.pool().contains(&response),
                "the {size}-byte response is handed on where it landed (receive buffer or READ destination)"
            );
        } else if check_zero_copy {
            assert!(
                !client.pool().contains(&response),
                "the {size}-byte response is copied out, its receive buffer back in the pool"
            );
        }
        let back: Bytes = codec::decode(&response).expect("decode");
        assert_eq!(back, data);
    }
}

/// Batches of rounds until one takes no new chunk from either side's pool (the pools reached
/// their working set), at most [`BATCHES`]; returns that batch's registrations per call.
async fn steady_state(kind: Kind, policy: KeyPolicy) -> f64 {
    let proto = common::proto().key_policy(policy);
    let s =
        setup_with(kind, ServerConfig::default().proto(proto.clone()), ClientConfig::default().proto(proto))
            .await;
    for _ in 0..WARMUP {
        round(&s, false).await;
    }
    for batch in 0..BATCHES {
        let pool_before = s.client.client().pool().counters();
        let (regs, deregs, outside) = counters(&s).await;
        for _ in 0..ROUNDS {
            round(&s, true).await;
        }
        let pool_after = s.client.client().pool().counters();
        let (regs2, deregs2, outside2) = counters(&s).await;
        let calls = (ROUNDS * SIZES.len()) as f64;
        let per_call = (regs2 - regs) as f64 / calls;
        println!(
            "[{kind:?}, {policy:?}, batch {batch}] registrations per call (steady state): {per_call:.2} \
             (deregistrations {:.2}, bytes copied outside the pool {:.0}, client pool new chunks {})",
            (deregs2 - deregs) as f64 / calls,
            (outside2 - outside) as f64 / calls,
            pool_after.misses - pool_before.misses,
        );
        assert_eq!(pool_after.one_off, pool_before.one_off, "no one-off buffer");
        assert_eq!(outside2, outside, "nothing copied into or registered from memory outside the pools");
        let grew = pool_after.misses != pool_before.misses;
        let pool_regs = matches!(policy, KeyPolicy::PoolKeys) && regs2 != regs;
        if !grew && !pool_regs {
            return per_call;
        }
    }
    panic!("the pools still grew after {BATCHES} batches of {ROUNDS} rounds: no steady state");
}

over_all_transports! {
    async fn steady_state_calls_take_everything_from_the_pools(kind: Kind) {
        let per_call = steady_state(kind, KeyPolicy::PoolKeys).await;
        assert_eq!(per_call, 0.0, "no registration per call in steady state");
    }

    async fn bytes_arguments_and_results_are_not_copied(kind: Kind) {
        let s = common::setup(kind).await;
        for len in [SMALL + 1, 2 * THRESHOLD, 256 << 10] {
            // A `Bytes` result: a slice of the receive buffer or READ destination.
            let got = s.client.fill(len as u64, 9).await.expect("fill");
            assert_eq!(got, pattern(len, 9));
            assert!(s.client.client().pool().contains(&got), "{len}-byte result decoded in place");
            // A `Bytes` argument, likewise at the server.
            let before = s.probe.args_in_pool.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(s.client.size(pattern(len, 1)).await.expect("size"), len as u64);
            let after = s.probe.args_in_pool.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(after, before + 1, "{len}-byte argument decoded in place");
        }
        // Up to 1 KiB both are copied out instead, and hold no buffer of the pool.
        for len in [1, 100, SMALL] {
            let got = s.client.fill(len as u64, 9).await.expect("fill");
            assert_eq!(got, pattern(len, 9));
            assert!(!s.client.client().pool().contains(&got), "{len}-byte result copied out");
            let before = s.probe.args_in_pool.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(s.client.size(pattern(len, 1)).await.expect("size"), len as u64);
            let after = s.probe.args_in_pool.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(after, before, "{len}-byte argument copied out");
        }
    }

    async fn a_small_message_leaves_its_receive_buffer_to_be_posted_again(kind: Kind) {
        // A message of at most 1 KiB is copied out as it arrives and its receive buffer posted
        // again as it is: no buffer from the pool per message received. The request is the
        // caller's own bytes (not encoded into the pool), so on mem and tcp (which copy every
        // SEND: its frame is assembled outside the pool) a call takes nothing from the client's
        // pool; on rdma at most its request frame, when it is too large to go inline.
        let s = common::setup(kind).await;
        let client = s.client.client();
        let payload = codec::encode(&(pattern(32, 5),)).expect("encode");
        let opts = CallOptions::default();
        let call = || client.call(common::EchoClient::ECHO, payload.clone(), &opts);
        for _ in 0..WARMUP {
            call().await.expect("echo");
        }
        let before = client.pool().counters().allocs;
        const CALLS: u64 = 64;
        for _ in 0..CALLS {
            let back: Bytes = codec::decode(&call().await.expect("echo")).expect("decode");
            assert_eq!(back, pattern(32, 5));
        }
        let per_call = (client.pool().counters().allocs - before) as f64 / CALLS as f64;
        println!("[{kind:?}] client pool buffers taken per 32 B call: {per_call:.2}");
        let most = if matches!(kind, Kind::Rdma) { 1.0 } else { 0.0 };
        assert!(per_call <= most, "{per_call} buffers per call (at most {most})");
    }

    async fn per_call_keys_register_each_advertised_payload(kind: Kind) {
        let per_call = steady_state(kind, KeyPolicy::PerCallKeys).await;
        if matches!(kind, Kind::Rdma) {
            // Rendezvous sizes (2 of the 4): the request and the response each get a key of their own.
            assert!(per_call >= 0.9, "per-call keys register every advertised payload: {per_call}");
        } else {
            assert_eq!(per_call, 0.0, "mem and tcp register nothing");
        }
    }
}

/// What a connection's pool holds: idle after setup, after small calls, after large ones (the
/// figures the README quotes), within its limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_memory_of_a_connection_is_bounded() {
    let limits = rpc_core::transport::PoolLimits { max_bytes: 96 << 20, max_idle_bytes: 40 << 20 };
    let proto = rpc_core::ProtoConfig::default().pool(limits);
    let s = setup_with(
        Kind::Tcp,
        ServerConfig::default().proto(proto.clone()),
        ClientConfig::default().proto(proto),
    )
    .await;
    let pool = s.client.client().pool().clone();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let idle = pool.counters().pooled_bytes;
    for i in 0..100u32 {
        s.client.echo(pattern(100, i as u8)).await.expect("small");
    }
    let small = pool.counters().pooled_bytes;
    for _ in 0..4 {
        s.client.echo(pattern(16 << 20, 3)).await.expect("16 MiB");
    }
    let after_large = pool.counters();
    println!(
        "client pool, default recv_depth and eager threshold: {:.2} MiB after setup, {:.2} MiB after 100 small calls, \
         {:.2} MiB after 16 MiB echoes (registered {:.2} MiB)",
        mib(idle),
        mib(small),
        mib(after_large.pooled_bytes),
        mib(after_large.registered_bytes)
    );
    assert!(idle <= 1 << 20, "receives of an idle connection: {idle}");
    assert!(after_large.pooled_bytes <= limits.max_bytes as u64);
    // Idle now: at most max_idle_bytes of large buffers, plus the small chunks.
    assert!(after_large.pooled_bytes <= limits.max_idle_bytes as u64 + small + (2 << 20));
    drop(s);
}

//! Calls through generated stubs, over mem and tcp: sizes around the threshold and up to
//! 64 MiB in both directions, concurrency, credit flow control.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{pattern, setup, setup_with, EchoClient, THRESHOLD};
use rpc_core::{CallOptions, ClientConfig, Path, ProtoConfig, ServerConfig};

over_all_transports! {
    async fn payload_sizes_both_directions(kind: Kind) {
        let s = setup(kind).await;
        for size in [0, THRESHOLD - 40, THRESHOLD, THRESHOLD + 1, 1 << 20, 64 << 20] {
            let data = pattern(size, 7);
            let echoed = s.client.size(data.clone()).await.expect("request of size");
            assert_eq!(echoed, size as u64, "server saw the whole request of {size} bytes");
            let got = s.client.fill(size as u64, 3).await.expect("response of size");
            assert_eq!(got, pattern(size, 3), "response of {size} bytes intact");
        }
        let big = pattern(64 << 20, 9);
        assert_eq!(s.client.echo(big.clone()).await.expect("64 MiB echo"), big);
        let stats = s.client.client().stats().await.unwrap();
        assert!(stats.proto.rendezvous_sent >= 3, "large requests went by rendezvous: {stats:?}");
        assert!(stats.proto.rendezvous_received >= 3, "large responses went by rendezvous: {stats:?}");
        assert_eq!(stats.transport.regions_registered, stats.transport.regions_revoked, "every client key revoked");
        assert_eq!(stats.transport.recv_unexpected, 0);
        common::eventually("server revoked every key", || {
            let t = s.server.stats().transport;
            t.regions_registered == t.regions_revoked
        }).await;
    }

    async fn path_reported_per_call(kind: Kind) {
        let s = setup(kind).await;
        let raw = s.client.client();
        let small = rpc_core::codec::encode(&(Bytes::from_static(b"hi"),)).unwrap();
        let (_, info) = raw.call_with_info(EchoClient::ECHO, small, &CallOptions::new()).await.unwrap();
        assert_eq!((info.request, info.response), (Path::Eager, Path::Eager));
        let large = rpc_core::codec::encode(&(pattern(THRESHOLD * 2, 1),)).unwrap();
        let (_, info) = raw.call_with_info(EchoClient::ECHO, large, &CallOptions::new()).await.unwrap();
        assert_eq!((info.request, info.response), (Path::Rendezvous, Path::Rendezvous));
    }

    async fn thousand_concurrent_calls_on_one_connection(kind: Kind) {
        let s = setup(kind).await;
        let calls = (0..1000u32).map(|i| {
            let c = s.client.clone();
            async move {
                let size = if i % 50 == 0 { THRESHOLD * 3 } else { (i % 200) as usize };
                let data = pattern(size, i as u8);
                let got = c.echo(data.clone()).await.expect("call");
                assert_eq!(got, data, "call {i} got its own answer");
            }
        });
        futures::future::join_all(calls).await;
        assert_eq!(s.probe.calls.load(std::sync::atomic::Ordering::Relaxed), 1000);
    }

    async fn flood_never_overruns_posted_receives(kind: Kind) {
        // Few credits, many small calls at once: senders must wait for credits, never overrun.
        let proto = ProtoConfig::default().eager_threshold(THRESHOLD).recv_depth(4);
        let s = setup_with(kind, ServerConfig::default().proto(proto.clone()), ClientConfig::default().proto(proto)).await;
        let calls = (0..2000u32).map(|i| {
            let c = s.client.clone();
            async move { c.echo(pattern(64, i as u8)).await.expect("call") }
        });
        futures::future::join_all(calls).await;
        let client = s.client.client().stats().await.unwrap();
        // The server publishes its counters at the end of the poll that sent the last answer,
        // which may still be running on another worker when that answer has arrived here.
        common::eventually("the server published its 2000 receives", || s.server.stats().transport.recvs >= 2000)
            .await;
        let server = s.server.stats();
        assert_eq!(client.transport.recv_unexpected, 0, "client: a SEND met no posted receive");
        assert_eq!(server.transport.recv_unexpected, 0, "server: a SEND met no posted receive");
        assert!(client.proto.credit_stalls + server.proto.credit_stalls > 0, "credits were the bottleneck");
    }

    async fn per_call_deadline_without_changing_the_trait(kind: Kind) {
        let s = setup(kind).await;
        let fast = s.client.with_options(CallOptions::new().deadline(Duration::from_secs(20)));
        assert_eq!(fast.slow(1).await.unwrap(), 1);
    }

    async fn driver_polls_and_handler_spawns_are_counted(kind: Kind) {
        let s = setup(kind).await;
        s.client.echo(pattern(32, 1)).await.expect("first call");
        let client0 = s.client.client().stats().await.unwrap();
        common::eventually("the server published its first call", || s.server.stats().calls_in_flight == 0
            && s.server.stats().proto.calls_completed == 1).await;
        let server0 = s.server.stats();
        for i in 0..10u8 {
            s.client.echo(pattern(32, i)).await.expect("call");
        }
        for i in 0..5u8 {
            assert_eq!(s.client.fill(32, i).await.expect("call"), pattern(32, i));
        }
        let client1 = s.client.client().stats().await.unwrap();
        common::eventually("the server published the 15 calls", || s.server.stats().proto.calls_completed == 16).await;
        let server1 = s.server.stats();
        // Both drivers were woken for the calls (how often depends on timing across threads).
        assert!(client1.driver_polls > client0.driver_polls, "client driver polls: {client0:?} -> {client1:?}");
        assert!(server1.driver_polls > server0.driver_polls, "server driver polls: {server0:?} -> {server1:?}");
        // `echo` is marked `#[rpc(inline)]`: its handlers run in the driver (`ServerConfig`'s
        // default); `fill` is not: each of its handlers runs in a task.
        assert_eq!(server1.handlers_inline - server0.handlers_inline, 10, "handlers inline");
        assert_eq!(server1.handlers_spawned - server0.handlers_spawned, 5, "handler spawns");
        assert_eq!(client1.handlers_spawned, 0, "a client spawns no handler");
    }
}

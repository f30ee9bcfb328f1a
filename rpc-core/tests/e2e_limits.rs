//! Limits over mem and tcp: handler slots shared fairly between connections, the connection cap,
//! the client's bound on calls in flight (callers beyond it wait, within their deadline), and
//! counters that keep nothing per closed connection.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::{eventually, setup_with, EchoClient};
use rpc_core::{CallError, CallOptions, Client, ClientConfig, ServerConfig};

over_all_transports! {
    async fn one_client_cannot_take_every_handler_slot(kind: Kind) {
        let server_cfg = ServerConfig::default()
            .proto(common::proto())
            .max_concurrent_handlers(8)
            .max_handlers_per_connection(4);
        let s = setup_with(kind, server_cfg, ClientConfig::default().proto(common::proto())).await;
        // The greedy client: 40 slow calls at once.
        let greedy: Vec<_> = (0..40).map(|_| {
            let c = s.client.clone();
            tokio::spawn(async move { c.slow(1_500).await })
        }).collect();
        // (`slow` answers a `u64`: no call of it waits for the rendezvous budget, even the first,
        // so the requests may still be arriving when the first four run: wait for both.)
        eventually("the greedy client's share runs and the rest wait without a task", || {
            let r = s.server.resources();
            r.handlers_running == 4 && r.requests_waiting > 0
        })
        .await;
        assert!(s.server.resources().handlers_running <= 4, "one connection runs at most its share");
        // Another client is served at once, although 36 requests wait ahead of it.
        let other = EchoClient::new(Client::connect(&s.addr, ClientConfig::default().proto(common::proto())).await.unwrap());
        let started = tokio::time::Instant::now();
        assert_eq!(other.echo(Bytes::from_static(b"hi")).await.unwrap(), Bytes::from_static(b"hi"));
        assert!(started.elapsed() < Duration::from_millis(1_500), "served before the greedy calls finished");
        assert!(s.server.resources().handlers_running <= 8);
        for g in greedy {
            assert_eq!(g.await.unwrap(), Ok(1_500));
        }
        assert_eq!(s.probe.slow_finished.load(Ordering::SeqCst), 40);
        eventually("no request waits", || s.server.resources().requests_waiting == 0).await;
    }

    async fn requests_beyond_the_connections_share_start_in_arrival_order(kind: Kind) {
        let server_cfg = ServerConfig::default().proto(common::proto()).max_handlers_per_connection(1);
        let s = setup_with(kind, server_cfg, ClientConfig::default().proto(common::proto())).await;
        let spawn = |millis| {
            let c = s.client.clone();
            tokio::spawn(async move { c.slow(millis).await })
        };
        let mut calls = vec![spawn(300)];
        eventually("the first call runs", || s.server.resources().handlers_running == 1).await;
        // Each request arrives (and waits) before the next is made: the order is known.
        for (i, millis) in [5, 4, 3, 2, 1].into_iter().enumerate() {
            calls.push(spawn(millis));
            eventually("the request waits behind the others", || {
                s.server.resources().requests_waiting == i + 1
            })
            .await;
        }
        // A request that comes while others wait (the slot free or not) goes behind them.
        for (call, millis) in calls.into_iter().zip([300, 5, 4, 3, 2, 1]) {
            assert_eq!(call.await.unwrap(), Ok(millis));
        }
        assert_eq!(*s.probe.slow_order.lock().unwrap(), [300, 5, 4, 3, 2, 1], "started in arrival order");
        eventually("no request waits", || s.server.resources().requests_waiting == 0).await;
    }

    async fn a_long_handler_of_unknown_size_does_not_stop_the_small_calls_of_its_connection(kind: Kind) {
        let s = setup_with(kind, ServerConfig::default().proto(common::proto()), ClientConfig::default().proto(common::proto())).await;
        // `echo` answered once: its answers are known to be small. `slow_echo` never was, and
        // its type (`Bytes`) bounds nothing: its first call reserves the connection's whole
        // rendezvous budget while it runs.
        assert_eq!(s.client.echo(Bytes::from_static(b"warm")).await.unwrap(), Bytes::from_static(b"warm"));
        let c = s.client.clone();
        let long = tokio::spawn(async move { c.slow_echo(30_000, Bytes::from_static(b"late")).await });
        answered_while_a_long_call_runs(&s, long, async {
            for i in 0..10u8 {
                let data = common::pattern(32, i);
                assert_eq!(s.client.echo(data.clone()).await.unwrap(), data);
            }
        })
        .await;
    }

    async fn a_method_whose_answer_type_is_small_never_takes_the_budget(kind: Kind) {
        let s = setup_with(kind, ServerConfig::default().proto(common::proto()), ClientConfig::default().proto(common::proto())).await;
        // `slow` answers a `u64`: its first call reserves nothing, so the first call of `echo`
        // (unknown: it needs the whole budget) starts at once while `slow` runs.
        let c = s.client.clone();
        let long = tokio::spawn(async move { c.slow(30_000).await });
        answered_while_a_long_call_runs(&s, long, async {
            assert_eq!(s.client.echo(Bytes::from_static(b"first")).await.unwrap(), Bytes::from_static(b"first"));
        })
        .await;
    }

    async fn connections_beyond_the_cap_wait_until_one_closes(kind: Kind) {
        let server_cfg = ServerConfig::default().proto(common::proto()).max_connections(2);
        let s = setup_with(kind, server_cfg, ClientConfig::default().proto(common::proto())).await;
        let cfg = || ClientConfig::default().proto(common::proto());
        let second = EchoClient::new(Client::connect(&s.addr, cfg()).await.unwrap());
        assert_eq!(second.echo(Bytes::from_static(b"2")).await.unwrap(), Bytes::from_static(b"2"));
        assert_eq!(s.server.resources().open_connections, 2);
        // A third connection is not taken while two are open: its call is not served.
        let third = match tokio::time::timeout(Duration::from_secs(2), Client::connect(&s.addr, cfg())).await {
            Ok(Ok(c)) => EchoClient::new(c),
            // A transport that hands out connections only as they are accepted makes connect wait.
            _ => return assert_eq!(s.server.resources().open_connections, 2),
        };
        let quick = third.with_options(CallOptions::new().deadline(Duration::from_millis(300)));
        assert_eq!(quick.echo(Bytes::from_static(b"3")).await, Err(CallError::DeadlineExceeded));
        assert_eq!(s.server.resources().open_connections, 2);

        // Once one closes, the waiting connection is taken and served.
        drop(second);
        assert_eq!(third.echo(Bytes::from_static(b"3")).await.unwrap(), Bytes::from_static(b"3"));
        assert_eq!(s.server.resources().open_connections, 2);
    }

    async fn callers_beyond_max_in_flight_wait_for_a_slot(kind: Kind) {
        let client_cfg = ClientConfig::default().proto(common::proto().max_in_flight(2));
        let s = setup_with(kind, ServerConfig::default().proto(common::proto()), client_cfg).await;
        // One call first, alone.
        assert_eq!(s.client.slow(1).await, Ok(1));
        let running = || {
            let p = &s.probe;
            let started = p.slow_started.load(Ordering::SeqCst);
            started - p.slow_finished.load(Ordering::SeqCst) - p.slow_dropped.load(Ordering::SeqCst)
        };
        // Five slow calls at once: two go out, three wait in the client for a free slot.
        let calls: Vec<_> = (0..5).map(|_| {
            let c = s.client.clone();
            tokio::spawn(async move { c.slow(400).await })
        }).collect();
        eventually("two slow handlers run", || running() == 2).await;
        assert_eq!(s.client.client().stats().await.unwrap().calls_in_flight, 2);
        // A waiting caller's deadline still holds; it is never sent.
        let quick = s.client.with_options(CallOptions::new().deadline(Duration::from_millis(100)));
        assert_eq!(quick.echo(Bytes::from_static(b"late")).await, Err(CallError::DeadlineExceeded));
        // A waiting caller that gives up takes no slot with it.
        let given_up = { let c = s.client.clone(); tokio::spawn(async move { c.slow(400).await }) };
        tokio::time::sleep(Duration::from_millis(20)).await;
        given_up.abort();
        // Never more than two run, until all five are done (sampled, bounded).
        let mut done = false;
        for _ in 0..1_000 {
            assert!(running() <= 2, "at most max_in_flight calls reach the server");
            if calls.iter().all(|c| c.is_finished()) {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(done, "the waiting calls were served as slots came free");
        for c in calls {
            assert_eq!(c.await.unwrap(), Ok(400));
        }
        // Every slot came back: two calls run side by side again.
        let again: Vec<_> = (0..2).map(|_| {
            let c = s.client.clone();
            tokio::spawn(async move { c.slow(300).await })
        }).collect();
        eventually("both run at once", || running() == 2).await;
        for c in again {
            assert_eq!(c.await.unwrap(), Ok(300));
        }
        assert_eq!(s.probe.slow_started.load(Ordering::SeqCst), 1 + 5 + 2, "the late and the abandoned calls were never sent");
        assert_eq!(s.client.client().stats().await.unwrap().calls_in_flight, 0);
    }

    async fn closed_connections_are_folded_into_the_totals(kind: Kind) {
        let s = setup_with(kind, ServerConfig::default().proto(common::proto()), ClientConfig::default().proto(common::proto())).await;
        for _ in 0..20 {
            let c = EchoClient::new(Client::connect(&s.addr, ClientConfig::default().proto(common::proto())).await.unwrap());
            c.echo(Bytes::from_static(b"x")).await.unwrap();
        }
        eventually("only the setup's connection is open", || s.server.resources().open_connections == 1).await;
        eventually("every call counted", || s.server.stats().proto.calls_completed == 20).await;
        assert_eq!(s.server.resources().rendezvous_bytes_held, 0);
    }
}

/// Runs `calls` once `long`, a call of 30 s, has started on the same connection: they must be
/// answered well before it ends (10 s). Then `long` is dropped, and its handler with it.
async fn answered_while_a_long_call_runs<T>(
    s: &common::Setup,
    long: tokio::task::JoinHandle<T>,
    calls: impl std::future::Future<Output = ()>,
) {
    eventually("the long call runs", || s.probe.slow_started.load(Ordering::SeqCst) == 1).await;
    let started = tokio::time::Instant::now();
    calls.await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "the calls waited {took:?} behind the long one");
    assert_eq!(s.probe.slow_finished.load(Ordering::SeqCst), 0, "the long call still runs");
    long.abort();
    eventually("the long handler was dropped", || s.probe.slow_dropped.load(Ordering::SeqCst) == 1).await;
}

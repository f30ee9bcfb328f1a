//! Handlers that finish in their first poll are answered from the connection's driver (no task
//! spawned); handlers that wait move to a task of their own; a panic either way is answered as a
//! `Handler` error and the connection carries on (`ServerConfig::inline_handlers`).

mod common;

use std::time::Duration;

use common::{eventually, Kind};
use rpc_core::{CallError, Client, ClientConfig, ConnStats, Server, ServerConfig, WireErrorCode};

#[rpc_core::service]
pub trait Probe {
    /// Answers at once with its argument plus one.
    async fn quick(&self, x: u64) -> u64;
    /// Waits (a timer, then a yield) before answering.
    async fn waits(&self, millis: u64) -> u64;
    /// Panics, at once or after waiting.
    async fn boom(&self, after_waiting: bool) -> u64;
    /// The method name and call id the handler's context holds.
    async fn whoami(&self) -> (String, u64);
}

struct ProbeImpl;

impl Probe for ProbeImpl {
    async fn quick(&self, x: u64) -> u64 {
        x + 1
    }
    async fn waits(&self, millis: u64) -> u64 {
        tokio::time::sleep(Duration::from_millis(millis)).await;
        tokio::task::yield_now().await;
        millis
    }
    async fn boom(&self, after_waiting: bool) -> u64 {
        if after_waiting {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("a handler that panics (expected by this test)");
    }
    async fn whoami(&self) -> (String, u64) {
        let ctx = rpc_core::context::current().expect("the call's context is set in the first poll");
        (ctx.method().to_string(), ctx.call_id())
    }
}

struct Setup {
    server: Server,
    client: ProbeClient,
}

async fn setup(kind: Kind, inline: bool) -> Setup {
    let config = ServerConfig::default().proto(common::proto()).inline_handlers(inline);
    let server = Server::bind(&kind.bind_addr(), config, ProbeServer::new(ProbeImpl)).await.expect("bind");
    let addr = server.local_addr().to_string();
    let client =
        Client::connect(&addr, ClientConfig::default().proto(common::proto())).await.expect("connect");
    Setup { server, client: ProbeClient::new(client) }
}

/// The server's counters once it has started `calls` handlers (the driver publishes them when
/// it goes idle, which may come just after the client has its answer).
async fn stats_after(server: &Server, calls: u64) -> ConnStats {
    let started = || {
        let s = server.stats();
        s.handlers_inline + s.handlers_spawned
    };
    eventually("the server publishes its counters", || started() >= calls).await;
    server.stats()
}

fn assert_panicked(err: CallError) {
    match err {
        CallError::Remote(r) => {
            assert_eq!(r.code, WireErrorCode::Handler, "{r:?}");
            assert!(r.message.contains("handler panicked"), "{r:?}");
        }
        other => panic!("expected a Handler error, got {other:?}"),
    }
}

over_all_transports! {
    async fn a_handler_that_finishes_at_once_runs_inline(kind: Kind) {
        let s = setup(kind, true).await;
        for x in 0..20 {
            assert_eq!(s.client.quick(x).await.unwrap(), x + 1);
        }
        let (method, call_id) = s.client.whoami().await.unwrap();
        assert_eq!(method, "Probe.whoami");
        assert!(call_id >= 1);
        let stats = stats_after(&s.server, 21).await;
        assert_eq!((stats.handlers_inline, stats.handlers_spawned), (21, 0), "{stats:?}");
        s.server.shutdown().await;
    }

    async fn a_handler_that_waits_moves_to_a_task_and_answers(kind: Kind) {
        let s = setup(kind, true).await;
        assert_eq!(s.client.waits(5).await.unwrap(), 5);
        // Several at once, overlapping: each in its own task.
        let calls = (0..4).map(|i| s.client.waits(10 + i));
        let answers = futures::future::join_all(calls).await;
        assert_eq!(answers.into_iter().map(Result::unwrap).collect::<Vec<_>>(), vec![10, 11, 12, 13]);
        assert_eq!(s.client.quick(1).await.unwrap(), 2);
        let stats = stats_after(&s.server, 6).await;
        assert_eq!((stats.handlers_inline, stats.handlers_spawned), (1, 5), "{stats:?}");
        eventually("every handler slot is given back", || s.server.resources().handlers_running == 0).await;
        s.server.shutdown().await;
    }

    async fn a_panic_inline_or_in_a_task_is_answered_and_the_connection_carries_on(kind: Kind) {
        for inline in [true, false] {
            let s = setup(kind, inline).await;
            assert_panicked(s.client.boom(false).await.unwrap_err());
            assert_eq!(s.client.quick(1).await.unwrap(), 2, "the connection carries on");
            assert_panicked(s.client.boom(true).await.unwrap_err());
            assert_eq!(s.client.quick(2).await.unwrap(), 3, "the connection carries on");
            let stats = stats_after(&s.server, 4).await;
            let expected = if inline { (3, 1) } else { (0, 4) };
            assert_eq!((stats.handlers_inline, stats.handlers_spawned), expected, "inline {inline}: {stats:?}");
            eventually("every handler slot is given back", || s.server.resources().handlers_running == 0).await;
            assert_eq!(s.server.resources().open_connections, 1);
            s.server.shutdown().await;
        }
    }

    async fn with_inline_handlers_off_every_handler_is_spawned(kind: Kind) {
        let s = setup(kind, false).await;
        for x in 0..5 {
            assert_eq!(s.client.quick(x).await.unwrap(), x + 1);
        }
        assert_eq!(s.client.whoami().await.unwrap().0, "Probe.whoami");
        assert_eq!(s.client.waits(1).await.unwrap(), 1);
        let stats = stats_after(&s.server, 7).await;
        assert_eq!((stats.handlers_inline, stats.handlers_spawned), (0, 7), "{stats:?}");
        s.server.shutdown().await;
    }
}

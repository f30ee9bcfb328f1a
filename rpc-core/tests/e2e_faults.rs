//! Injected faults on the `mem` transport, against the real server and client runtimes: a peer
//! killed mid-rendezvous, corrupted frames, failed READs, failed sends, slow completions.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{chain, pattern, setup, EchoClient, Kind, LIMIT, THRESHOLD};
use rpc_core::{CallError, CallOptions, Client, ClientConfig, WireErrorCode};
use rpc_transport::{mem, ReadError, TransportError};

fn name(addr: &str) -> &str {
    addr.strip_prefix("mem://").expect("mem address")
}

async fn second_client(addr: &str) -> EchoClient {
    EchoClient::new(Client::connect(addr, ClientConfig::default().proto(common::proto())).await.unwrap())
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f).await.expect("bounded by the test limit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_killed_mid_rendezvous_fails_every_pending_call_and_the_server_goes_on() {
    let s = setup(Kind::Mem).await;
    let faults = mem::faults(name(&s.addr));
    faults.set_completion_delay(Duration::from_millis(50)); // keep the transfers in flight
    let calls: Vec<_> = (0..6u8)
        .map(|i| {
            let c = s.client.clone();
            tokio::spawn(async move {
                match i % 3 {
                    0 => c.size(pattern(THRESHOLD * 16, i)).await.map(|_| ()),
                    1 => c.fill(THRESHOLD as u64 * 16, i).await.map(|_| ()),
                    _ => c.slow(30_000).await.map(|_| ()),
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    faults.kill();
    for call in calls {
        let r = bounded(call).await.unwrap();
        assert!(matches!(r, Err(CallError::Disconnected(_))), "pending call failed cleanly: {r:?}");
    }
    faults.clear();
    let fresh = second_client(&s.addr).await;
    assert_eq!(bounded(fresh.size(pattern(THRESHOLD * 2, 1))).await.unwrap(), THRESHOLD as u64 * 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_frame_closes_only_that_connection() {
    let s = setup(Kind::Mem).await;
    let other = second_client(&s.addr).await;
    assert_eq!(bounded(other.size(Bytes::from_static(b"x"))).await.unwrap(), 1);
    mem::faults(name(&s.addr)).corrupt_next_frames(1);
    let r = bounded(s.client.echo(Bytes::from_static(b"corrupted on the way"))).await;
    assert!(matches!(r, Err(CallError::Disconnected(_))), "the corrupted connection was closed: {r:?}");
    assert_eq!(
        bounded(other.size(Bytes::from_static(b"abc"))).await.unwrap(),
        3,
        "the other connection works"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_reads_fail_the_call_not_the_connection() {
    let s = setup(Kind::Mem).await;
    let faults = mem::faults(name(&s.addr));
    faults.fail_reads(true);
    // The server cannot READ the request: a typed remote error.
    let r = bounded(s.client.size(pattern(THRESHOLD * 2, 0))).await;
    assert!(matches!(&r, Err(CallError::Remote(e)) if e.code == WireErrorCode::ReadFailed), "{r:?}");
    // The client cannot READ the response: a typed transfer error, whose source is the READ's.
    let r = bounded(s.client.fill(THRESHOLD as u64 * 2, 0)).await;
    assert!(matches!(r, Err(CallError::Transfer(_))), "{r:?}");
    let err = r.unwrap_err();
    let read = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<ReadError>());
    assert_eq!(read, Some(&ReadError::Failed("injected".into())), "{err:?}");
    assert_eq!(err.to_string(), "transfer failed: reading the response: READ failed: injected");
    faults.fail_reads(false);
    assert_eq!(bounded(s.client.fill(THRESHOLD as u64 * 2, 4)).await.unwrap(), pattern(THRESHOLD * 2, 4));
    let stats = s.client.client().stats().await.unwrap();
    assert_eq!(stats.transport.regions_registered, stats.transport.regions_revoked, "no key left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_send_fails_the_connection_cleanly() {
    let s = setup(Kind::Mem).await;
    mem::faults(name(&s.addr)).fail_next_completions(1);
    // A lone call: it is started, and its SEND posted, in the caller's own task.
    let r = bounded(s.client.echo(Bytes::from_static(b"lost"))).await;
    assert!(matches!(r, Err(CallError::Disconnected(_))), "{r:?}");
    // The SEND's own error is the cause, typed: a transport failure, not a protocol violation.
    let err = r.unwrap_err();
    let transport = chain(&err).into_iter().find_map(|e| e.downcast_ref::<TransportError>());
    assert!(matches!(transport, Some(TransportError::Injected(_))), "{err:?}");
    assert!(!err.to_string().contains("protocol violation"), "{err}");
    let r = bounded(s.client.echo(Bytes::new())).await;
    assert!(matches!(r, Err(CallError::Disconnected(_))), "later calls fail at once: {r:?}");
    assert!(bounded(s.client.client().stats()).await.is_err(), "the driver task has ended");
    let fresh = second_client(&s.addr).await;
    assert_eq!(bounded(fresh.size(Bytes::from_static(b"ok"))).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_completions_still_deliver_correct_answers_and_deadlines_fire() {
    let s = setup(Kind::Mem).await;
    let faults = mem::faults(name(&s.addr));
    faults.set_completion_delay(Duration::from_millis(30));
    let calls = (0..20u8).map(|i| {
        let c = s.client.clone();
        async move {
            let data = pattern(if i % 4 == 0 { THRESHOLD * 3 } else { 32 }, i);
            assert_eq!(c.echo(data.clone()).await.unwrap(), data);
        }
    });
    bounded(futures::future::join_all(calls)).await;
    let hurried = s.client.with_options(CallOptions::new().deadline(Duration::from_millis(10)));
    assert_eq!(bounded(hurried.echo(Bytes::from_static(b"late"))).await, Err(CallError::DeadlineExceeded));
    faults.clear();
    assert_eq!(bounded(s.client.size(Bytes::from_static(b"fine"))).await.unwrap(), 4);
}

/// A service whose `die` kills every connection of its listener from inside its handler, then
/// answers at once (inline): the answer's post fails on the dead connection.
#[rpc_core::service]
trait Doomed {
    async fn die(&self) -> u64;
    async fn live(&self) -> u64;
}

#[derive(Clone)]
struct DoomedImpl(std::sync::Arc<std::sync::OnceLock<String>>);

impl Doomed for DoomedImpl {
    async fn die(&self) -> u64 {
        mem::faults(self.0.get().expect("the listener's name")).kill();
        7
    }
    async fn live(&self) -> u64 {
        8
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_posted_on_a_connection_its_handler_killed_ends_that_connection_cleanly() {
    let name_slot = std::sync::Arc::new(std::sync::OnceLock::new());
    let server = rpc_core::Server::bind(
        &Kind::Mem.bind_addr(),
        rpc_core::ServerConfig::default()
            .proto(common::proto())
            .inline_handlers(rpc_core::InlineHandlers::Always),
        DoomedServer::new(DoomedImpl(name_slot.clone())),
    )
    .await
    .expect("bind");
    let addr = server.local_addr().to_string();
    name_slot.set(name(&addr).to_string()).expect("set once");
    let connect = || async {
        DoomedClient::new(
            Client::connect(&addr, ClientConfig::default().proto(common::proto())).await.unwrap(),
        )
    };
    let client = connect().await;
    assert_eq!(bounded(client.live()).await.unwrap(), 8);
    // The handler finishes in its first poll, in the server's driver, which posts its answer at
    // once (the round's last): the post fails, and the connection ends, typed, without a panic.
    let r = bounded(client.die()).await;
    assert!(matches!(r, Err(CallError::Disconnected(_))), "{r:?}");
    assert!(matches!(bounded(client.live()).await, Err(CallError::Disconnected(_))));
    // The server carries on: a new connection is served.
    let fresh = connect().await;
    assert_eq!(bounded(fresh.live()).await.unwrap(), 8);
    assert_eq!(server.resources().handlers_running, 0, "no handler left behind");
    // Every handler ran inline: the path under test (a connection's counters are published as
    // it goes on, not at each call).
    common::eventually("three inline handlers counted", || server.stats().handlers_inline >= 3).await;
    assert_eq!(server.stats().handlers_spawned, 0);
}

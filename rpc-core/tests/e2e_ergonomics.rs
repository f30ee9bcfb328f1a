//! What a user coming from tarpc or tonic expects: a call context with caller metadata in
//! handlers, several services on one server, a reconnecting client, and schema mismatches refused
//! instead of misread. Over tcp on loopback. (Per-call tracing is in `e2e_tracing.rs`.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::attacker::{request_header, Attacker, AttackerHello, Reads, SendOutcome};
use common::whoami::{connect, serve, WhoamiClient, WhoamiImpl, WhoamiServer};
use rpc_core::proto::{encode_request_body, WireError, FLAG_ERROR, FLAG_METADATA};
use rpc_core::{CallError, CallOptions, Client, ClientConfig, Reconnect, Router, Server, ServerConfig};

/// Bounds every wait here.
const LIMIT: Duration = Duration::from_secs(20);

#[rpc_core::service]
pub trait Adder {
    async fn add(&self, a: u64, b: u64) -> u64;
}

struct AdderImpl;

impl Adder for AdderImpl {
    async fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
}

#[tokio::test]
async fn handlers_see_their_context_and_the_callers_metadata() {
    let (server, addr) = serve(WhoamiServer::new(WhoamiImpl)).await;
    let client = WhoamiClient::new(connect(&addr).await);
    assert!(rpc_core::context::current().is_none(), "no context outside a handler");
    let opts = CallOptions::new()
        .deadline(Duration::from_secs(10))
        .with_metadata("user", "alice")
        .expect("small metadata")
        .with_metadata("trace-id", "feedc0de")
        .expect("small metadata");
    // Eager, and rendezvous (the metadata travels ahead of the descriptor).
    for pad in [0, 1 << 20] {
        let seen = client.with_options(opts.clone()).whoami(Bytes::from(vec![7; pad])).await.expect("call");
        assert_eq!(seen.method, "Whoami.whoami");
        assert_eq!(seen.user.as_deref(), Some("alice"), "metadata reached the handler ({pad} B)");
        assert_eq!(seen.trace_id.as_deref(), Some("feedc0de"));
        assert_eq!(seen.pad_len, pad as u64);
        assert!(seen.call_id >= 1);
        assert!(seen.peer.starts_with("127.0.0.1:"), "{}", seen.peer);
        let remaining = seen.remaining_ms.expect("the call had a deadline");
        assert!(remaining > 0 && remaining <= 10_000, "{remaining} ms left");
    }
    let info = client.client().stats().await.unwrap().proto;
    assert!(info.rendezvous_sent >= 1, "the large call took the rendezvous path: {info:?}");
    // Without metadata (and untraced) the handler sees none.
    let seen = client.whoami(Bytes::new()).await.expect("call");
    assert_eq!((seen.user, seen.trace_id), (None, None));
    server.shutdown().await;
}

#[tokio::test]
async fn metadata_over_its_bounds_is_a_typed_error() {
    let mut opts = CallOptions::new();
    for i in 0..rpc_core::context::MAX_METADATA_ENTRIES {
        opts = opts.with_metadata(format!("k{i}"), "v").expect("within the bound");
    }
    let err = opts.clone().with_metadata("one-more", "v").unwrap_err();
    assert!(matches!(err, rpc_core::MetadataError::TooManyEntries { .. }), "{err}");
    let err = CallOptions::new().with_metadata("big", "x".repeat(4096)).unwrap_err();
    assert!(matches!(err, rpc_core::MetadataError::TooLarge { .. }), "{err}");
}

#[tokio::test]
async fn a_router_serves_several_services_on_one_port() {
    let router = Router::new()
        .add_service(WhoamiServer::new(WhoamiImpl))
        .unwrap()
        .add_service(AdderServer::new(AdderImpl))
        .unwrap();
    let (server, addr) = serve(router).await;
    let client = connect(&addr).await;
    assert_eq!(AdderClient::new(client.clone()).add(2, 3).await.expect("add"), 5);
    let seen = WhoamiClient::new(client.clone()).whoami(Bytes::new()).await.expect("whoami");
    assert_eq!(seen.method, "Whoami.whoami");
    // An id no service has is answered, not dropped.
    let err = client.call(0xdead_beef, Bytes::new(), &CallOptions::new()).await.unwrap_err();
    assert!(
        matches!(&err, CallError::Remote(r) if r.code == rpc_core::WireErrorCode::UnknownMethod),
        "{err}"
    );
    server.shutdown().await;
}

#[test]
fn a_router_refuses_colliding_method_ids_when_built() {
    let err = Router::new()
        .add_service(AdderServer::new(AdderImpl))
        .unwrap()
        .add_service(AdderServer::new(AdderImpl))
        .unwrap_err();
    assert_eq!(err.id, AdderClient::ADD);
    assert_eq!((err.first, err.second), ("Adder.add", "Adder.add"));
    assert!(err.to_string().contains("`Adder.add`"), "{err}");
}

mod v1 {
    #[rpc_core::service]
    pub trait Pair {
        async fn put(&self, key: String, value: String) -> String;
    }

    pub struct PairImpl;

    impl Pair for PairImpl {
        async fn put(&self, key: String, value: String) -> String {
            format!("{key}={value}")
        }
    }
}

mod v2 {
    /// `v1::Pair` with its two `String` arguments swapped: the same bytes would decode.
    #[rpc_core::service]
    pub trait Pair {
        async fn put(&self, value: String, key: String) -> String;
    }
}

#[tokio::test]
async fn a_changed_signature_is_refused_not_misread() {
    assert_ne!(v1::PairClient::PUT, v2::PairClient::PUT, "argument names and order are in the id");
    let (server, addr) = serve(v1::PairServer::new(v1::PairImpl)).await;
    let client = connect(&addr).await;
    let same = v1::PairClient::new(client.clone());
    assert_eq!(same.put("k".into(), "v".into()).await.unwrap(), "k=v");
    let swapped = v2::PairClient::new(client);
    let err = swapped.put("v".into(), "k".into()).await.unwrap_err();
    match &err {
        CallError::Remote(r) => {
            assert_eq!(r.code, rpc_core::WireErrorCode::UnknownMethod);
            assert!(r.message.contains("`Pair.put` with this client's signature"), "{err}");
        }
        other => panic!("expected UnknownMethod, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_reconnecting_client_fails_fast_while_down_and_recovers_on_restart() {
    let (server, addr) = serve(AdderServer::new(AdderImpl)).await;
    let policy = Reconnect::default()
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(200));
    let config = ClientConfig::default().reconnect(policy).connect_timeout(Duration::from_secs(1));
    let adder = AdderClient::new(Client::connect(&addr, config).await.expect("connect"));
    assert_eq!(adder.add(1, 1).await.unwrap(), 2);

    server.shutdown().await;
    wait_for("the client to see the connection gone", || !adder.client().is_connected()).await;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let err = adder.add(1, 2).await.unwrap_err();
        assert!(matches!(err, CallError::NotConnected(_)), "a typed error while down: {err:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "fails fast: {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(30)).await;
    }

    // The same port again (bind retried: the old socket may linger briefly).
    let restarted = tokio::time::timeout(LIMIT, async {
        loop {
            match Server::bind(&addr, ServerConfig::default(), AdderServer::new(AdderImpl)).await {
                Ok(s) => return s,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("rebind the same port");
    wait_for("the client to reconnect", || adder.client().is_connected()).await;
    assert_eq!(adder.add(20, 22).await.expect("calls after the restart succeed"), 42);
    restarted.shutdown().await;
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Metadata a client made badly: a section that does not decode is answered `BadRequest` (the
/// connection carries on); a section whose length is wrong is a protocol violation (that
/// connection is closed; other clients carry on).
#[tokio::test]
async fn malformed_metadata_is_a_typed_answer_or_closes_only_that_connection() {
    let (server, addr) = serve(AdderServer::new(AdderImpl)).await;
    let socket: std::net::SocketAddr = addr.trim_start_matches("tcp://").parse().unwrap();
    let mut att = Attacker::connect(socket, &AttackerHello::default()).await.expect("attacker");
    att.start_reader(Reads::Ignore);
    let args = rpc_core::codec::encode(&(1u64, 2u64)).unwrap();
    let bound = Duration::from_secs(5);

    // A bad key ("A") inside a well-formed section.
    let body = encode_request_body(&[1, 1, b'A', 0, 0], args.clone());
    let id = att.call_id();
    assert_eq!(
        att.send(request_header(id, AdderClient::ADD, FLAG_METADATA, 0), &body, bound).await,
        SendOutcome::Sent
    );
    let r = att.response(id, LIMIT).await.expect("answered");
    assert_ne!(r.header.flags & FLAG_ERROR, 0);
    let e = WireError::decode(&r.body);
    assert_eq!(e.code, rpc_core::WireErrorCode::BadRequest, "{e}");
    assert!(e.message.contains("metadata"), "{e}");

    // The same connection still serves calls.
    let id = att.call_id();
    let body =
        encode_request_body(&rpc_core::Metadata::new().with("user", "bob").unwrap().encode(), args.clone());
    assert_eq!(
        att.send(request_header(id, AdderClient::ADD, FLAG_METADATA, 0), &body, bound).await,
        SendOutcome::Sent
    );
    let r = att.response(id, LIMIT).await.expect("answered");
    assert_eq!(r.header.flags & FLAG_ERROR, 0, "{:?}", WireError::decode(&r.body));
    assert_eq!(rpc_core::codec::decode::<u64>(&r.body).unwrap(), 3);

    // A section longer than the body: the connection is closed.
    let mut body = vec![200, 0];
    body.extend_from_slice(&args);
    let id = att.call_id();
    assert_eq!(
        att.send(request_header(id, AdderClient::ADD, FLAG_METADATA, 0), &body, bound).await,
        SendOutcome::Sent
    );
    assert!(att.closed(LIMIT).await.is_some(), "a malformed section closes that connection");

    let adder = AdderClient::new(connect(&addr).await);
    assert_eq!(adder.add(2, 2).await.expect("other clients carry on"), 4);
    server.shutdown().await;
}

#[rpc_core::service]
pub trait Greeter {
    /// tarpc style: the handler takes its call's context first; the client stub does not.
    async fn hello(&self, ctx: rpc_core::Context, name: String) -> String;
}

struct GreeterImpl;

impl Greeter for GreeterImpl {
    async fn hello(&self, ctx: rpc_core::Context, name: String) -> String {
        format!("{name} via {} for {}", ctx.method(), ctx.metadata().get("user").unwrap_or("nobody"))
    }
}

#[tokio::test]
async fn a_handler_may_take_its_context_as_first_argument() {
    let (server, addr) = serve(GreeterServer::new(GreeterImpl)).await;
    let greeter = GreeterClient::new(connect(&addr).await);
    let opts = CallOptions::new().with_metadata("user", "alice").unwrap();
    let reply = greeter.with_options(opts).hello("bob".into()).await.expect("call");
    assert_eq!(reply, "bob via Greeter.hello for alice");
    server.shutdown().await;

    // Called outside a server, the handler gets a detached context.
    use rpc_core::Service;
    let payload = rpc_core::codec::encode(&("eve".to_string(),)).unwrap();
    let bytes = GreeterServer::new(GreeterImpl).call(GreeterClient::HELLO, payload.into()).await.unwrap();
    let reply: String = rpc_core::codec::decode(&bytes).unwrap();
    assert_eq!(reply, "eve via detached for nobody");
}

#[rpc_core::service]
pub trait Bump {
    /// Counts the call, then sleeps `millis`.
    async fn bump(&self, millis: u64) -> u64;
}

#[derive(Clone, Default)]
struct BumpImpl(Arc<std::sync::atomic::AtomicU64>);

impl Bump for BumpImpl {
    async fn bump(&self, millis: u64) -> u64 {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(millis)).await;
        n
    }
}

#[tokio::test]
async fn a_call_cut_by_a_lost_connection_is_disconnected_and_never_retried() {
    let counter = BumpImpl::default();
    let (server, addr) = serve(BumpServer::new(counter.clone())).await;
    let config = ClientConfig::default()
        .reconnect(Reconnect::default().initial_backoff(Duration::from_millis(20)))
        .connect_timeout(Duration::from_secs(1));
    let bump = BumpClient::new(Client::connect(&addr, config).await.expect("connect"));
    let in_flight = tokio::spawn({
        let bump = bump.clone();
        async move { bump.bump(60_000).await }
    });
    wait_for("the handler to start", || counter.0.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    drop(server); // not graceful: the connection is cut under the call
    let cut = tokio::time::timeout(LIMIT, in_flight).await.expect("bounded").expect("task");
    assert!(matches!(cut, Err(CallError::Disconnected(_))), "may or may not have run: {cut:?}");

    let restarted = tokio::time::timeout(LIMIT, async {
        loop {
            match Server::bind(&addr, ServerConfig::default(), BumpServer::new(counter.clone())).await {
                Ok(s) => return s,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("rebind the same port");
    wait_for("the client to reconnect", || bump.client().is_connected()).await;
    assert_eq!(counter.0.load(std::sync::atomic::Ordering::SeqCst), 1, "the cut call was not retried");
    assert_eq!(bump.bump(0).await.expect("a new call runs"), 2);
    restarted.shutdown().await;
}

//! What a caller sees when a call fails: one variant per condition, causes kept in the message
//! and the source chain, deadlines that count from the call.

mod common;

use std::error::Error as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{chain, setup_with, Kind};
use rpc_core::{CallError, CallOptions, Client, ClientConfig, ConnectError, Server, ServerConfig};
use serde::{Deserialize, Serialize, Serializer};

/// Limit of the side that receives too much in these tests.
const SMALL: u64 = 64 << 10;

/// Encoded length of a `Bytes` (or a `(Bytes,)`) of `len` bytes: bincode's varint length prefix
/// (`0xfc` and four bytes for lengths up to `u32::MAX`), then the bytes.
fn encoded_len(len: u64) -> u64 {
    len + 5
}

over_all_transports! {
    async fn response_over_the_clients_limit_is_payload_too_large(kind: Kind) {
        let s = setup_with(
            kind,
            ServerConfig::default().proto(common::proto()),
            ClientConfig::default().proto(common::proto().max_message_size(SMALL)),
        )
        .await;
        let len = 1 << 20;
        let err = s.client.fill(len, 7).await.unwrap_err();
        assert_eq!(err, CallError::PayloadTooLarge { len: encoded_len(len), max: SMALL });
        // The connection carries on.
        assert_eq!(s.client.fill(16, 7).await.unwrap(), common::pattern(16, 7));
    }

    async fn request_over_the_servers_limit_is_payload_too_large(kind: Kind) {
        let s = setup_with(
            kind,
            ServerConfig::default().proto(common::proto().max_message_size(SMALL)),
            ClientConfig::default().proto(common::proto()),
        )
        .await;
        let len = 1 << 20;
        let err = s.client.size(Bytes::from(vec![1u8; len as usize])).await.unwrap_err();
        assert_eq!(err, CallError::PayloadTooLarge { len: encoded_len(len), max: SMALL });
        assert_eq!(s.client.size(Bytes::from_static(b"abc")).await.unwrap(), 3);
    }

    async fn encoding_a_64_mib_argument_counts_against_a_2_ms_deadline(kind: Kind) {
        let s = common::setup(kind).await;
        let hurried = s.client.with_options(CallOptions::new().deadline(Duration::from_millis(2)));
        let err = hurried.echo(Bytes::from(vec![3u8; 64 << 20])).await.unwrap_err();
        assert_eq!(err, CallError::DeadlineExceeded);
        assert_eq!(s.client.size(Bytes::from_static(b"abcd")).await.unwrap(), 4);
    }
}

/// An argument whose encoding takes `encode_ms` (a stand-in for a large or costly argument).
#[derive(Debug, Deserialize)]
pub struct SlowToEncode {
    encode_ms: u64,
}

impl Serialize for SlowToEncode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        std::thread::sleep(Duration::from_millis(self.encode_ms));
        s.serialize_u64(self.encode_ms)
    }
}

#[rpc_core::service]
pub trait Counter {
    /// Counts the calls that reached the handler.
    async fn take(&self, arg: SlowToEncode) -> u64;
}

struct CounterImpl(Arc<AtomicU64>);

impl Counter for CounterImpl {
    async fn take(&self, _arg: SlowToEncode) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_passes_while_encoding_is_never_sent() {
    // Started in the caller's task (alone on its connection) ...
    deadline_passed_while_encoding(ClientConfig::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_call_whose_deadline_passes_while_encoding_is_never_sent() {
    // ... and by the connection's driver task, which measures the time left as it takes the
    // call from the queue.
    deadline_passed_while_encoding(ClientConfig::default().caller_drives(false)).await;
}

async fn deadline_passed_while_encoding(config: ClientConfig) {
    let count = Arc::new(AtomicU64::new(0));
    let addr = Kind::Mem.bind_addr();
    let server = Server::bind(&addr, ServerConfig::default(), CounterServer::new(CounterImpl(count.clone())))
        .await
        .expect("bind");
    let client = Client::connect(&server.local_addr().to_string(), config).await.expect("connect");
    let stub = CounterClient::new(client.clone());
    let sent_before = client.stats().await.unwrap().proto.eager_sent;

    let hurried = stub.with_options(CallOptions::new().deadline(Duration::from_millis(5)));
    let err = hurried.take(SlowToEncode { encode_ms: 50 }).await.unwrap_err();
    assert_eq!(err, CallError::DeadlineExceeded);
    assert_eq!(client.stats().await.unwrap().proto.eager_sent, sent_before, "the expired call was sent");

    // The next call is the first the handler sees.
    assert_eq!(stub.take(SlowToEncode { encode_ms: 0 }).await.unwrap(), 1);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_error_names_its_cause_and_keeps_it_as_source() {
    // A port nobody listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("tcp://127.0.0.1:{port}");
    let err = tokio::time::timeout(common::LIMIT, Client::connect(&addr, ClientConfig::default()))
        .await
        .expect("connect timed out")
        .unwrap_err();
    assert!(matches!(err, ConnectError::Transport(_)), "{err:?}");
    let source = err.source().expect("the cause is kept as the source");
    let io = source.downcast_ref::<std::io::Error>().expect("the source is the I/O error");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    let shown = err.to_string();
    assert!(shown.starts_with(&format!("connect to 127.0.0.1:{port} failed: ")), "{shown}");
    assert!(shown.ends_with(&io.to_string()), "{shown}");
}

/// A one-connection tcp proxy whose client side can be reset (RST, not FIN) on demand.
async fn resetting_proxy(upstream: std::net::SocketAddr) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
    let addr = format!("tcp://{}", listener.local_addr().expect("proxy addr"));
    let (reset, on_reset) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let Ok((mut down, _)) = listener.accept().await else { return };
        let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else { return };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
            _ = on_reset => {
                down.set_zero_linger().expect("SO_LINGER 0");
                drop(down);
            }
        }
    });
    (addr, reset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_connection_fails_the_call_with_the_io_error_at_the_root() {
    let s = common::setup(Kind::Tcp).await;
    let rpc_core::transport::Address::Tcp(upstream) = s.server.local_addr() else {
        panic!("a tcp server has a tcp address")
    };
    let (addr, reset) = resetting_proxy(*upstream).await;
    let client = Client::connect(&addr, ClientConfig::default()).await.expect("connect through the proxy");
    let stub = common::EchoClient::new(client.clone());
    let call = tokio::spawn(async move { stub.slow(30_000).await });
    // Reset once the call is in flight (bounded: 600 x 50 ms).
    let mut in_flight = false;
    for _ in 0..600 {
        if client.stats().await.expect("stats").calls_in_flight == 1 {
            in_flight = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(in_flight, "the call never went in flight");
    reset.send(()).expect("proxy alive");
    let err =
        tokio::time::timeout(common::LIMIT, call).await.expect("call ended").expect("task").unwrap_err();

    assert!(matches!(err, CallError::Disconnected(_)), "{err:?}");
    let below = chain(&err);
    let transport = below
        .first()
        .and_then(|e| e.downcast_ref::<rpc_core::transport::TransportError>())
        .expect("the transport's error is the source");
    assert!(matches!(transport, rpc_core::transport::TransportError::Disconnected(_)), "{transport:?}");
    let root =
        below.last().and_then(|e| e.downcast_ref::<std::io::Error>()).expect("an io::Error at the root");
    assert_eq!(root.kind(), std::io::ErrorKind::ConnectionReset, "{root:?}");
    let shown = err.to_string();
    assert!(shown.starts_with("connection lost: connection closed: read failed: "), "{shown}");
    assert!(shown.ends_with(&root.to_string()), "{shown}");
    // Clones share the chain.
    let copy = err.clone();
    assert_eq!(copy, err);
    assert!(chain(&copy).last().and_then(|e| e.downcast_ref::<std::io::Error>()).is_some());
}

/// Encodes as the byte 2, decodes as a `bool`: bincode refuses it on the receiving side.
#[derive(Debug)]
pub struct NotABool;

impl Serialize for NotABool {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(2)
    }
}

impl<'de> Deserialize<'de> for NotABool {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        bool::deserialize(d).map(|_| NotABool)
    }
}

#[rpc_core::service]
pub trait Mismatched {
    /// Answers something the client cannot decode.
    async fn answer(&self) -> NotABool;
    /// Takes something the server cannot decode.
    async fn take(&self, arg: NotABool) -> u64;
}

struct MismatchedImpl;

impl Mismatched for MismatchedImpl {
    async fn answer(&self) -> NotABool {
        NotABool
    }
    async fn take(&self, _arg: NotABool) -> u64 {
        0
    }
}

async fn mismatched() -> (Server, MismatchedClient) {
    let server =
        Server::bind(&Kind::Mem.bind_addr(), ServerConfig::default(), MismatchedServer::new(MismatchedImpl))
            .await
            .expect("bind");
    let client =
        Client::connect(&server.local_addr().to_string(), ClientConfig::default()).await.expect("connect");
    (server, MismatchedClient::new(client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_does_not_decode_is_codec_with_bincodes_error_at_the_root() {
    let (_server, client) = mismatched().await;
    let err = client.answer().await.unwrap_err();
    assert!(matches!(err, CallError::Codec(_)), "{err:?}");
    let below = chain(&err);
    assert!(below.first().is_some_and(|e| e.is::<rpc_core::codec::CodecError>()), "{below:?}");
    let root = below
        .last()
        .and_then(|e| e.downcast_ref::<bincode::error::DecodeError>())
        .expect("bincode's DecodeError at the root");
    let shown = err.to_string();
    assert!(shown.starts_with("codec error: decoding the response: "), "{shown}");
    assert!(shown.ends_with(&root.to_string()), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_server_cannot_decode_arrives_as_a_message_without_a_source() {
    let (_server, client) = mismatched().await;
    let err = client.take(NotABool).await.unwrap_err();
    let CallError::Remote(remote) = &err else { panic!("a remote error: {err:?}") };
    assert_eq!(remote.code, rpc_core::WireErrorCode::BadRequest);
    // The server's decode error crossed the wire as words only.
    assert!(remote.message.starts_with("bad request: "), "{}", remote.message);
    assert!(remote.message.len() > "bad request: ".len(), "{}", remote.message);
    assert!(err.source().is_none(), "a source cannot cross the wire");
    assert!(err.to_string().starts_with("remote error: BadRequest: bad request: "), "{err}");
}

//! Shared by the end-to-end tests: a test service and a way to run each test over every
//! default transport (`mem` and `tcp`).
#![allow(dead_code)]

pub mod attacker;
pub mod counting_alloc;
pub mod kv;
pub mod legit;
pub mod mem_attacker;
pub mod whoami;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rpc_core::{Client, ClientConfig, ProtoConfig, Server, ServerConfig};

/// The threshold the tests use (small, so rendezvous is cheap to exercise).
pub const THRESHOLD: usize = 4096;

/// Bounds every wait in these tests: nothing may hang.
pub const LIMIT: Duration = Duration::from_secs(60);
/// The bound over rdma: the soft-RoCE / siw VM is TCG-emulated (~17x slower), where the 64 MiB
/// payload test alone takes ~55 s on rxe0.
pub const LIMIT_RDMA: Duration = Duration::from_secs(300);

/// `echo` and `size` answer at once, whatever the size of their argument, and are marked
/// `#[rpc(inline)]`: with `ServerConfig`'s default their handlers run in the connection's driver,
/// the others' in tasks, so every suite that uses the default goes through both. (`fill` builds
/// its answer, up to many MiB: not marked.)
#[rpc_core::service]
pub trait Echo {
    /// Returns its argument.
    #[rpc(inline)]
    async fn echo(&self, data: Bytes) -> Bytes;
    /// Returns `len` bytes (response size chosen by the caller).
    async fn fill(&self, len: u64, seed: u8) -> Bytes;
    /// Takes a large request, returns its length.
    #[rpc(inline)]
    async fn size(&self, data: Bytes) -> u64;
    /// Sleeps, then answers; records whether it finished or was dropped.
    async fn slow(&self, millis: u64) -> u64;
    /// `data` back after `millis` (counted as `slow` is): a slow call whose answer's size its
    /// type does not bound.
    async fn slow_echo(&self, millis: u64, data: Bytes) -> Bytes;
}

/// Records what the handlers of the test service did.
#[derive(Debug, Default)]
pub struct Probe {
    pub slow_started: AtomicUsize,
    pub slow_finished: AtomicUsize,
    pub slow_dropped: AtomicUsize,
    /// The argument of every `slow` call, in the order their handlers started.
    pub slow_order: std::sync::Mutex<Vec<u64>>,
    pub calls: AtomicU64,
    /// `size` calls whose argument lay in the connection's pool (decoded without a copy).
    pub args_in_pool: AtomicUsize,
}

#[derive(Clone)]
pub struct EchoImpl(pub Arc<Probe>);

struct DropFlag(Arc<Probe>, bool);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.slow_dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Echo for EchoImpl {
    async fn echo(&self, data: Bytes) -> Bytes {
        self.0.calls.fetch_add(1, Ordering::Relaxed);
        data
    }
    async fn fill(&self, len: u64, seed: u8) -> Bytes {
        pattern(len as usize, seed)
    }
    async fn size(&self, data: Bytes) -> u64 {
        if rpc_core::codec::current_pool().is_some_and(|p| p.contains(&data)) {
            self.0.args_in_pool.fetch_add(1, Ordering::SeqCst);
        }
        data.len() as u64
    }
    async fn slow(&self, millis: u64) -> u64 {
        self.0.slow_started.fetch_add(1, Ordering::SeqCst);
        self.0.slow_order.lock().unwrap().push(millis);
        let mut flag = DropFlag(self.0.clone(), false);
        tokio::time::sleep(Duration::from_millis(millis)).await;
        flag.1 = true;
        self.0.slow_finished.fetch_add(1, Ordering::SeqCst);
        millis
    }
    async fn slow_echo(&self, millis: u64, data: Bytes) -> Bytes {
        self.slow(millis).await;
        data
    }
}

/// The errors below `err`, in order (each `source()` of the one before).
pub fn chain<'a>(err: &'a (dyn std::error::Error + 'static)) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut next = err.source();
    while let Some(e) = next {
        out.push(e);
        next = e.source();
    }
    out
}

pub fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect::<Vec<u8>>())
}

/// Transports every default build has.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Mem,
    Tcp,
    /// Verbs: only with the `rdma` feature, on a device (the soft-RoCE / siw VM runs these).
    Rdma,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Kind {
    /// A fresh address to bind.
    pub fn bind_addr(self) -> String {
        match self {
            Kind::Mem => format!("mem://e2e-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)),
            Kind::Tcp => "tcp://127.0.0.1:0".to_string(),
            Kind::Rdma => {
                let ip = std::env::var("RPC_RDMA_TEST_ADDR").unwrap_or_else(|_| "10.0.2.15".into());
                format!("rdma://{ip}:0")
            }
        }
    }
}

pub fn proto() -> ProtoConfig {
    ProtoConfig::default().eager_threshold(THRESHOLD).recv_depth(16).max_message_size(256 << 20)
}

pub struct Setup {
    pub server: Server,
    pub client: EchoClient,
    pub probe: Arc<Probe>,
    pub addr: String,
}

pub async fn setup(kind: Kind) -> Setup {
    setup_with(kind, ServerConfig::default().proto(proto()), ClientConfig::default().proto(proto())).await
}

pub async fn setup_with(kind: Kind, server_cfg: ServerConfig, client_cfg: ClientConfig) -> Setup {
    let probe = Arc::new(Probe::default());
    let server = Server::bind(&kind.bind_addr(), server_cfg, EchoServer::new(EchoImpl(probe.clone())))
        .await
        .expect("bind");
    let addr = server.local_addr().to_string();
    let client = Client::connect(&addr, client_cfg).await.expect("connect");
    Setup { server, client: EchoClient::new(client), probe, addr }
}

/// Runs `body` on a current-thread runtime of its own, in a thread of its own, and waits for it
/// (a panic in it is resumed here). For a test whose claim depends on tasks not running at the
/// same time, which the tests' two worker threads do not promise. The thread is detached: if the
/// test's time limit ends the wait, the test fails at once rather than waiting for the thread.
pub async fn on_one_thread<F, Fut>(body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let run = std::panic::AssertUnwindSafe(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(body())
        });
        let _ = done.send(std::panic::catch_unwind(run));
    });
    match result.await {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("the test's thread ended without a result"),
    }
}

/// Waits (bounded) until `cond` holds.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs an async test body once per transport, each bounded by [`LIMIT`].
#[macro_export]
macro_rules! over_all_transports {
    ($(async fn $name:ident($kind:ident: Kind) $body:block)*) => {
        $(
            async fn $name($kind: common::Kind) $body
        )*
        mod mem {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    tokio::time::timeout(common::LIMIT, super::$name(common::Kind::Mem)).await.expect("test timed out");
                }
            )*
        }
        mod tcp {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    tokio::time::timeout(common::LIMIT, super::$name(common::Kind::Tcp)).await.expect("test timed out");
                }
            )*
        }
        /// The same tests over verbs: selected with `--ignored` where a device exists
        /// (`scripts/vm/rdma-suite.sh` runs them on rxe0 and siw0).
        #[cfg(feature = "rdma")]
        mod rdma {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs an RDMA device: run inside the soft-RoCE/siw VM"]
                async fn $name() {
                    tokio::time::timeout(common::LIMIT_RDMA, super::$name(common::Kind::Rdma)).await.expect("test timed out");
                }
            )*
        }
    };
}

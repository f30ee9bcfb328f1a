//! The systems under test behind one trait, so that the load generator, the table and the plots
//! are the same for rpc-core (over any transport address), tarpc and a raw TCP ping-pong.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use rpc_core::codec::SharedBytes;
use rpc_core::transport::TcpSettings;
use rpc_core::{
    CallInfo, CallOptions, Client, ClientConfig, InlineHandlers, MethodId, ProtoConfig, ServerConfig,
};
use serde::Serialize;

use crate::counters::Counters;
use crate::service::BenchClient;
use crate::workload::Workload;
use crate::BenchError;

/// Which system a server runs or a client calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// This project's framework, over the transport its address names.
    RpcCore,
    /// tarpc 0.38 over TCP with its bincode codec.
    Tarpc,
    /// A hand-written length-prefixed ping-pong on a tokio TcpStream: the floor for TCP.
    RawTcp,
    /// A hand-written ping-pong straight on rpc-transport's connections, over the transport its
    /// address names: the floor of the transport under rpc-core.
    RawTransport,
}

impl System {
    /// The name used in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            System::RpcCore => "rpc-core",
            System::Tarpc => "tarpc",
            System::RawTcp => "raw-tcp",
            System::RawTransport => "raw-transport",
        }
    }
}

/// rpc-core protocol settings a run uses on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::Args)]
pub struct ProtoSettings {
    /// Eager threshold in bytes: larger payloads take the rendezvous (READ) path.
    #[arg(long, default_value_t = ProtoConfig::default().eager_threshold)]
    pub eager_threshold: usize,
    /// Receive buffers posted per connection (the credits granted to the peer).
    #[arg(long, default_value_t = ProtoConfig::default().recv_depth)]
    pub recv_depth: u32,
    /// Calls in flight per connection.
    #[arg(long, default_value_t = ProtoConfig::default().max_in_flight)]
    pub max_in_flight: u32,
    /// Run each handler in a task of its own (`InlineHandlers::Never`), as `ServerConfig`'s
    /// default does for methods not marked `#[rpc(inline)]`, instead of in the connection's
    /// driver (the benchmark service's handlers answer at once: its methods are marked, and
    /// `ServerConfig`'s default, `InlineHandlers::Marked`, runs them there).
    #[arg(long)]
    pub handlers_in_tasks: bool,
    /// tcp: no look at the socket after a SEND (`TcpSettings::read_after_send` off, both sides),
    /// to measure what the look gives.
    #[arg(long)]
    pub no_tcp_look: bool,
    /// tcp: the busy-poll window in microseconds (`TcpSettings::busy_poll`, both sides; default
    /// 0, off). For processes on CPUs of their own: with both on one CPU it slows round trips.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub tcp_busy_poll_us: u64,
    /// How long setting up a connection may take, in seconds: the client's connect timeout and
    /// the server's handshake timeout (rpc-core). Default: `ClientConfig`'s and
    /// `ServerConfig`'s (10 s and 5 s). Under valgrind in the VM, a set-up can take longer.
    #[arg(long, value_name = "SECS")]
    pub setup_timeout: Option<u64>,
}

impl Default for ProtoSettings {
    fn default() -> Self {
        let d = ProtoConfig::default();
        ProtoSettings {
            eager_threshold: d.eager_threshold,
            recv_depth: d.recv_depth,
            max_in_flight: d.max_in_flight,
            handlers_in_tasks: false,
            no_tcp_look: false,
            tcp_busy_poll_us: 0,
            setup_timeout: None,
        }
    }
}

impl ProtoSettings {
    /// The protocol config these settings describe.
    pub fn proto(&self) -> ProtoConfig {
        ProtoConfig::default()
            .eager_threshold(self.eager_threshold)
            .recv_depth(self.recv_depth)
            .max_in_flight(self.max_in_flight)
    }

    /// The tcp backend's settings for these settings.
    pub fn tcp(&self) -> TcpSettings {
        TcpSettings::default()
            .read_after_send(!self.no_tcp_look)
            .busy_poll(Duration::from_micros(self.tcp_busy_poll_us))
    }

    /// The server config for these settings (handlers bounded high: the load decides).
    pub fn server_config(&self) -> ServerConfig {
        // The benchmark service's handlers answer at once, and its methods are marked so: with
        // `ServerConfig`'s default they run in the connection's driver, unless asked otherwise.
        let mut config =
            ServerConfig::default().proto(self.proto()).tcp(self.tcp()).max_concurrent_handlers(1 << 16);
        if let Some(secs) = self.setup_timeout {
            config = config.handshake_timeout(Duration::from_secs(secs));
        }
        match self.handlers_in_tasks {
            true => config.inline_handlers(InlineHandlers::Never),
            false => config,
        }
    }

    /// The `--flag value` arguments that give a child process the same settings.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--eager-threshold".into(),
            self.eager_threshold.to_string(),
            "--recv-depth".into(),
            self.recv_depth.to_string(),
            "--max-in-flight".into(),
            self.max_in_flight.to_string(),
        ];
        if self.handlers_in_tasks {
            args.push("--handlers-in-tasks".into());
        }
        if self.no_tcp_look {
            args.push("--no-tcp-look".into());
        }
        if self.tcp_busy_poll_us > 0 {
            args.extend(["--tcp-busy-poll-us".into(), self.tcp_busy_poll_us.to_string()]);
        }
        if let Some(secs) = self.setup_timeout {
            args.extend(["--setup-timeout".into(), secs.to_string()]);
        }
        args
    }
}

/// A connected client of some system, able to run one call of a prepared workload.
pub trait Target: Clone + Send + Sync + 'static {
    /// A workload at one size, encoded once so that the loop only clones it.
    type Prepared: Send + Sync + 'static;

    /// Connects one client connection.
    fn connect(addr: &str, settings: &ProtoSettings)
        -> impl Future<Output = Result<Self, BenchError>> + Send;

    /// Prepares `workload` at `size` bytes.
    fn prepare(&self, workload: Workload, size: usize) -> Result<Self::Prepared, BenchError>;

    /// Runs one call and checks its answer; tells the path each direction took.
    fn call<'a>(
        &'a self,
        p: &'a Self::Prepared,
    ) -> impl Future<Output = Result<CallInfo, BenchError>> + Send + 'a;

    /// This connection's rpc-core counters (`None` for other systems).
    fn counters(&self) -> impl Future<Output = Option<Counters>> + Send + '_;
}

/// A client of the rpc-core bench service.
#[derive(Debug, Clone)]
pub struct RpcTarget {
    client: Client,
    opts: CallOptions,
}

/// What an answer must be.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// Exactly this many bytes.
    Bytes(usize),
    /// A length equal to this.
    Len(u64),
}

/// An encoded rpc-core request.
#[derive(Debug, Clone)]
pub struct RpcPrepared {
    method: MethodId,
    payload: Bytes,
    expect: Expect,
}

fn encode<T: Serialize>(v: &T) -> Result<Bytes, BenchError> {
    rpc_core::codec::encode(v).map_err(|e| BenchError::Usage(format!("encoding a request: {e}")))
}

/// Decodes a response as a generated stub does: a `Bytes` result as `SharedBytes`, a slice of the
/// response (no copy).
fn decode<T: serde::de::DeserializeOwned>(b: &Bytes) -> Result<T, BenchError> {
    rpc_core::codec::decode_shared(b).map_err(|e| BenchError::Call(format!("decoding the response: {e}")))
}

/// Checks an answer against what the workload expects.
pub fn check(expect: Expect, got_bytes: Option<usize>, got_len: Option<u64>) -> Result<(), BenchError> {
    match (expect, got_bytes, got_len) {
        (Expect::Bytes(n), Some(m), _) if n == m => Ok(()),
        (Expect::Len(n), _, Some(m)) if n == m => Ok(()),
        _ => Err(BenchError::Call(format!(
            "expected {expect:?}, got {got_bytes:?} bytes / length {got_len:?}"
        ))),
    }
}

/// The payload of `size` bytes every system sends.
pub fn payload(size: usize) -> Bytes {
    Bytes::from(vec![0x5au8; size])
}

impl Target for RpcTarget {
    type Prepared = RpcPrepared;

    async fn connect(addr: &str, settings: &ProtoSettings) -> Result<Self, BenchError> {
        let mut config = ClientConfig::default().proto(settings.proto()).tcp(settings.tcp());
        if let Some(secs) = settings.setup_timeout {
            config = config.connect_timeout(Duration::from_secs(secs));
        }
        let client = Client::connect(addr, config).await.map_err(|e| BenchError::connect(addr, e))?;
        Ok(RpcTarget { client, opts: CallOptions::new() })
    }

    fn prepare(&self, workload: Workload, size: usize) -> Result<RpcPrepared, BenchError> {
        Ok(match workload {
            Workload::Echo => RpcPrepared {
                method: BenchClient::ECHO,
                payload: encode(&(payload(size),))?,
                expect: Expect::Bytes(size),
            },
            Workload::Upload => RpcPrepared {
                method: BenchClient::UPLOAD,
                payload: encode(&(payload(size),))?,
                expect: Expect::Len(size as u64),
            },
            Workload::Download => RpcPrepared {
                method: BenchClient::DOWNLOAD,
                payload: encode(&(size as u64,))?,
                expect: Expect::Bytes(size),
            },
        })
    }

    async fn call<'a>(&'a self, p: &'a RpcPrepared) -> Result<CallInfo, BenchError> {
        let (resp, info) = self
            .client
            .call_with_info(p.method, p.payload.clone(), &self.opts)
            .await
            .map_err(|e| BenchError::Call(e.to_string()))?;
        match p.expect {
            Expect::Bytes(_) => check(p.expect, Some(decode::<SharedBytes>(&resp)?.0.len()), None)?,
            Expect::Len(_) => check(p.expect, None, Some(decode::<u64>(&resp)?))?,
        }
        Ok(info)
    }

    async fn counters(&self) -> Option<Counters> {
        self.client.stats().await.ok().map(|s| Counters::from(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_accepts_only_the_expected_answer() {
        assert!(check(Expect::Bytes(4), Some(4), None).is_ok());
        assert!(check(Expect::Bytes(4), Some(3), None).is_err());
        assert!(check(Expect::Len(9), None, Some(9)).is_ok());
        assert!(check(Expect::Len(9), Some(9), None).is_err());
    }

    #[test]
    fn settings_round_trip_through_args() {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            s: ProtoSettings,
        }
        for (handlers_in_tasks, no_tcp_look, tcp_busy_poll_us, setup_timeout) in
            [(false, false, 0, None), (true, true, 50, Some(60))]
        {
            let s = ProtoSettings {
                eager_threshold: 4096,
                recv_depth: 16,
                max_in_flight: 7,
                handlers_in_tasks,
                no_tcp_look,
                tcp_busy_poll_us,
                setup_timeout,
            };
            let mut args = vec!["p".to_string()];
            args.extend(s.to_args());
            let parsed = <P as clap::Parser>::try_parse_from(args).unwrap();
            assert_eq!(parsed.s, s);
        }
    }
}

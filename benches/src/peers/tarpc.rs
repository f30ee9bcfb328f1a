//! tarpc 0.38 over TCP with its bincode codec: the peer the comparison runs against. Both sides
//! set TCP_NODELAY as rpc-core's TCP transport does, and frames may be as large as rpc-core's
//! default message limit (tarpc's default frame limit is 8 MiB).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use rpc_core::CallInfo;
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tarpc::tokio_util::codec::LengthDelimitedCodec;
use tarpc::{client, context};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::counters::Counters;
use crate::service::BenchImpl;
use crate::target::{check, payload, Expect, ProtoSettings, Target};
use crate::workload::Workload;
use crate::BenchError;

/// Largest frame either side accepts.
const MAX_FRAME: usize = 1 << 30;
/// The deadline each call carries (tarpc's default is 10 s; a 64 MiB call may need more).
const DEADLINE: Duration = Duration::from_secs(120);

/// The same three methods as the rpc-core service.
#[tarpc::service]
pub trait TarpcBench {
    /// Returns its argument.
    async fn echo(data: Bytes) -> Bytes;
    /// Returns the length of its argument.
    async fn upload(data: Bytes) -> u64;
    /// Returns `len` bytes.
    async fn download(len: u64) -> Bytes;
}

#[derive(Clone)]
struct TarpcServer(BenchImpl);

impl TarpcBench for TarpcServer {
    async fn echo(self, _: context::Context, data: Bytes) -> Bytes {
        data
    }
    async fn upload(self, _: context::Context, data: Bytes) -> u64 {
        data.len() as u64
    }
    async fn download(self, _: context::Context, len: u64) -> Bytes {
        self.0.blob(len.min(crate::service::MAX_DOWNLOAD) as usize)
    }
}

fn framed(stream: TcpStream) -> tarpc::tokio_util::codec::Framed<TcpStream, LengthDelimitedCodec> {
    LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).new_framed(stream)
}

/// Binds `addr` and serves every connection as tarpc's examples do (one task per request).
pub async fn serve(addr: SocketAddr) -> Result<(SocketAddr, JoinHandle<()>), BenchError> {
    let listener = TcpListener::bind(addr).await.map_err(|e| BenchError::connect(&addr.to_string(), e))?;
    let local = listener.local_addr()?;
    let service = TarpcServer(BenchImpl::new());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let transport = tarpc::serde_transport::new(framed(stream), Bincode::default());
            let channel = BaseChannel::with_defaults(transport).execute(service.clone().serve());
            tokio::spawn(channel.for_each(|response| async move {
                tokio::spawn(response);
            }));
        }
    });
    Ok((local, task))
}

/// A tarpc client connection.
#[derive(Clone)]
pub struct TarpcTarget {
    client: TarpcBenchClient,
}

impl std::fmt::Debug for TarpcTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TarpcTarget").finish_non_exhaustive()
    }
}

/// A prepared tarpc request.
#[derive(Debug, Clone)]
pub struct TarpcPrepared {
    workload: Workload,
    data: Bytes,
    size: usize,
}

fn ctx() -> context::Context {
    let mut c = context::current();
    c.deadline = Instant::now() + DEADLINE;
    c
}

fn call_error(e: tarpc::client::RpcError) -> BenchError {
    BenchError::Call(format!("tarpc: {e}"))
}

impl Target for TarpcTarget {
    type Prepared = TarpcPrepared;

    async fn connect(addr: &str, _: &ProtoSettings) -> Result<Self, BenchError> {
        let sock = super::tcp_socket(addr)?;
        let stream = TcpStream::connect(sock).await.map_err(|e| BenchError::connect(addr, e))?;
        stream.set_nodelay(true)?;
        let transport = tarpc::serde_transport::new(framed(stream), Bincode::default());
        let client = TarpcBenchClient::new(client::Config::default(), transport).spawn();
        Ok(TarpcTarget { client })
    }

    fn prepare(&self, workload: Workload, size: usize) -> Result<TarpcPrepared, BenchError> {
        let data = match workload {
            Workload::Echo | Workload::Upload => payload(size),
            Workload::Download => Bytes::new(),
        };
        Ok(TarpcPrepared { workload, data, size })
    }

    async fn call<'a>(&'a self, p: &'a TarpcPrepared) -> Result<CallInfo, BenchError> {
        match p.workload {
            Workload::Echo => {
                let got = self.client.echo(ctx(), p.data.clone()).await.map_err(call_error)?;
                check(Expect::Bytes(p.size), Some(got.len()), None)?;
            }
            Workload::Upload => {
                let got = self.client.upload(ctx(), p.data.clone()).await.map_err(call_error)?;
                check(Expect::Len(p.size as u64), None, Some(got))?;
            }
            Workload::Download => {
                let got = self.client.download(ctx(), p.size as u64).await.map_err(call_error)?;
                check(Expect::Bytes(p.size), Some(got.len()), None)?;
            }
        }
        Ok(CallInfo::default())
    }

    async fn counters(&self) -> Option<Counters> {
        None
    }
}

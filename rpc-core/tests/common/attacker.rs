//! A raw tcp client that speaks the tcp transport's framing and the protocol's header by hand,
//! to do what a well-behaved `rpc_core::Client` never does: advertise regions it will not serve,
//! cancel calls whose READ is in flight, never READ a response nor report it done, send beyond
//! its credits, never read its socket, never send its hello, go silent.
//!
//! tcp framing (rpc-transport/src/tcp/wire.rs; all integers little endian):
//!
//! ```text
//! hello:       magic "RRPC" | version u16 = 2 | private_len u16 | recv_depth u32 | recv_size u32
//!                | push_window u64 (0: the attacker takes no pushes) | private
//! 1 SEND       len u32                                  | len bytes (one protocol frame)
//! 2 READ_REQ   id u64 | addr u64 | len u64 | rkey u32
//! 3 READ_RESP  id u64 | status u8 | len u64             | len bytes (status 0 = OK only)
//! ```
//!
//! The protocol frames inside SENDs are built with the public `rpc_core::proto` types
//! ([`Header`], [`Kind`], [`Hello`], [`encode_desc`]), never with copies of them.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use rpc_core::proto::{encode_desc, Header, Hello, Kind, ProtoConfig, FLAG_RENDEZVOUS, HEADER_LEN};
use rpc_core::transport::RegionDesc;
use rpc_core::MethodId;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

const TCP_MAGIC: &[u8; 4] = b"RRPC";
const TCP_VERSION: u16 = 2;
const TCP_HELLO_FIXED: usize = 24;
const T_SEND: u8 = 1;
const T_READ_REQ: u8 = 2;
const T_READ_RESP: u8 = 3;
const STATUS_OK: u8 = 0;
const STATUS_INVALID_KEY: u8 = 1;

/// What the attacker announces at setup.
#[derive(Debug, Clone, Copy)]
pub struct AttackerHello {
    /// Receives the attacker claims to have posted: the server starts with this many credits
    /// less the spare (`rpc_core::proto::SPARE_RECEIVES`).
    pub recv_depth: u32,
    /// The largest SEND the attacker claims to accept.
    pub recv_size: u32,
    /// The protocol hello carried as private data.
    pub proto: Hello,
}

impl Default for AttackerHello {
    /// What a default `rpc_core::Client` announces.
    fn default() -> Self {
        let proto = ProtoConfig::default();
        AttackerHello { recv_depth: proto.recv_depth, recv_size: proto.recv_size(), proto: proto.hello() }
    }
}

impl AttackerHello {
    /// The tcp hello bytes.
    pub fn encode(&self) -> Vec<u8> {
        let private = self.proto.encode();
        let mut out = Vec::with_capacity(TCP_HELLO_FIXED + private.len());
        out.extend_from_slice(TCP_MAGIC);
        out.extend_from_slice(&TCP_VERSION.to_le_bytes());
        out.extend_from_slice(&(private.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.recv_depth.to_le_bytes());
        out.extend_from_slice(&self.recv_size.to_le_bytes());
        // No push window: the server never pushes its regions to the attacker, which READs
        // nothing anyway (and a 0 window is what a peer that does not know pushes would say).
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&private);
        out
    }
}

/// What the server announced in its hello.
#[derive(Debug, Clone, Copy)]
pub struct ServerHello {
    /// Receives the server posted: the attacker's initial credits, and the server's spare
    /// (`rpc_core::proto::SPARE_RECEIVES`).
    pub recv_depth: u32,
    /// The server's receive buffer size.
    pub recv_size: u32,
    /// The server's protocol hello.
    pub proto: Hello,
}

/// One protocol frame of a request (or any kind) as the tcp SEND that carries it.
pub fn send_frame(mut header: Header, body: &[u8]) -> Vec<u8> {
    header.body_len = u32::try_from(body.len()).expect("body fits a u32");
    let mut h = [0u8; HEADER_LEN];
    header.encode(&mut h);
    let len = (HEADER_LEN + body.len()) as u32;
    let mut out = Vec::with_capacity(5 + HEADER_LEN + body.len());
    out.push(T_SEND);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(body);
    out
}

/// A request header: eager unless `flags` says otherwise; `deadline_us` 0 = none.
pub fn request_header(call_id: u64, method: MethodId, flags: u16, deadline_us: u64) -> Header {
    let mut h = Header::new(Kind::Request);
    h.call_id = call_id;
    h.method_id = method;
    h.flags = flags;
    h.arg = deadline_us;
    h
}

/// A response the attacker received.
#[derive(Debug, Clone)]
pub struct Response {
    /// Its header (flags tell eager, rendezvous or error).
    pub header: Header,
    /// Its body: the payload, a region descriptor, or a wire error.
    pub body: Bytes,
}

/// What the attacker's reader task has seen so far.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Protocol frames received.
    pub frames: u64,
    /// Responses by call id.
    pub responses: HashMap<u64, Response>,
    /// Frames whose protocol header did not decode (kinds unknown to this build, or garbage).
    pub undecodable: u64,
    /// Why the last of those did not decode.
    pub last_undecodable: Option<String>,
    /// Credits the server returned to the attacker.
    pub credits_returned: u64,
    /// `done` reports from the server (it finished READing an attacker region).
    pub dones: Vec<u64>,
    /// READ requests from the server.
    pub read_reqs: u64,
    /// Of those, answered with data.
    pub reads_served: u64,
    /// When the server closed the connection (EOF or reset), since connect.
    pub closed_at: Option<Duration>,
    /// How it ended.
    pub close_reason: Option<String>,
}

/// Regions the attacker serves READs from, by key; `addr` is the offset base.
#[derive(Debug, Default)]
pub struct Regions {
    by_key: HashMap<u32, (u64, Arc<Vec<u8>>)>,
    /// READs of unknown keys are left unanswered (the server's READ stays in flight) instead
    /// of refused.
    pub ignore_unknown: bool,
}

impl Regions {
    /// No region yet; READs of unknown keys are refused, or left unanswered with
    /// `ignore_unknown`.
    pub fn new(ignore_unknown: bool) -> Regions {
        Regions { by_key: HashMap::new(), ignore_unknown }
    }

    /// Offers `data` under `rkey` at address `addr`; returns its descriptor.
    pub fn add(&mut self, rkey: u32, addr: u64, data: Arc<Vec<u8>>) -> RegionDesc {
        let len = data.len() as u64;
        self.by_key.insert(rkey, (addr, data));
        RegionDesc { addr, len, rkey }
    }
}

/// What the reader task does with the server's READ requests.
#[derive(Debug, Clone)]
pub enum Reads {
    /// Never answers them (the server's READ stays in flight).
    Ignore,
    /// Answers from these regions (unknown key or out of bounds: refused).
    Serve(Arc<Regions>),
}

/// How a bounded send ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// Written.
    Sent,
    /// Not written within the bound: the server stopped reading (backpressure). The stream may
    /// hold part of a frame now, so every later send reports `Blocked` too.
    Blocked,
    /// The server closed the connection.
    Closed(String),
}

/// How the end of a never-reading attacker's connection looked when finally checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    /// The server had closed it: end of stream (or reset) after reading `bytes`.
    Closed { after: Duration, bytes: u64, how: String },
    /// Still open when the bound passed.
    Open { bytes: u64 },
}

/// A raw connection to a tcp server.
#[derive(Debug)]
pub struct Attacker {
    server: ServerHello,
    started: Instant,
    read: Option<OwnedReadHalf>,
    write: Arc<tokio::sync::Mutex<Writer>>,
    seen: Arc<Mutex<Seen>>,
    reader: Option<JoinHandle<()>>,
    silent: Arc<AtomicBool>,
    next_call_id: u64,
    /// Protocol frames sent.
    pub frames_sent: u64,
    /// Bytes written on the socket (hello included).
    pub bytes_sent: u64,
}

#[derive(Debug)]
struct Writer {
    half: OwnedWriteHalf,
    poisoned: bool,
}

impl Attacker {
    /// Connects, sends `hello`, reads and checks the server's hello (both within 10 s).
    pub async fn connect(addr: SocketAddr, hello: &AttackerHello) -> io::Result<Attacker> {
        let bound = Duration::from_secs(10);
        let stream = timeout(bound, TcpStream::connect(addr)).await.map_err(|_| timed_out("connect"))??;
        stream.set_nodelay(true)?;
        let started = Instant::now();
        let (mut read, mut write) = stream.into_split();
        let ours = hello.encode();
        timeout(bound, write.write_all(&ours)).await.map_err(|_| timed_out("sending hello"))??;
        let server =
            timeout(bound, read_server_hello(&mut read)).await.map_err(|_| timed_out("server hello"))??;
        Ok(Attacker {
            server,
            started,
            read: Some(read),
            write: Arc::new(tokio::sync::Mutex::new(Writer { half: write, poisoned: false })),
            seen: Arc::new(Mutex::new(Seen::default())),
            reader: None,
            silent: Arc::new(AtomicBool::new(false)),
            next_call_id: 1,
            frames_sent: 0,
            bytes_sent: ours.len() as u64,
        })
    }

    /// The server's hello.
    pub fn server(&self) -> &ServerHello {
        &self.server
    }

    /// Time since the connection was made.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// A fresh call id.
    pub fn call_id(&mut self) -> u64 {
        let id = self.next_call_id;
        self.next_call_id += 1;
        id
    }

    /// Starts reading the socket in a task (frames, READ requests, end of stream).
    pub fn start_reader(&mut self, reads: Reads) {
        let read = self.read.take().expect("reader already started or socket drained");
        let (seen, write, started) = (self.seen.clone(), self.write.clone(), self.started);
        let silent = self.silent.clone();
        self.reader = Some(tokio::spawn(async move {
            let mut r = BufReader::with_capacity(64 * 1024, read);
            let end = read_loop(&mut r, &seen, &write, &reads, &silent).await;
            let mut s = lock(&seen);
            s.closed_at = Some(started.elapsed());
            s.close_reason = Some(end);
        }));
    }

    /// From now on the attacker answers nothing: no READ response, no frame (its callers must
    /// stop sending too). The reader task keeps consuming the socket only to note when the
    /// server closes it; to the server this peer has gone silent without a FIN.
    pub fn go_silent(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }

    /// A snapshot of what the reader task has seen.
    pub fn seen(&self) -> Seen {
        lock(&self.seen).clone()
    }

    /// Credits the attacker may still use by the protocol's count: the server's receives plus
    /// what it returned, minus the frames sent. Negative once the attacker sends beyond them.
    pub fn credits_left(&self) -> i64 {
        let granted = self.server.recv_depth - rpc_core::proto::SPARE_RECEIVES;
        i64::from(granted) + lock(&self.seen).credits_returned as i64 - self.frames_sent as i64
    }

    /// Writes raw bytes, within `within`.
    pub async fn send_raw(&mut self, bytes: &[u8], within: Duration) -> SendOutcome {
        let mut w = self.write.lock().await;
        if w.poisoned {
            return SendOutcome::Blocked;
        }
        match timeout(within, w.half.write_all(bytes)).await {
            Ok(Ok(())) => {
                self.bytes_sent += bytes.len() as u64;
                SendOutcome::Sent
            }
            Ok(Err(e)) => SendOutcome::Closed(e.to_string()),
            Err(_) => {
                w.poisoned = true;
                SendOutcome::Blocked
            }
        }
    }

    /// Sends `frames` protocol frames already encoded back to back in `bytes`.
    pub async fn send_frames(&mut self, bytes: &[u8], frames: u64, within: Duration) -> SendOutcome {
        let out = self.send_raw(bytes, within).await;
        if out == SendOutcome::Sent {
            self.frames_sent += frames;
        }
        out
    }

    /// Sends one protocol frame.
    pub async fn send(&mut self, header: Header, body: &[u8], within: Duration) -> SendOutcome {
        let frame = send_frame(header, body);
        self.send_frames(&frame, 1, within).await
    }

    /// Sends an eager request.
    pub async fn request(
        &mut self,
        call_id: u64,
        method: MethodId,
        args: &[u8],
        within: Duration,
    ) -> SendOutcome {
        self.send(request_header(call_id, method, 0, 0), args, within).await
    }

    /// Sends a request whose arguments are advertised as `desc` (rendezvous).
    pub async fn request_rendezvous(
        &mut self,
        call_id: u64,
        method: MethodId,
        desc: RegionDesc,
        within: Duration,
    ) -> SendOutcome {
        let body = encode_desc(&desc);
        self.send(request_header(call_id, method, FLAG_RENDEZVOUS, 0), &body, within).await
    }

    /// Cancels a call.
    pub async fn cancel(&mut self, call_id: u64, within: Duration) -> SendOutcome {
        let mut h = Header::new(Kind::Cancel);
        h.call_id = call_id;
        self.send(h, &[], within).await
    }

    /// Waits (bounded) for the response to `call_id`.
    pub async fn response(&self, call_id: u64, within: Duration) -> Option<Response> {
        let until = Instant::now() + within;
        loop {
            {
                let seen = lock(&self.seen);
                if let Some(r) = seen.responses.get(&call_id) {
                    return Some(r.clone());
                }
                if seen.closed_at.is_some() {
                    return None;
                }
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits (bounded) until the reader task sees the connection end; when it did.
    pub async fn closed(&self, within: Duration) -> Option<Duration> {
        let until = Instant::now() + within;
        loop {
            if let Some(at) = lock(&self.seen).closed_at {
                return Some(at);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// For an attacker that never read its socket: reads and discards what the server sent
    /// until the end of the stream, within `within`.
    pub async fn drain(&mut self, within: Duration) -> Drained {
        let Some(mut read) = self.read.take() else {
            let closed = self.closed(within).await;
            let bytes = 0;
            return match closed {
                Some(after) => Drained::Closed {
                    after,
                    bytes,
                    how: self.seen().close_reason.clone().unwrap_or_default(),
                },
                None => Drained::Open { bytes },
            };
        };
        let until = Instant::now() + within;
        let mut buf = vec![0u8; 256 * 1024];
        let mut bytes = 0u64;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match timeout(left, read.read(&mut buf)).await {
                Err(_) => return Drained::Open { bytes },
                Ok(Ok(0)) => {
                    return Drained::Closed { after: self.elapsed(), bytes, how: "end of stream".into() }
                }
                Ok(Ok(n)) => bytes += n as u64,
                Ok(Err(e)) => return Drained::Closed { after: self.elapsed(), bytes, how: e.to_string() },
            }
        }
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        if let Some(r) = self.reader.take() {
            r.abort();
        }
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what}: timed out"))
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

async fn read_server_hello(read: &mut OwnedReadHalf) -> io::Result<ServerHello> {
    let mut fixed = [0u8; TCP_HELLO_FIXED];
    read.read_exact(&mut fixed).await?;
    if &fixed[..4] != TCP_MAGIC {
        return Err(invalid(format!("bad tcp magic {:02x?}", &fixed[..4])));
    }
    let private_len = usize::from(u16::from_le_bytes([fixed[6], fixed[7]]));
    let recv_depth = u32::from_le_bytes(fixed[8..12].try_into().expect("4 bytes"));
    let recv_size = u32::from_le_bytes(fixed[12..16].try_into().expect("4 bytes"));
    let mut private = vec![0u8; private_len];
    read.read_exact(&mut private).await?;
    let proto = Hello::decode(&private).map_err(|e| invalid(e.to_string()))?;
    Ok(ServerHello { recv_depth, recv_size, proto })
}

/// Reads frames until the stream ends; returns how it ended.
async fn read_loop(
    r: &mut BufReader<OwnedReadHalf>,
    seen: &Mutex<Seen>,
    write: &tokio::sync::Mutex<Writer>,
    reads: &Reads,
    silent: &AtomicBool,
) -> String {
    loop {
        let ty = match r.read_u8().await {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return "end of stream".into(),
            Err(e) => return e.to_string(),
        };
        let step = match ty {
            T_SEND => on_send(r, seen).await,
            T_READ_REQ => {
                let reads = if silent.load(Ordering::Relaxed) { &Reads::Ignore } else { reads };
                on_read_req(r, seen, write, reads).await
            }
            T_READ_RESP => Err(invalid("READ response, but the attacker never READs".into())),
            other => Err(invalid(format!("unknown tcp frame type {other}"))),
        };
        if let Err(e) = step {
            return e.to_string();
        }
    }
}

async fn on_send(r: &mut BufReader<OwnedReadHalf>, seen: &Mutex<Seen>) -> io::Result<()> {
    let len = r.read_u32_le().await? as usize;
    let mut frame = vec![0u8; len];
    r.read_exact(&mut frame).await?;
    let mut s = lock(seen);
    s.frames += 1;
    let header = match Header::decode(&frame) {
        Ok(h) => h,
        Err(e) => {
            // A kind this version of the tests does not know (e.g. a keepalive ping): noted, and
            // never answered.
            s.undecodable += 1;
            s.last_undecodable = Some(e.to_string());
            return Ok(());
        }
    };
    s.credits_returned += u64::from(header.credits);
    if header.done != 0 {
        s.dones.push(header.done);
    }
    if header.kind == Kind::Response {
        let body = Bytes::copy_from_slice(&frame[HEADER_LEN..]);
        s.responses.insert(header.call_id, Response { header, body });
    }
    Ok(())
}

async fn on_read_req(
    r: &mut BufReader<OwnedReadHalf>,
    seen: &Mutex<Seen>,
    write: &tokio::sync::Mutex<Writer>,
    reads: &Reads,
) -> io::Result<()> {
    let id = r.read_u64_le().await?;
    let addr = r.read_u64_le().await?;
    let len = r.read_u64_le().await?;
    let rkey = r.read_u32_le().await?;
    lock(seen).read_reqs += 1;
    let Reads::Serve(regions) = reads else { return Ok(()) };
    let data = regions.by_key.get(&rkey).and_then(|(base, data)| {
        let start = usize::try_from(addr.checked_sub(*base)?).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        data.get(start..end).map(|_| (data.clone(), start, end))
    });
    if data.is_none() && regions.ignore_unknown {
        return Ok(());
    }
    let mut w = write.lock().await;
    match data {
        Some((data, start, end)) => {
            let mut head = Vec::with_capacity(18);
            head.push(T_READ_RESP);
            head.extend_from_slice(&id.to_le_bytes());
            head.push(STATUS_OK);
            head.extend_from_slice(&len.to_le_bytes());
            w.half.write_all(&head).await?;
            w.half.write_all(&data[start..end]).await?;
            lock(seen).reads_served += 1;
        }
        None => {
            let mut head = Vec::with_capacity(18);
            head.push(T_READ_RESP);
            head.extend_from_slice(&id.to_le_bytes());
            head.push(STATUS_INVALID_KEY);
            head.extend_from_slice(&0u64.to_le_bytes());
            w.half.write_all(&head).await?;
        }
    }
    Ok(())
}

/// Opens `n` sockets that never send anything (no hello); each is watched by a task that reads
/// and discards what the server sends and records when the server closes it (bounded by
/// `watch_for`). Returns the watchers; connecting stops at the first error.
pub async fn hello_less_sockets(
    addr: SocketAddr,
    n: usize,
    watch_for: Duration,
) -> (Vec<JoinHandle<Option<Duration>>>, Option<String>) {
    let mut watchers = Vec::with_capacity(n);
    for _ in 0..n {
        let stream = match timeout(Duration::from_secs(10), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return (watchers, Some(e.to_string())),
            Err(_) => return (watchers, Some("connect timed out".into())),
        };
        watchers.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut stream = stream;
            let mut buf = [0u8; 256];
            let until = started + watch_for;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                match timeout(left, stream.read(&mut buf)).await {
                    Err(_) => return None,
                    Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
                    Ok(Ok(_)) => {}
                }
            }
        }));
    }
    (watchers, None)
}

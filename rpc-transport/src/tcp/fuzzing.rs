//! The tcp wire format and reader, driven over in-memory bytes for the fuzz targets (re-exported
//! by [`crate::fuzzing`]).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use super::push::Push;
use super::reader::Reader;
use super::wire;
use super::writer::Outgoing;
use crate::soft::{Death, Soft};
use crate::{Completion, ConnParams, RegionDesc, TransportCounters};

/// Bytes of the tcp hello before the private data.
pub const TCP_HELLO_FIXED: usize = wire::HELLO_FIXED;
/// The READ_RESP status of a served READ.
pub const TCP_STATUS_OK: u8 = wire::STATUS_OK;

/// What the fixed part of a tcp hello announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpHello {
    /// Receives the peer posted.
    pub recv_depth: u32,
    /// The peer's receive buffer size.
    pub recv_size: u32,
    /// The push window the peer grants.
    pub push_window: u64,
    /// Bytes of private data that follow.
    pub private_len: usize,
}

/// Validates the fixed part of a peer's tcp hello.
pub fn tcp_decode_hello(fixed: &[u8; TCP_HELLO_FIXED]) -> Result<TcpHello, String> {
    wire::decode_hello(fixed).map(|h| TcpHello {
        recv_depth: h.recv_depth,
        recv_size: h.recv_size,
        push_window: h.push_window,
        private_len: h.private_len,
    })
}

/// Our tcp hello for these parameters, private data included.
pub fn tcp_encode_hello(recv_depth: u32, recv_size: u32, push_window: u64, private_data: &[u8]) -> Vec<u8> {
    // `..default()`: ConnParams has fields (handshake bounds) that the hello does not carry.
    let params = ConnParams {
        recv_depth,
        recv_size,
        tcp: crate::TcpSettings { push_window, ..crate::TcpSettings::default() },
        private_data: Bytes::copy_from_slice(private_data),
        ..ConnParams::default()
    };
    wire::encode_hello(&params)
}

/// The fixed header of a tcp frame (a public mirror of the reader's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpFrame {
    /// A SEND of `len` bytes (which follow on the wire).
    Send {
        /// Payload length.
        len: u32,
    },
    /// A READ request.
    ReadReq {
        /// Request id, echoed in the response.
        id: u64,
        /// First byte.
        addr: u64,
        /// Length.
        len: u64,
        /// Remote key.
        rkey: u32,
    },
    /// A READ response (`len` bytes follow when `status` is OK).
    ReadResp {
        /// The request's id.
        id: u64,
        /// [`TCP_STATUS_OK`] or a refusal.
        status: u8,
        /// Payload length.
        len: u64,
    },
    /// A region's bytes pushed by its owner (`len` bytes follow).
    Push {
        /// The region's key.
        rkey: u32,
        /// Its first byte.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A pushed region was revoked.
    Revoke {
        /// The region's key.
        rkey: u32,
    },
    /// A pushed region handed back (its window returns).
    Window {
        /// The region's key.
        rkey: u32,
        /// Its length.
        len: u64,
    },
}

impl TcpFrame {
    /// Type byte and fixed header, as on the wire.
    pub fn encode(&self) -> Vec<u8> {
        match *self {
            TcpFrame::Send { len } => wire::encode_send(len).to_vec(),
            TcpFrame::ReadReq { id, addr, len, rkey } => wire::encode_read_req(id, addr, len, rkey).to_vec(),
            TcpFrame::ReadResp { id, status, len } => wire::encode_read_resp(id, status, len).to_vec(),
            TcpFrame::Push { rkey, addr, len } => wire::encode_push(rkey, addr, len).to_vec(),
            TcpFrame::Revoke { rkey } => wire::encode_revoke(rkey).to_vec(),
            TcpFrame::Window { rkey, len } => wire::encode_window(rkey, len).to_vec(),
        }
    }

    /// How many header bytes follow type byte `ty`; `None` for an unknown type.
    pub fn header_len(ty: u8) -> Option<usize> {
        wire::header_len(ty)
    }

    /// Parses the fixed header of type `ty` from `body`.
    pub fn decode(ty: u8, body: &[u8]) -> Option<TcpFrame> {
        Some(match wire::decode_header(ty, body)? {
            wire::Header::Send { len } => TcpFrame::Send { len },
            wire::Header::ReadReq { id, addr, len, rkey } => TcpFrame::ReadReq { id, addr, len, rkey },
            wire::Header::ReadResp { id, status, len } => TcpFrame::ReadResp { id, status, len },
            wire::Header::Push { rkey, addr, len } => TcpFrame::Push { rkey, addr, len },
            wire::Header::Revoke { rkey } => TcpFrame::Revoke { rkey },
            wire::Header::Window { rkey, len } => TcpFrame::Window { rkey, len },
        })
    }
}

thread_local! {
    /// One runtime per thread for every run (building one per input would dominate a fuzz run).
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("current-thread runtime");
}

/// A tcp endpoint whose reader is fed from memory: receives posted, one region registered, some
/// READs of ours pending, as when a real connection's reader task runs.
#[derive(Debug)]
pub struct TcpReaderHarness {
    soft: Arc<Soft>,
    recv_size: u32,
    region: Option<RegionDesc>,
    /// (wire id, wr_id, length) of each READ of ours.
    reads: Vec<(u64, u64, u64)>,
    /// Pushes the peer may make (window set with [`TcpReaderHarness::with_push`]).
    push: Arc<Push>,
}

/// What a run of the reader left behind.
#[derive(Debug, Clone, Default)]
pub struct TcpReaderRun {
    /// Why the reader stopped, when the peer broke the framing (`None`: the stream ended).
    pub malformed: Option<String>,
    /// Length of each receive completion, in order.
    pub recvs: Vec<usize>,
    /// Each READ completion of ours: `(wr_id, Ok(filled length) or Err(error))`.
    pub reads: Vec<(u64, Result<usize, String>)>,
    /// Each READ answer queued for the writer: `(id, Ok(length served) or Err(refusal status))`.
    pub responses: Vec<(u64, Result<usize, u8>)>,
    /// The endpoint's counters at the end.
    pub counters: TransportCounters,
    /// Pushed regions handed back to the peer: `(key, length)` of each WINDOW frame queued.
    pub window_returned: Vec<(u32, u64)>,
    /// Pushed bytes held when the stream ended (before the endpoint failed).
    pub push_held: u64,
    /// Pushed regions held when the stream ended.
    pub push_regions_held: usize,
    /// Pushed bytes held once the endpoint failed (must be 0).
    pub push_held_after_death: u64,
}

impl TcpReaderHarness {
    /// `recv_depth` receives of `recv_size` bytes, `region` registered (if not empty), and one
    /// pending READ of ours per entry of `read_lens` (wr_id = 1000 + index). The receive buffers
    /// and READ destinations are allocated: the caller keeps the sizes small.
    pub fn new(recv_depth: u32, recv_size: u32, region: &[u8], read_lens: &[u64]) -> TcpReaderHarness {
        let params = ConnParams { recv_depth, recv_size, ..ConnParams::default() };
        let soft = Soft::new(&params);
        let region = (!region.is_empty()).then(|| soft.register(Bytes::copy_from_slice(region)));
        let mut reads = Vec::new();
        for (i, &len) in read_lens.iter().enumerate() {
            let wr_id = 1000 + i as u64;
            let remote = RegionDesc { addr: 0x1000 * (i as u64 + 1), len, rkey: i as u32 + 1 };
            if let Ok(id) = soft.begin_read(wr_id, remote, vec![0; len as usize].into()) {
                reads.push((id, wr_id, len));
            }
        }
        TcpReaderHarness { soft, recv_size, region, reads, push: Arc::new(Push::new(0, 0, None)) }
    }

    /// Lets the peer push up to `window` bytes to us, and has us push a region of `pushed` bytes
    /// under key 0 (if it fits the `granted` window the peer gave us), which it may hand back.
    pub fn with_push(mut self, window: u64, granted: u64, pushed: u64) -> TcpReaderHarness {
        self.push = Arc::new(Push::new(window, granted, None));
        self.push.start_push(&RegionDesc { addr: 0, len: pushed, rkey: 0 });
        self
    }

    /// The registered region, for READ requests that should be served.
    pub fn region(&self) -> Option<RegionDesc> {
        self.region
    }

    /// `(wire id, length)` of each pending READ of ours, for responses that should match.
    pub fn pending_reads(&self) -> Vec<(u64, u64)> {
        self.reads.iter().map(|&(id, _, len)| (id, len)).collect()
    }

    /// Runs the reader over `stream` until it ends or the framing breaks, fails the endpoint
    /// with that reason (as the tcp backend does), and collects every completion.
    pub fn run(self, stream: &[u8]) -> TcpReaderRun {
        let (out, mut rx) = super::outbox::Outbox::new(None);
        let mut reader = Reader::new(self.soft.clone(), out, self.recv_size, self.push.clone());
        // No writer to give the refusal time to leave: close at once.
        reader.close_grace = std::time::Duration::ZERO;
        let (death, responses) = RUNTIME.with(|rt| {
            rt.block_on(async move {
                // Plays the writer: takes each READ answer (releasing its permit).
                let writer = tokio::spawn(async move {
                    let mut answers = Vec::new();
                    let mut windows = Vec::new();
                    while let Some(o) = rx.recv().await {
                        match o {
                            Outgoing::ReadResp { id, result, .. } => {
                                answers.push((id, result.map(|b| b.len())))
                            }
                            Outgoing::Window { rkey, len } => windows.push((rkey, len)),
                            _ => {}
                        }
                    }
                    (answers, windows)
                });
                let mut r = stream;
                let death = reader.run(&mut r).await;
                drop(reader);
                (death, writer.await.unwrap_or_default())
            })
        });
        let (responses, window_returned) = responses;
        let (push_held, push_regions_held) = (self.push.held(), self.push.regions_held());
        self.soft.fail(death.clone());
        // What the tcp backend's death hook does.
        self.push.close();
        let mut run = TcpReaderRun {
            responses,
            window_returned,
            push_held,
            push_regions_held,
            push_held_after_death: self.push.held(),
            ..TcpReaderRun::default()
        };
        if let Death::Malformed(why) = death {
            run.malformed = Some(why);
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut done = Vec::new();
        while let Poll::Ready(Ok(())) = self.soft.poll_completions(&mut cx, &mut done, 64) {}
        for c in done {
            match c {
                Completion::Recv { buf } => run.recvs.push(buf.bytes().len()),
                Completion::Read { wr_id, result } => {
                    run.reads.push((wr_id, result.map(|v| v.len()).map_err(|e| e.to_string())))
                }
                _ => {}
            }
        }
        run.counters = self.soft.counters();
        run
    }
}

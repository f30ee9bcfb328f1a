//! The decoder targets: protocol header and bodies, the tcp wire format and reader, the rdma
//! hello. Whatever a decoder accepts must encode back to the same bytes.

use arbitrary::{Arbitrary, Unstructured};
use rpc_core::proto::{
    decode_desc, encode_desc, encode_request_body, split_metadata, Header, Hello, WireError, FLAG_ERROR,
    FLAG_METADATA, FLAG_RENDEZVOUS, HEADER_LEN, MAX_ERROR_MESSAGE, MAX_METADATA_LEN,
};
use rpc_core::Metadata;
use rpc_transport::fuzzing::{
    tcp_decode_hello, tcp_encode_hello, RdmaHello, TcpFrame, TcpReaderHarness, TCP_HELLO_FIXED, TCP_STATUS_OK,
};
use rpc_transport::MAX_PRIVATE_DATA;

use crate::input::Blob;

/// `proto_decode`: the frame header, request metadata, region descriptors, wire errors and the
/// protocol hello.
pub fn proto_decode(data: &[u8]) {
    if let Ok(h) = Header::decode(data) {
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        assert_eq!(head[..], data[..HEADER_LEN], "header does not re-encode to its bytes");
        let mut body = &data[HEADER_LEN..];
        assert_eq!(h.body_len as usize, body.len());
        if h.flags & FLAG_METADATA != 0 {
            let Ok(rest) = check_metadata_section(body) else { return };
            body = rest;
        }
        if h.flags & FLAG_RENDEZVOUS != 0 {
            check_desc(body);
        }
        if h.flags & FLAG_ERROR != 0 {
            check_wire_error(body);
        }
    }
    check_desc(data);
    check_wire_error(data);
    let _ = check_metadata_section(data);
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(hello.encode(), data, "hello does not re-encode to its bytes");
    }
}

/// A metadata section that splits off re-encodes to its bytes, and so does metadata that decodes.
/// Returns what follows the section.
fn check_metadata_section(body: &[u8]) -> Result<&[u8], ()> {
    let (meta, rest) = split_metadata(body).map_err(|_| ())?;
    assert!(!meta.is_empty() && meta.len() <= MAX_METADATA_LEN);
    let whole = encode_request_body(meta, bytes::Bytes::copy_from_slice(rest));
    assert_eq!(whole[..], body[..], "metadata section does not re-encode to its bytes");
    if let Ok(md) = Metadata::decode(meta) {
        assert_eq!(md.encode()[..], meta[..], "metadata does not re-encode to its bytes");
    }
    Ok(rest)
}

fn check_desc(body: &[u8]) {
    if let Ok(d) = decode_desc(body) {
        assert!(d.len > 0, "a descriptor of length 0 accepted");
        assert_eq!(encode_desc(&d)[..], body[..], "descriptor does not re-encode to its bytes");
    }
}

fn check_wire_error(body: &[u8]) {
    let e = WireError::decode(body);
    let back = WireError::decode(&e.encode());
    assert_eq!(back.code, e.code);
    assert!(back.message.len() <= MAX_ERROR_MESSAGE);
    assert!(e.message.starts_with(&back.message), "encoding cut the message other than at its end");
    if e.message.len() <= MAX_ERROR_MESSAGE {
        assert_eq!(back, e);
    }
}

/// `tcp_wire`: the tcp hello's fixed part and the frame headers.
pub fn tcp_wire(data: &[u8]) {
    if let Some(fixed) = data.get(..TCP_HELLO_FIXED).and_then(|f| <&[u8; TCP_HELLO_FIXED]>::try_from(f).ok())
    {
        if let Ok(h) = tcp_decode_hello(fixed) {
            assert!((1..=1 << 16).contains(&h.recv_depth), "{h:?}");
            assert!((1..=64 << 20).contains(&h.recv_size), "{h:?}");
            assert!(h.private_len <= MAX_PRIVATE_DATA, "{h:?}");
            let again = tcp_encode_hello(h.recv_depth, h.recv_size, h.push_window, &vec![0; h.private_len]);
            assert_eq!(again[..TCP_HELLO_FIXED], fixed[..], "tcp hello does not re-encode to its bytes");
        }
    }
    if let Some((&ty, body)) = data.split_first() {
        let decoded = TcpFrame::decode(ty, body);
        match TcpFrame::header_len(ty) {
            Some(n) => assert_eq!(decoded.is_some(), body.len() >= n, "type {ty}, {} bytes", body.len()),
            None => assert!(decoded.is_none(), "unknown type {ty} decoded"),
        }
        if let Some(f) = decoded {
            let enc = f.encode();
            assert_eq!(enc[..], data[..enc.len()], "tcp frame header does not re-encode to its bytes");
        }
    }
}

/// `rdma_hello`: the in-band hello of the rdma backend.
pub fn rdma_hello(data: &[u8]) {
    if let Ok(h) = RdmaHello::decode(data) {
        assert!(h.recv_depth > 0 && h.recv_size > 0, "{h:?}");
        assert!(h.private_data.len() <= MAX_PRIVATE_DATA);
        assert_eq!(h.encode(), data, "rdma hello does not re-encode to its bytes");
    }
}

/// The tcp reader's endpoint.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct ReaderSetup {
    /// Receives posted (1 + this % 4).
    pub recv_depth: u8,
    /// Receive size (1 + this % 4096).
    pub recv_size: u16,
    /// Length of the registered region (none when 0).
    pub region_len: u8,
    /// Our pending READs (1 + each % 4096 bytes).
    pub reads: [Option<u16>; 3],
    /// The push window we granted the peer (bytes).
    pub push_window: u16,
    /// Bytes we pushed to the peer (of a 64 KiB window it granted), which it may hand back.
    pub pushed: u16,
}

/// A piece of the byte stream the reader is fed.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// These bytes.
    Raw(Blob),
    /// A SEND of this many bytes.
    Send(u16),
    /// A READ request of our registered region (or of a made-up one when there is none).
    ReadReq {
        /// Request id.
        id: u8,
        /// Offset from the region's start.
        offset: i16,
        /// Length.
        len: u16,
        /// XORed into the key (0: the right key).
        key_flip: u32,
    },
    /// A response to one of our pending READs (picked), or to an unknown id.
    ReadResp {
        /// Which pending READ (an unknown id when none is pending or `pick >= 128`).
        pick: u8,
        /// Status byte.
        status: u8,
        /// Length announced: the READ's own when `None`.
        len: Option<u16>,
    },
    /// A PUSH of `len` bytes under key `key` (to fit the window or not).
    Push {
        /// The key (few distinct ones, so that keys repeat).
        key: u8,
        /// Payload length.
        len: u16,
    },
    /// A REVOKE of key `key`.
    Revoke(u8),
    /// WINDOW handing back a region of ours: key 0 is the one we pushed (`pushed` bytes).
    Window {
        /// The key (`% 2`).
        key: u8,
        /// The length: the pushed region's own when `None`.
        len: Option<u16>,
    },
}

/// `tcp_reader`: the reader task over an in-memory stream of frames.
pub fn tcp_reader(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(setup) = ReaderSetup::arbitrary(&mut u) else { return };
    let chunks = std::iter::from_fn(|| if u.is_empty() { None } else { Chunk::arbitrary(&mut u).ok() });
    tcp_reader_steps(&setup, chunks);
}

/// Feeds `chunks` to a reader set up as `setup` says and checks what it did.
pub fn tcp_reader_steps(setup: &ReaderSetup, chunks: impl IntoIterator<Item = Chunk>) {
    let recv_size = 1 + u32::from(setup.recv_size % 4096);
    let region: Vec<u8> = (0..setup.region_len).collect();
    let read_lens: Vec<u64> = setup.reads.iter().flatten().map(|&l| 1 + u64::from(l % 4096)).collect();
    let window = u64::from(setup.push_window);
    let h = TcpReaderHarness::new(1 + u32::from(setup.recv_depth % 4), recv_size, &region, &read_lens)
        .with_push(window, 1 << 16, u64::from(setup.pushed));
    let mut pushed_to_us = 0u64;
    let mut raw = false;
    let desc = h.region();
    let pending = h.pending_reads();
    assert_eq!(pending.len(), read_lens.len());
    let mut stream = Vec::new();
    for chunk in chunks {
        match chunk {
            Chunk::Raw(b) => {
                // Raw bytes may hold frames of any kind, PUSH included: pushes are then uncounted.
                raw = true;
                stream.extend_from_slice(&b.0)
            }
            Chunk::Send(len) => {
                stream.extend(TcpFrame::Send { len: u32::from(len) }.encode());
                stream.extend((0..len).map(|i| i as u8));
            }
            Chunk::ReadReq { id, offset, len, key_flip } => {
                let (addr, rkey) = desc.map_or((0, 0), |d| (d.addr, d.rkey));
                let addr = addr.wrapping_add_signed(i64::from(offset));
                let f =
                    TcpFrame::ReadReq { id: u64::from(id), addr, len: u64::from(len), rkey: rkey ^ key_flip };
                stream.extend(f.encode());
            }
            Chunk::ReadResp { pick, status, len } => {
                let (id, want) = match pending.get(usize::from(pick) % pending.len().max(1)) {
                    Some(&p) if pick < 128 => p,
                    _ => (u64::from(pick) + 100, 0),
                };
                let len = len.map_or(want, u64::from);
                stream.extend(TcpFrame::ReadResp { id, status, len }.encode());
                if status == TCP_STATUS_OK {
                    stream.extend((0..len).map(|i| i as u8));
                }
            }
            Chunk::Push { key, len } => {
                let f = TcpFrame::Push { rkey: u32::from(key % 8), addr: 0x1000, len: u64::from(len) };
                stream.extend(f.encode());
                stream.extend((0..len).map(|i| i as u8));
                pushed_to_us += u64::from(len);
            }
            Chunk::Revoke(key) => stream.extend(TcpFrame::Revoke { rkey: u32::from(key % 8) }.encode()),
            Chunk::Window { key, len } => {
                let len = len.map_or(u64::from(setup.pushed), u64::from);
                stream.extend(TcpFrame::Window { rkey: u32::from(key % 2), len }.encode())
            }
        }
    }
    let run = h.run(&stream);

    assert!(run.push_held <= window, "{} pushed bytes held, window {window}", run.push_held);
    assert_eq!(run.push_held_after_death, 0, "pushed bytes outlived the connection");
    let returned: u64 = run.window_returned.iter().map(|&(_, len)| len).sum();
    assert!(
        raw || returned + run.push_held <= pushed_to_us,
        "handed back {returned} and hold {} of {pushed_to_us} pushed",
        run.push_held
    );

    let mut ids: Vec<u64> = run.reads.iter().map(|r| r.0).collect();
    ids.sort_unstable();
    let expected: Vec<u64> = (0..read_lens.len() as u64).map(|i| 1000 + i).collect();
    assert_eq!(ids, expected, "each of our READs completes exactly once");
    for (wr_id, result) in &run.reads {
        if let Ok(n) = result {
            assert_eq!(
                *n as u64,
                read_lens[(wr_id - 1000) as usize],
                "READ {wr_id} filled with the wrong length"
            );
        }
    }
    assert!(run.recvs.iter().all(|&n| n <= recv_size as usize), "a receive longer than recv_size");
    assert_eq!(run.recvs.len() as u64, run.counters.recvs);
    let served = run.responses.iter().filter(|r| r.1.is_ok()).count() as u64;
    assert_eq!(served, run.counters.reads_served, "{run:?}");
    assert_eq!(run.responses.len() as u64 - served, run.counters.reads_refused, "{run:?}");
    for (_, r) in &run.responses {
        if let Ok(n) = r {
            assert!(*n <= region.len(), "served {n} bytes of a region of {}", region.len());
        }
    }
}

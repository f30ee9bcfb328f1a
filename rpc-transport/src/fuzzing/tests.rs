//! The fuzzing entry points do what the fuzz targets rely on, and every input a fuzz target found
//! to break something stays here as a regression test.

use super::*;

fn send(payload: &[u8]) -> Vec<u8> {
    let mut f = TcpFrame::Send { len: payload.len() as u32 }.encode();
    f.extend_from_slice(payload);
    f
}

#[test]
fn reader_harness_delivers_sends_serves_reads_and_fills_ours() {
    let h = TcpReaderHarness::new(2, 16, b"0123456789", &[3, 5]);
    let region = h.region().expect("registered");
    let reads = h.pending_reads();
    assert_eq!(reads.iter().map(|r| r.1).collect::<Vec<_>>(), [3, 5]);
    let mut stream = send(b"hello");
    stream.extend(TcpFrame::ReadReq { id: 7, addr: region.addr + 2, len: 4, rkey: region.rkey }.encode());
    stream.extend(TcpFrame::ReadResp { id: reads[0].0, status: TCP_STATUS_OK, len: 3 }.encode());
    stream.extend_from_slice(b"abc");
    // A READ with a wrong key is refused and, as on verbs, closes the connection: what follows
    // is never read, and our second READ is flushed.
    stream.extend(TcpFrame::ReadReq { id: 8, addr: region.addr, len: 4, rkey: region.rkey ^ 1 }.encode());
    stream.extend(send(b"never read"));
    let run = h.run(&stream);
    assert_eq!(run.malformed, None, "closed, not malformed");
    assert_eq!(run.recvs, [5]);
    assert_eq!(run.responses, [(7, Ok(4)), (8, Err(1))], "served, then refused for the wrong key");
    assert_eq!(run.reads.len(), 2, "each READ of ours completes once: {:?}", run.reads);
    assert_eq!(run.reads[0], (1000, Ok(3)));
    assert!(run.reads[1].0 == 1001 && run.reads[1].1.is_err(), "flushed at the close: {:?}", run.reads[1]);
    assert_eq!((run.counters.reads_served, run.counters.reads_refused), (1, 1));
}

#[test]
fn reader_harness_reports_framing_violations() {
    let run = TcpReaderHarness::new(1, 8, b"", &[]).run(&send(b"too long for 8"));
    assert!(run.malformed.is_some_and(|why| why.contains("recv_size")));
}

#[test]
fn reader_harness_survives_a_read_request_flood() {
    // More requests than the reader lets wait for the writer: the harness's writer drains them.
    let h = TcpReaderHarness::new(1, 8, b"abcd", &[]);
    let region = h.region().expect("registered");
    let stream: Vec<u8> = (0..600)
        .flat_map(|id| TcpFrame::ReadReq { id, addr: region.addr, len: 1, rkey: region.rkey }.encode())
        .collect();
    let run = h.run(&stream);
    assert_eq!(run.responses.len(), 600);
    assert!(run.responses.iter().all(|r| r.1 == Ok(1)));
}

#[test]
fn reader_harness_keeps_pushes_within_the_window_and_hands_window_back() {
    let push = |rkey: u32, len: u64| {
        let mut f = TcpFrame::Push { rkey, addr: 0x1000, len }.encode();
        f.extend((0..len).map(|i| i as u8));
        f
    };
    let mut stream = push(1, 30);
    stream.extend(push(2, 20));
    stream.extend(TcpFrame::Revoke { rkey: 1 }.encode());
    stream.extend(TcpFrame::Window { rkey: 0, len: 8 }.encode()); // the region we pushed
    let run = TcpReaderHarness::new(1, 8, b"", &[]).with_push(50, 100, 8).run(&stream);
    assert_eq!(run.malformed, None);
    assert_eq!(run.window_returned, [(1, 30)], "the revoked push, handed back");
    assert_eq!((run.push_held, run.push_regions_held, run.push_held_after_death), (20, 1, 0));

    let over = TcpReaderHarness::new(1, 8, b"", &[]).with_push(50, 100, 8).run(&push(3, 51));
    assert!(over.malformed.is_some_and(|why| why.contains("window")));
    for (rkey, len) in [(0, 9), (1, 8)] {
        let wrong = TcpFrame::Window { rkey, len }.encode();
        let run = TcpReaderHarness::new(1, 8, b"", &[]).with_push(50, 100, 8).run(&wrong);
        assert!(run.malformed.is_some_and(|why| why.contains("handed back")), "{rkey} {len}");
    }
}

#[test]
fn wire_wrappers_round_trip() {
    let hello = tcp_encode_hello(8, 4096, 77, b"pd");
    let fixed: [u8; TCP_HELLO_FIXED] = hello[..TCP_HELLO_FIXED].try_into().expect("fixed part");
    assert_eq!(
        tcp_decode_hello(&fixed),
        Ok(TcpHello { recv_depth: 8, recv_size: 4096, push_window: 77, private_len: 2 })
    );
    for f in [
        TcpFrame::Send { len: 9 },
        TcpFrame::ReadReq { id: 1, addr: 2, len: 3, rkey: 4 },
        TcpFrame::ReadResp { id: 5, status: 6, len: 7 },
        TcpFrame::Push { rkey: 8, addr: 9, len: 10 },
        TcpFrame::Revoke { rkey: 11 },
        TcpFrame::Window { rkey: 12, len: 13 },
    ] {
        let enc = f.encode();
        assert_eq!(TcpFrame::header_len(enc[0]), Some(enc.len() - 1));
        assert_eq!(TcpFrame::decode(enc[0], &enc[1..]), Some(f));
    }
    let rdma = RdmaHello {
        recv_depth: 64,
        recv_size: 8320,
        max_dest_rd_atomic: 16,
        max_rd_atomic: 8,
        private_data: b"hi".to_vec(),
    };
    let enc = rdma.encode();
    assert!(enc.len() <= RDMA_HELLO_MAX);
    assert_eq!(RdmaHello::decode(&enc), Ok(rdma));
    assert!(RdmaHello::decode(&enc[..enc.len() - 1]).is_err());
}

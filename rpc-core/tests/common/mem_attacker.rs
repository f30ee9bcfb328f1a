//! A raw peer over the `mem` transport: a bare `rpc_transport::Connection` driven by hand,
//! speaking the protocol with the public `rpc_core::proto` types. It can do what a real client
//! never does (advertise and cancel, never READ nor report done, send beyond its credits, stop
//! polling its completions), while the fault plan of the server's name injects delays, kills or
//! a black hole.
//!
//! READs are served by the transport itself from the regions registered here, so a READ of
//! ours stays in flight only while the fault plan delays or swallows completions.

use std::time::Duration;

use bytes::Bytes;
use futures::future::poll_fn;
use rpc_core::proto::{encode_desc, Header, Hello, Kind, ProtoConfig, FLAG_RENDEZVOUS, HEADER_LEN};
use rpc_core::transport::{mem::MemFabric, Completion, ConnParams, Connection, RegionDesc, TransportError};
use rpc_core::MethodId;
use tokio::time::Instant;

/// A frame the server sent.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its header.
    pub header: Header,
    /// Its body.
    pub body: Bytes,
}

/// A raw mem peer.
#[derive(Debug)]
pub struct MemAttacker {
    conn: Box<dyn Connection>,
    next_wr: u64,
    next_call: u64,
    /// Protocol frames posted.
    pub frames_sent: u64,
    /// Frames received from the server, in order.
    pub received: Vec<Received>,
    /// Credits the server returned.
    pub credits_returned: u64,
    /// Why the connection ended, once it has.
    pub closed: Option<String>,
}

impl MemAttacker {
    /// Connects to `mem://name` announcing `recv_depth` receives of a default client's size.
    // Field by field: the transport's `ConnParams` gains fields (with defaults) over time.
    #[allow(clippy::field_reassign_with_default)]
    pub async fn connect(name: &str, recv_depth: u32) -> Result<MemAttacker, TransportError> {
        let proto = ProtoConfig::default();
        let hello: Hello = proto.hello();
        let mut params = ConnParams::default();
        params.recv_depth = recv_depth;
        params.recv_size = proto.recv_size();
        params.private_data = Bytes::from(hello.encode());
        let conn = MemFabric::global().connect(name, params).await?;
        Ok(MemAttacker {
            conn,
            next_wr: 1,
            next_call: 1,
            frames_sent: 0,
            received: Vec::new(),
            credits_returned: 0,
            closed: None,
        })
    }

    /// A fresh call id.
    pub fn call_id(&mut self) -> u64 {
        let id = self.next_call;
        self.next_call += 1;
        id
    }

    /// The credits we started with: the receives the server posted, less its spare.
    pub fn initial_credits(&self) -> u32 {
        self.conn.info().peer_recv_depth - rpc_core::proto::SPARE_RECEIVES
    }

    /// Credits left by the protocol's count (negative once we send beyond them).
    pub fn credits_left(&self) -> i64 {
        i64::from(self.initial_credits()) + self.credits_returned as i64 - self.frames_sent as i64
    }

    /// Posts one protocol frame.
    pub fn send(&mut self, mut header: Header, body: &[u8]) -> Result<(), TransportError> {
        header.body_len = body.len() as u32;
        let mut h = [0u8; HEADER_LEN];
        header.encode(&mut h);
        let mut frame = h.to_vec();
        frame.extend_from_slice(body);
        let wr = self.next_wr;
        self.next_wr += 1;
        self.conn.post_send(wr, Bytes::from(frame).into())?;
        self.frames_sent += 1;
        Ok(())
    }

    /// Posts an eager request.
    pub fn request(&mut self, call_id: u64, method: MethodId, args: &[u8]) -> Result<(), TransportError> {
        self.send(super::attacker::request_header(call_id, method, 0, 0), args)
    }

    /// Registers `data` and posts a request advertising it.
    pub fn request_rendezvous(
        &mut self,
        call_id: u64,
        method: MethodId,
        data: Bytes,
    ) -> Result<RegionDesc, TransportError> {
        let desc = self.conn.register(data)?;
        self.send(super::attacker::request_header(call_id, method, FLAG_RENDEZVOUS, 0), &encode_desc(&desc))?;
        Ok(desc)
    }

    /// Posts a cancel.
    pub fn cancel(&mut self, call_id: u64) -> Result<(), TransportError> {
        let mut h = Header::new(Kind::Cancel);
        h.call_id = call_id;
        self.send(h, &[])
    }

    /// Takes completions for `within`: records the server's frames and the end of the
    /// connection. With `repost`, receive buffers are posted again (a polite peer); without,
    /// they are kept, so the server runs out of the credits we granted.
    pub async fn pump(&mut self, within: Duration, repost: bool) {
        let until = Instant::now() + within;
        while self.closed.is_none() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut out = Vec::new();
            let polled =
                tokio::time::timeout(left, poll_fn(|cx| self.conn.poll_completions(cx, &mut out, 64))).await;
            for c in out {
                if let Completion::Recv { buf } = c {
                    if let Ok(header) = Header::decode(buf.bytes()) {
                        self.credits_returned += u64::from(header.credits);
                        let body = Bytes::copy_from_slice(&buf.bytes()[HEADER_LEN..]);
                        self.received.push(Received { header, body });
                    }
                    if repost {
                        let _ = self.conn.post_recv(buf);
                    }
                }
            }
            match polled {
                Err(_) => return,
                Ok(Err(e)) => self.closed = Some(e.to_string()),
                Ok(Ok(())) => {}
            }
        }
    }

    /// The responses received, by call id.
    pub fn response(&self, call_id: u64) -> Option<&Received> {
        self.received.iter().find(|r| r.header.kind == Kind::Response && r.header.call_id == call_id)
    }

    /// Closes the connection.
    pub fn close(&mut self) {
        self.conn.close();
    }
}

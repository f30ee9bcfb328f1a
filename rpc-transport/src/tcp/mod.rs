//! TCP backend, for hosts without RDMA NICs.
//!
//! After a hello exchange (magic, version, receive depth and size, private data; see the wire
//! format in the `wire` module), a SEND is a length-prefixed frame that the peer's reader task
//! reads straight into its next posted receive, and a READ is a request frame that the peer's
//! reader task serves from its registered regions after checking key, bounds and registration.
//! A refused READ is answered with an error code, never with memory, and then closes the
//! connection on both ends, as verbs does: the reader's READ completes with its typed error
//! ([`crate::ReadError::InvalidKey`], [`crate::ReadError::OutOfBounds`], ...), then both ends fail
//! with `Disconnected`. Each connection has a reader task and a writer task; the writer writes
//! every queued frame and then flushes once. A SEND posted while the writer is idle is written by
//! the caller at once (see `outbox.rs`): no task is woken for it.
//!
//! Setup (see `handshake.rs`): the listener reads and validates the client's hello before it
//! allocates anything for the connection, handshakes are bounded in number
//! ([`crate::ConnParams::max_pending_handshakes`]) and time
//! ([`crate::ConnParams::handshake_timeout`]), and every stream gets `SO_KEEPALIVE`
//! ([`crate::TcpSettings::keepalive`]).
//!
//! Push (see `push.rs`): a region registered on a connection whose peer announced a push
//! window ([`crate::TcpSettings::push_window`]) is sent to the peer at once if its whole
//! length fits what is left of that window, ahead of the frame that advertises it; the peer's
//! READ of exactly that region then completes from those bytes, with no round trip. Keys and
//! bounds keep their meaning: any other READ goes to the owner, and a revoked region's pushed
//! bytes are dropped by the peer (REVOKE frame). The peer hands each region back (WINDOW frame)
//! as it consumes or drops its bytes.
//!
//! Any framing violation by the peer (unknown frame type, oversized SEND, unsolicited or
//! mis-sized READ response, a PUSH beyond the window we granted) fails the connection with
//! [`TransportError::Malformed`]: pending operations are flushed and the socket is closed. A
//! stream that ends inside a frame is the peer closing mid-write (a side that closes stops its
//! writer where it is): [`TransportError::Disconnected`], as any other close.

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzzing;
mod halves;
mod handshake;
mod listener;
mod outbox;
mod push;
mod read_after_send;
mod reader;
mod wire;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::task::AbortHandle;

use crate::soft::{validate_params, Death, Soft, MAX_READ_SIZE};
use crate::{
    Buf, Completion, ConnInfo, ConnParams, Connection, MemPool, RecvBuffer, RegionDesc, SendBuf,
    TransportCounters, TransportError, WrId,
};
use handshake::PeerHello;
use outbox::{Direct, Outbox};
use push::{Lookup, Push, PushPool};
use read_after_send::{stamp, LookPolicy, LookingReader, ReadAfterSend};
use writer::Outgoing;

pub use listener::listen;

/// READs a tcp connection may have in flight: requests are pipelined on the stream.
const MAX_READS_IN_FLIGHT: u32 = 64;
/// Socket buffering of the reader task.
const IO_BUFFER: usize = 64 * 1024;

/// Connects to a tcp listener at `addr` and performs the setup handshake. The TCP connect and
/// the hello exchange are each bounded by [`ConnParams::handshake_timeout`] (a listener with
/// every handshake slot taken leaves us in its backlog, unanswered, until then).
pub async fn connect(addr: SocketAddr, params: ConnParams) -> Result<Box<dyn Connection>, TransportError> {
    Ok(Box::new(connect_stream(addr, params).await?))
}

/// [`connect`], unboxed.
async fn connect_stream(addr: SocketAddr, params: ConnParams) -> Result<TcpConnection, TransportError> {
    validate_params(&params)?;
    let connect_error = |source| TransportError::Connect { addr: addr.to_string(), source };
    let mut stream = tokio::time::timeout(params.handshake_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| connect_error(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
        .map_err(connect_error)?;
    configure(&stream, &params)?;
    let (soft, hello) = handshake::client(&mut stream, &params).await?;
    TcpConnection::start(stream, soft, &params, hello, addr, None)
}

/// The accepting side of the handshake on a fresh stream (see `handshake.rs`): the peer's hello
/// is read and checked before anything is allocated for it.
async fn accept_stream(
    mut stream: TcpStream,
    params: &ConnParams,
    peer: SocketAddr,
    push_pool: Arc<PushPool>,
) -> Result<TcpConnection, TransportError> {
    configure(&stream, params)?;
    let (soft, hello) = handshake::server(&mut stream, params).await?;
    TcpConnection::start(stream, soft, params, hello, peer, Some(push_pool))
}

/// Socket options of every connection: no Nagle delay, and `SO_KEEPALIVE` as configured.
fn configure(stream: &TcpStream, params: &ConnParams) -> Result<(), TransportError> {
    stream.set_nodelay(true)?;
    if let Some(idle) = params.tcp.keepalive {
        let sock = socket2::SockRef::from(stream);
        sock.set_tcp_keepalive(&keepalive(idle))?;
        // Keepalive probes are not sent while our data waits for an ACK; the user timeout gives
        // that case (a peer gone while we were sending) the same bound instead of the kernel's
        // ~15 min of retransmissions. A live peer ACKs (even with a zero window), so a slow
        // reader is not cut off.
        sock.set_tcp_user_timeout(Some(dead_after(idle)))?;
    }
    #[cfg(test)]
    tests::record_socket_options(stream);
    Ok(())
}

/// Probes sent by a silent connection before it is declared dead.
const KEEPALIVE_PROBES: u32 = 3;

/// The keepalive of [`crate::TcpSettings::keepalive`]: first probe after `idle`, then one every
/// `max(idle / 5, 1 s)`, [`KEEPALIVE_PROBES`] of them.
fn keepalive(idle: Duration) -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(keepalive_interval(idle))
        .with_retries(KEEPALIVE_PROBES)
}

/// Whole seconds, as the kernel counts them.
fn keepalive_interval(idle: Duration) -> Duration {
    Duration::from_secs((idle / 5).as_secs().max(1))
}

/// How long a peer may stay silent (no ACK of our data, no answer to probes) before the
/// connection fails: `idle + probes * interval` (16 s for the default 10 s).
fn dead_after(idle: Duration) -> Duration {
    Duration::from_secs(idle.as_secs()) + keepalive_interval(idle) * KEEPALIVE_PROBES
}

/// One end of a tcp connection.
#[derive(Debug)]
struct TcpConnection {
    soft: Arc<Soft>,
    push: Arc<Push>,
    out: Outbox,
    /// A SEND was written directly since completions were last polled: we are in a burst, whose
    /// next SENDs go to the writer (one vectored write for all) rather than one system call each.
    direct_unpolled: bool,
    /// The reader's look at the socket after a SEND written here (`read_after_send.rs`), and
    /// when to ask for one.
    looks: Arc<ReadAfterSend>,
    look_policy: LookPolicy,
    info: ConnInfo,
}

impl TcpConnection {
    /// Spawns the reader and writer tasks. They stop as soon as the endpoint dies, whoever
    /// kills it (a task, `close`, or drop); the socket is then closed.
    fn start(
        stream: TcpStream,
        soft: Arc<Soft>,
        ours: &ConnParams,
        hello: PeerHello,
        peer: SocketAddr,
        push_pool: Option<Arc<PushPool>>,
    ) -> Result<Self, TransportError> {
        // Each half registered for its own readiness (see `halves.rs`).
        let (read_half, write_half) = halves::split(stream)?;
        let push = Arc::new(Push::new(ours.tcp.push_window, hello.push_window, push_pool));
        let (out, out_rx) = Outbox::new(Some(write_half));

        // The tasks stop when the endpoint dies, whoever kills it: the death hook aborts them
        // (a task ends at its next poll, as it would if it watched a stop signal, without the
        // cost of polling one on every wake-up). The writer's end shuts the socket down for
        // writing when it is dropped, so the peer sees EOF either way.
        let mut reader = reader::Reader::new(soft.clone(), out.clone(), ours.recv_size, push.clone());
        let reader_soft = soft.clone();
        let looks = Arc::new(ReadAfterSend::default());
        let read_half = LookingReader::new(read_half, looks.clone(), ours.tcp.busy_poll);
        let reading = tokio::spawn(async move {
            let mut r = BufReader::with_capacity(IO_BUFFER, read_half);
            let death = reader.run(&mut r).await;
            reader_soft.fail(death);
        });
        let (writer_soft, mut out_rx) = (soft.clone(), out_rx);
        let writing = tokio::spawn(async move {
            let mut w = out_rx.writer();
            let death = writer::run(&mut w, &mut out_rx, &writer_soft).await;
            writer_soft.fail(death);
        });
        let tasks = [reading.abort_handle(), writing.abort_handle()];
        let stop = {
            let push = push.clone();
            move || {
                push.close();
                tasks.iter().for_each(AbortHandle::abort);
            }
        };
        soft.set_on_death({
            let stop = stop.clone();
            move |_| stop()
        });
        // A task that killed the endpoint before the hook was set has stopped; the other must.
        if soft.is_dead() {
            stop();
        }

        let info = ConnInfo {
            peer_private_data: hello.private_data,
            peer_recv_size: hello.recv_size,
            peer_recv_depth: hello.recv_depth,
            max_read_size: MAX_READ_SIZE,
            max_reads_in_flight: MAX_READS_IN_FLIGHT,
            peer: peer.to_string(),
            backend: "tcp",
            idle_poll_is_costly: false,
            // Every SEND is written into the socket (or queued for the writer, which does so).
            copied_sends: u32::MAX,
        };
        let look_policy = LookPolicy::new(ours.tcp.read_after_send);
        Ok(TcpConnection { soft, push, out, direct_unpolled: false, looks, look_policy, info })
    }

    /// Hands a frame to the writer. If the writer is gone the endpoint is dead already and the
    /// operation was flushed.
    fn queue(&self, frame: Outgoing) {
        let _ = self.out.queue(frame);
    }
}

impl TcpConnection {
    /// `post_send`; with `done`, a SEND written to the socket here is reported there (see
    /// `Connection::post_send_batch_reporting`).
    fn send(
        &mut self,
        wr_id: WrId,
        msg: SendBuf,
        done: Option<&mut Vec<(WrId, Result<(), TransportError>)>>,
    ) -> Result<(), TransportError> {
        check_size(&self.info, &msg)?;
        if self.direct_unpolled {
            let op = self.soft.begin_send(wr_id)?;
            self.queue(Outgoing::Send { op, msg });
            return Ok(());
        }
        // The writer idle: written here, one system call, no task woken, and recorded as pending
        // only if the writer takes it after all.
        self.soft.begin_direct_sends(1)?;
        let soft = &self.soft;
        // Timed: a write the peer answered within is followed by a look (`read_after_send.rs`).
        let began = stamp();
        if let Direct::Written = self.out.send_now(msg, || soft.record_direct_send(wr_id)) {
            self.direct_unpolled = true;
            self.look_policy.after_send(stamp().wrapping_sub(began), &self.looks);
            match done {
                Some(done) => done.push((wr_id, Ok(()))),
                None => soft.complete_direct_send(wr_id),
            }
        }
        Ok(())
    }
}

/// `Err` if `msg` is too large for the peer's receive buffers.
fn check_size(info: &ConnInfo, msg: &SendBuf) -> Result<(), TransportError> {
    let max = info.peer_recv_size as usize;
    if msg.len() > max {
        return Err(TransportError::MessageTooLarge { len: msg.len(), max });
    }
    Ok(())
}

impl Connection for TcpConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn post_recv(&mut self, buf: RecvBuffer) -> Result<(), TransportError> {
        self.soft.post_recv(buf)
    }

    fn post_recv_batch(&mut self, bufs: &mut Vec<RecvBuffer>) -> Result<(), TransportError> {
        self.soft.post_recv_batch(bufs)
    }

    fn post_send(&mut self, wr_id: WrId, msg: SendBuf) -> Result<(), TransportError> {
        self.send(wr_id, msg, None)
    }

    fn post_send_batch_reporting(
        &mut self,
        sends: &mut Vec<(WrId, SendBuf)>,
        done: &mut Vec<(WrId, Result<(), TransportError>)>,
    ) -> Result<(), TransportError> {
        if sends.len() < 2 || self.direct_unpolled {
            return crate::take_each(sends, |(wr_id, msg)| self.send(wr_id, msg, Some(&mut *done)));
        }
        // The whole batch in one vectored system call if the writer is idle, no task woken (one
        // by one, the first written here and the rest by the writer, cost two system calls and
        // woke the peer for the first frame alone); else, or if too large, all to the writer.
        // Those before a SEND that cannot go (too large for the peer, or the endpoint died)
        // still go; the error is returned after. The batch is written from where it lies (not
        // moved to a second list first: two moves of a 96-byte SEND each, about 30 instructions
        // a SEND).
        let TcpConnection { soft, out, direct_unpolled, info, .. } = self;
        // The SENDs' sizes checked and added up in one pass.
        let (max, mut payload, mut checked) = (info.peer_recv_size as usize, 0, Ok(()));
        for (i, (_, msg)) in sends.iter().enumerate() {
            let len = msg.len();
            if len > max {
                checked = Err((i, TransportError::MessageTooLarge { len, max }));
                break;
            }
            payload += len;
        }
        let checked = checked.map_err(|(i, err)| {
            sends.truncate(i);
            err
        });
        if !sends.is_empty() {
            if let Err(dead) = soft.begin_direct_sends(sends.len() as u64) {
                sends.clear();
                return Err(dead);
            }
        }
        // The SENDs the writer takes leave `sends`; those written stay, to be reported.
        out.send_batch_now(sends, payload, |&wr_id| soft.record_direct_send(wr_id));
        if !sends.is_empty() {
            *direct_unpolled = true;
        }
        done.extend(sends.drain(..).map(|(wr_id, _msg)| (wr_id, Ok(()))));
        checked
    }

    fn pool(&self) -> &MemPool {
        self.soft.pool()
    }

    fn register(&mut self, data: Bytes) -> Result<RegionDesc, TransportError> {
        let desc = self.soft.register(data.clone());
        if self.push.start_push(&desc) {
            self.soft.count(|c| {
                c.regions_pushed += 1;
                c.bytes_pushed += desc.len;
            });
            self.queue(Outgoing::Push { desc, data });
        }
        Ok(desc)
    }

    fn deregister(&mut self, region: RegionDesc) -> Result<(), TransportError> {
        self.soft.deregister(region.rkey)?;
        if self.push.revoke_pushed(region.rkey) {
            self.queue(Outgoing::Revoke { rkey: region.rkey });
        }
        Ok(())
    }

    fn post_read(&mut self, wr_id: WrId, remote: RegionDesc, dst: Buf) -> Result<(), TransportError> {
        self.info.check_read(&remote, dst.len())?;
        match self.push.lookup(&remote) {
            Lookup::Pushed { data } => {
                // The pushed bytes are the destination (read off the socket into a buffer of
                // our pool): nothing copied; `dst` goes back to the pool.
                self.queue(Outgoing::Window { rkey: remote.rkey, len: remote.len });
                drop(dst);
                self.soft.read_at_once(wr_id, remote, data)
            }
            Lookup::Remote { dropped } => {
                if let Some(len) = dropped {
                    self.queue(Outgoing::Window { rkey: remote.rkey, len });
                }
                let id = self
                    .soft
                    .begin_read(wr_id, remote, dst)
                    .inspect_err(|_| self.push.read_done(remote.rkey))?;
                self.queue(Outgoing::ReadReq { id, addr: remote.addr, len: remote.len, rkey: remote.rkey });
                Ok(())
            }
        }
    }

    fn poll_completions(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Poll<Result<(), TransportError>> {
        self.direct_unpolled = false;
        self.soft.poll_completions(cx, out, max)
    }

    fn arm(&mut self, waker: &Waker) -> bool {
        // A look at the completions as a poll's is: the next SEND is written directly.
        self.direct_unpolled = false;
        self.soft.arm(waker)
    }

    fn counters(&self) -> TransportCounters {
        let mut counters = self.soft.counters();
        counters.send_posts = self.out.writes();
        (counters.tcp_looks, counters.tcp_looks_found) = self.looks.looks();
        counters.busy_poll_spins = self.looks.spins();
        counters
    }

    fn close(&mut self) {
        self.soft.fail(Death::Closed("closed by this side".into()));
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod push_tests;
#[cfg(test)]
mod tests;

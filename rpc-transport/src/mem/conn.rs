//! One end of an in-process connection.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use super::delay::DelayLine;
use super::faults::{corrupt, FaultPlan, SendFault};
use crate::soft::{Death, Soft, MAX_READ_SIZE};
use crate::{
    Buf, Completion, ConnInfo, Connection, Detail, MemPool, ReadError, RecvBuffer, RegionDesc, SendBuf,
    TransportCounters, TransportError, WrId,
};

/// READs a mem connection allows in flight (advertised; the fabric serves them at once).
const MAX_READS_IN_FLIGHT: u32 = 16;

#[derive(Debug)]
pub(crate) struct MemConnection {
    local: Arc<Soft>,
    peer: Arc<Soft>,
    plan: Arc<FaultPlan>,
    info: ConnInfo,
    delay: DelayLine,
    /// Calls that posted SENDs (`TransportCounters::send_posts`).
    send_posts: u64,
}

/// Creates both ends of a connection under `name`: each end's receives are posted here, before
/// either end exists for its user. When one end dies the other follows.
pub(crate) fn pair(
    name: &str,
    client: &crate::ConnParams,
    server: &crate::ConnParams,
    plan: Arc<FaultPlan>,
) -> (MemConnection, MemConnection) {
    let (client_end, server_end) = (Soft::new(client), Soft::new(server));
    link_deaths(&client_end, &server_end);
    plan.track(&client_end, &server_end);
    let info = |peer_params: &crate::ConnParams, peer: String| ConnInfo {
        peer_private_data: peer_params.private_data.clone(),
        peer_recv_size: peer_params.recv_size,
        peer_recv_depth: peer_params.recv_depth,
        max_read_size: MAX_READ_SIZE,
        max_reads_in_flight: MAX_READS_IN_FLIGHT,
        peer,
        backend: "mem",
        idle_poll_is_costly: false,
        // Every SEND is copied into the peer's posted receive.
        copied_sends: u32::MAX,
    };
    let client_conn = MemConnection {
        local: client_end.clone(),
        peer: server_end.clone(),
        plan: plan.clone(),
        info: info(server, format!("mem://{name}")),
        delay: DelayLine::default(),
        send_posts: 0,
    };
    let server_conn = MemConnection {
        local: server_end,
        peer: client_end,
        plan,
        info: info(client, format!("mem://{name} (client)")),
        delay: DelayLine::default(),
        send_posts: 0,
    };
    (client_conn, server_conn)
}

/// When either end dies, the other dies too (the peer sees a disconnect).
fn link_deaths(a: &Arc<Soft>, b: &Arc<Soft>) {
    let follow = |other: &Arc<Soft>| {
        let other = Arc::downgrade(other);
        move |death: &Death| {
            if let Some(other) = other.upgrade() {
                other.fail(Death::Closed(death.detail().context("peer closed")));
            }
        }
    };
    a.set_on_death(follow(b));
    b.set_on_death(follow(a));
}

impl MemConnection {
    /// `post_send`; with `done`, a SEND delivered at once is reported there (see
    /// `Connection::post_send_batch_reporting`).
    fn send(
        &mut self,
        wr_id: WrId,
        msg: SendBuf,
        done: Option<&mut Vec<(WrId, Result<(), TransportError>)>>,
    ) -> Result<(), TransportError> {
        let max = self.info.peer_recv_size as usize;
        if msg.len() > max {
            return Err(TransportError::MessageTooLarge { len: msg.len(), max });
        }
        self.plan.stall_send();
        if self.plan.completion_delay().is_zero() && self.delay.is_idle() && !self.plan.black_holed() {
            // Delivered and completed here, in order (nothing is delayed before it): the SEND
            // is never pending, so nothing is recorded.
            return self.local.send_at_once(
                wr_id,
                || {
                    let delivered = match self.plan.next_send_fault() {
                        SendFault::Fail => return Err(TransportError::Injected("fail_next_completions")),
                        SendFault::Corrupt => self.peer.deliver(&corrupt(msg.parts())),
                        SendFault::None => self.peer.deliver_parts(msg.parts()),
                    };
                    // A delivery that kills the peer takes this end down too.
                    delivered
                        .map_err(|death| TransportError::Disconnected(death.detail().context("peer closed")))
                },
                done,
            );
        }
        let op = self.local.begin_send(wr_id)?;
        if self.plan.black_holed() {
            // Vanishes: no delivery, no completion; flushed if the connection dies.
            return Ok(());
        }
        let fault = self.plan.next_send_fault();
        let (local, peer) = (self.local.clone(), self.peer.clone());
        self.delay.run(self.plan.completion_delay(), move || {
            let delivered = match fault {
                SendFault::Fail => {
                    return local.complete_send(op, Err(TransportError::Injected("fail_next_completions")))
                }
                SendFault::Corrupt => peer.deliver(&corrupt(msg.parts())),
                SendFault::None => peer.deliver_parts(msg.parts()),
            };
            // A delivery that kills the peer takes this end down too, flushing the send.
            if delivered.is_ok() {
                local.complete_send(op, Ok(()));
            }
        });
        Ok(())
    }
}

impl Connection for MemConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn post_recv(&mut self, buf: RecvBuffer) -> Result<(), TransportError> {
        self.local.post_recv(buf)
    }

    fn post_recv_batch(&mut self, bufs: &mut Vec<RecvBuffer>) -> Result<(), TransportError> {
        self.local.post_recv_batch(bufs)
    }

    fn post_send(&mut self, wr_id: WrId, msg: SendBuf) -> Result<(), TransportError> {
        self.send_posts += 1;
        self.send(wr_id, msg, None)
    }

    fn post_send_batch_reporting(
        &mut self,
        sends: &mut Vec<(WrId, SendBuf)>,
        done: &mut Vec<(WrId, Result<(), TransportError>)>,
    ) -> Result<(), TransportError> {
        self.send_posts += u64::from(!sends.is_empty());
        crate::take_each(sends, |(wr_id, msg)| self.send(wr_id, msg, Some(&mut *done)))
    }

    fn pool(&self) -> &MemPool {
        self.local.pool()
    }

    fn register(&mut self, data: Bytes) -> Result<RegionDesc, TransportError> {
        Ok(self.local.register(data))
    }

    fn deregister(&mut self, region: RegionDesc) -> Result<(), TransportError> {
        self.local.deregister(region.rkey)
    }

    fn post_read(&mut self, wr_id: WrId, remote: RegionDesc, dst: Buf) -> Result<(), TransportError> {
        self.info.check_read(&remote, dst.len())?;
        let op = self.local.begin_read(wr_id, remote, dst)?;
        if self.plan.black_holed() {
            // Vanishes: the peer is not read, no completion; flushed if the connection dies.
            return Ok(());
        }
        let (local, peer, plan) = (self.local.clone(), self.peer.clone(), self.plan.clone());
        self.delay.run(self.plan.completion_delay(), move || {
            if plan.reads_fail() {
                return local.complete_read_from(op, Err(ReadError::Failed("injected".into())));
            }
            let served = peer.serve_read(remote.addr, remote.len, remote.rkey);
            let refused = served.as_ref().err().cloned();
            local.complete_read_from(op, served);
            // As on verbs: a refused READ (bad key, out of bounds, revoked) completes with its
            // error, then the connection fails on both ends.
            if let Some(err) = refused {
                let why = format!("READ refused by the peer ({err}): connection closed");
                local.fail(Death::Closed(Detail::new(why).with_cause(err)));
            }
        });
        Ok(())
    }

    fn poll_completions(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Poll<Result<(), TransportError>> {
        self.local.poll_completions(cx, out, max)
    }

    fn arm(&mut self, waker: &Waker) -> bool {
        self.local.arm(waker)
    }

    fn counters(&self) -> TransportCounters {
        let mut counters = self.local.counters();
        counters.send_posts = self.send_posts;
        counters
    }

    fn close(&mut self) {
        self.local.fail(Death::Closed("closed by this side".into()));
    }
}

impl Drop for MemConnection {
    fn drop(&mut self) {
        self.close();
    }
}

//! Connection setup through rdma_cm (required on iWARP, where a QP cannot be moved to RTS by hand),
//! then the in-band hello (see `hello.rs`).
//!
//! Active side: resolve address and route, create CQ/QP, move the QP to INIT, post the receives,
//! `rdma_connect`; on CONNECT_RESPONSE (IB/RoCE) move it to RTR and RTS and `rdma_establish`; on
//! ESTABLISHED (iWARP: the kernel moved the QP) go on; send our hello, wait for the peer's.
//! Passive side: on CONNECT_REQUEST create CQ/QP, INIT, post the receives, RTR and RTS (not on
//! iWARP), `rdma_accept`, wait for ESTABLISHED, wait for the peer's hello, answer with ours.
//!
//! `initiator_depth` / `responder_resources` ask for as many READs in flight as the device allows;
//! each side then limits itself to `min(own max_rd_atomic, peer's max_dest_rd_atomic)` from the
//! hello.

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;

use sideway::ibverbs::completion::BasicCompletionQueue;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairAttributeMask, QueuePairState};
use sideway::rdmacm::communication_manager::Identifier;

use super::buffers::{PdRegistrar, RegisteredBuf};
use super::cm::{attach_sink, CmChannel, CmEvent, CmSink};
use super::config::RdmaConfig;
use super::conn::{Limits, RdmaConnection};
use super::cq::CqPoller;
use super::device::{self, DeviceFacts};
use super::error::{chain, verbs, RdmaError};
use super::hello::{Hello, HELLO_MAX, HELLO_NUDGES, MAX_RD_ATOMIC};
use super::slab::Slab;
use super::sys::{self, ConnParamFields};
use crate::{ConnInfo, ConnParams, Connection, KeyPolicy, MemPool, TransportError};

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "as many as the device allows" to librdmacm.
const RDMA_MAX_DEPTH: u8 = 0xff;
/// Inline sizes tried, largest first (siw accepts at most 80 bytes or so, rxe a few hundred).
const INLINE_TRIES: [u32; 3] = [256, 64, 0];
/// At most one SEND in this many is signaled (eRPC's figure); fewer on a short send queue.
const SIGNAL_EVERY_MAX: u32 = 64;

/// Checks the parameters a side asks for: the same limits as the other backends (receive depth
/// and size, private data, setup bounds).
pub(super) fn check_params(params: &ConnParams) -> Result<(), TransportError> {
    crate::soft::validate_params(params)
}

/// Connects to `addr` with the configuration from the environment (see [`RdmaConfig::from_env`]).
pub async fn connect(addr: SocketAddr, params: ConnParams) -> Result<Box<dyn Connection>, TransportError> {
    Ok(Box::new(connect_with(addr, params.clone(), RdmaConfig::from_settings(&params.rdma)).await?))
}

/// Connects to `addr` with an explicit configuration.
pub async fn connect_with(
    addr: SocketAddr,
    params: ConnParams,
    cfg: RdmaConfig,
) -> Result<RdmaConnection, TransportError> {
    check_params(&params)?;
    device::check_devices(&cfg)?;
    let cm = Arc::new(CmChannel::open()?);
    let (id, sink) = cm.create_id()?;
    let setup = active_setup(addr, &params, &cfg, Arc::clone(&cm), id, sink);
    match tokio::time::timeout(cfg.setup_timeout, setup).await {
        Ok(result) => result,
        Err(_) => Err(RdmaError::Unreachable {
            addr: addr.to_string(),
            stage: "connection setup",
            detail: format!("no answer within {:?}", cfg.setup_timeout),
        }
        .into()),
    }
}

async fn active_setup(
    addr: SocketAddr,
    params: &ConnParams,
    cfg: &RdmaConfig,
    cm: Arc<CmChannel>,
    id: Arc<Identifier>,
    sink: Arc<CmSink>,
) -> Result<RdmaConnection, TransportError> {
    let unreachable =
        |stage, detail: String| RdmaError::Unreachable { addr: addr.to_string(), stage, detail };
    id.resolve_addr(None, addr, cfg.resolve_timeout)
        .map_err(|e| unreachable("address resolution", chain(&e)))?;
    expect(&sink, "address resolution", addr, |ev| matches!(ev, CmEvent::AddressResolved)).await?;
    id.resolve_route(cfg.resolve_timeout).map_err(|e| unreachable("route resolution", chain(&e)))?;
    expect(&sink, "route resolution", addr, |ev| matches!(ev, CmEvent::RouteResolved)).await?;

    let (mut conn, facts) = build_connection(&id, sink, cm, params, cfg, addr.to_string())?;
    let fields = ConnParamFields {
        qp_num: conn.qp_number(),
        responder_resources: facts.max_qp_rd_atom.min(254) as u8,
        initiator_depth: facts.max_qp_init_rd_atom.min(254) as u8,
        retry_count: cfg.retry_count,
        rnr_retry_count: cfg.rnr_retry_count,
    };
    id.connect(sys::conn_param(fields)).map_err(|e| unreachable("connect", chain(&e)))?;
    loop {
        match conn.cm_sink.next().await {
            CmEvent::ConnectResponse => {
                conn.ready_to_send(&id, &facts)?;
                id.establish().map_err(|e| verbs("rdma_establish", chain(&e)))?;
                break;
            }
            CmEvent::Established => break,
            CmEvent::Failed { kind: "REJECTED", status } => {
                return Err(RdmaError::Rejected { addr: addr.to_string(), status }.into())
            }
            CmEvent::Failed { kind, status } => {
                return Err(unreachable("connect", format!("{kind} (status {status})")).into())
            }
            other => tracing::debug!(event = ?other, "ignoring rdma_cm event while connecting"),
        }
    }
    let ours = conn.local_hello(params, &facts);
    if !cfg.silent_after_connect {
        conn.post_hello(&ours.encode())?;
    }
    let theirs = if facts.iwarp { conn.wait_hello_nudging(cfg).await? } else { conn.wait_hello().await? };
    conn.finish_setup(&ours, theirs, &facts);
    Ok(conn)
}

/// Waits for the event `want` accepts; a failure event is `Unreachable`.
async fn expect(
    sink: &CmSink,
    stage: &'static str,
    addr: SocketAddr,
    want: impl Fn(&CmEvent) -> bool,
) -> Result<(), TransportError> {
    loop {
        let ev = sink.next().await;
        if want(&ev) {
            return Ok(());
        }
        if let CmEvent::Failed { kind, status } = ev {
            return Err(RdmaError::Unreachable {
                addr: addr.to_string(),
                stage,
                detail: format!("{kind} (status {status})"),
            }
            .into());
        }
        tracing::debug!(event = ?ev, stage, "ignoring rdma_cm event");
    }
}

/// Creates the verbs resources for an identifier bound to a device, and the connection around
/// them with its receives posted (QP in INIT).
fn build_connection(
    id: &Arc<Identifier>,
    sink: Arc<CmSink>,
    cm: Arc<CmChannel>,
    params: &ConnParams,
    cfg: &RdmaConfig,
    peer: String,
) -> Result<(RdmaConnection, DeviceFacts), TransportError> {
    let ctx = id
        .get_device_context()
        .ok_or_else(|| RdmaError::NoDevice("rdma_cm bound no device to the identifier".into()))?;
    let port = match id.port() {
        0 => cfg.port,
        p => p,
    };
    let facts = device::inspect(&ctx, port, &peer, cfg)?;
    let pd = ctx.alloc_pd().map_err(|e| verbs("ibv_alloc_pd", chain(&e)))?;
    let sq_depth = cfg.send_queue_depth.clamp(1, facts.max_qp_wr);
    let rq_depth = params.recv_depth.saturating_add(1);
    if rq_depth > facts.max_qp_wr {
        return Err(TransportError::Handshake(format!(
            "recv_depth {} exceeds the device's max_qp_wr {}",
            params.recv_depth, facts.max_qp_wr
        )));
    }
    let cq = CqPoller::new(&ctx, sq_depth + rq_depth, cfg)?;
    let (mut qp, max_inline) = create_qp(&pd, cq.cq(), sq_depth, rq_depth)?;
    let init =
        id.get_qp_attr(QueuePairState::Init).map_err(|e| verbs("rdma_init_qp_attr(INIT)", chain(&e)))?;
    qp.modify(&init).map_err(|e| verbs("ibv_modify_qp(INIT)", chain(&e)))?;

    let recv_size = params.recv_size as usize;
    let registrar =
        PdRegistrar { pd: Arc::clone(&pd), remote_read: params.key_policy == KeyPolicy::PoolKeys };
    let pool = MemPool::with_registrar(Box::new(registrar), params.pool);
    let hello_buf = RegisteredBuf::new(&pd, HELLO_MAX)?;
    let max_chunk = match facts.max_msg_sz {
        0 => cfg.max_read_chunk,
        m => cfg.max_read_chunk.min(u64::from(m)),
    };
    let mut conn = RdmaConnection {
        qp: Some(qp),
        cq,
        info: ConnInfo {
            peer_private_data: Default::default(),
            peer_recv_size: 0,
            peer_recv_depth: 0,
            max_read_size: cfg.max_read_size,
            max_reads_in_flight: 1,
            peer: format!("{peer} via {}", facts.name),
            backend: "rdma",
            idle_poll_is_costly: true,
            copied_sends: max_inline,
        },
        limits: Limits { sq_depth, max_inline, max_chunk, max_reads: 1, poll_budget: cfg.poll_budget.max(1) },
        ops: Slab::default(),
        reads: Slab::default(),
        pool,
        key_policy: params.key_policy,
        rq_posted: 0,
        rq_capacity: rq_depth,
        recv_backlog: VecDeque::new(),
        recv_size,
        send_pool: None,
        send_slabs: cfg.send_slabs.clamp(1, sq_depth),
        oversized_in_flight: false,
        hello_buf,
        send_backlog: VecDeque::new(),
        read_backlog: VecDeque::new(),
        sq_posted: 0,
        sq_retired: 0,
        sq_signaled: 0,
        signaled_sends: 0,
        unsignaled_run: 0,
        signal_every: (sq_depth / 2).clamp(1, SIGNAL_EVERY_MAX),
        sq_batch: Vec::with_capacity(super::sys::POST_BATCH),
        rq_batch: Vec::with_capacity(super::sys::POST_BATCH),
        reads_in_flight: 0,
        regions: HashMap::new(),
        pooled_regions: HashMap::new(),
        ready: VecDeque::new(),
        posted_done: Vec::new(),
        reporting: false,
        peer_hello: None,
        nudges_sent: 0,
        failed: None,
        malformed: false,
        error_reported: false,
        disconnected: false,
        counters: Default::default(),
        wc_scratch: Vec::with_capacity(64),
        pd,
        cm_sink: sink,
        cm_waker: None,
        id: Some(Arc::clone(id)),
        cm,
    };
    conn.post_initial_receives(params.recv_depth)?;
    Ok((conn, facts))
}

/// Creates the RC QP, asking for as much inline data as the provider grants.
fn create_qp(
    pd: &Arc<ProtectionDomain>,
    cq: &Arc<BasicCompletionQueue>,
    sq: u32,
    rq: u32,
) -> Result<(BasicQueuePair, u32), TransportError> {
    let mut last = None;
    for inline in INLINE_TRIES {
        let mut builder = pd.create_qp_builder();
        builder
            .setup_max_send_wr(sq)
            .setup_max_recv_wr(rq)
            .setup_max_send_sge(2)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(inline)
            .setup_send_cq(Arc::clone(cq))
            .setup_recv_cq(Arc::clone(cq));
        match builder.build() {
            Ok(qp) => {
                let granted = qp
                    .query(QueuePairAttributeMask::Capabilities)
                    .map(|(_, init)| init.max_inline_data())
                    .unwrap_or(inline);
                return Ok((qp, granted));
            }
            Err(e) => last = Some(chain(&e)),
        }
    }
    Err(verbs("ibv_create_qp", last.unwrap_or_default()))
}

impl RdmaConnection {
    pub(super) fn qp_number(&self) -> u32 {
        self.qp.as_ref().map_or(0, |qp| qp.qp_number())
    }

    /// Moves the QP to RTR then RTS with the attributes rdma_cm negotiated (IB / RoCE only).
    pub(super) fn ready_to_send(
        &mut self,
        id: &Identifier,
        facts: &DeviceFacts,
    ) -> Result<(), TransportError> {
        let qp =
            self.qp.as_mut().ok_or_else(|| TransportError::Disconnected("queue pair destroyed".into()))?;
        // INIT again first, as librdmacm's own ucma_modify_qp_rtr does: on the active side the QP
        // went to INIT before the CM exchange, when the kernel's INIT attributes carry no
        // REMOTE_READ access (responder_resources still unknown). Without this the client's QP
        // refused every READ the server issued (a rendezvous request: "remote invalid request" on
        // rxe, found by scripts/vm/rdma-suite.sh); the passive side merely gets the same flags again.
        let init =
            id.get_qp_attr(QueuePairState::Init).map_err(|e| verbs("rdma_init_qp_attr(INIT)", chain(&e)))?;
        qp.modify(&init).map_err(|e| verbs("ibv_modify_qp(INIT->INIT)", chain(&e)))?;
        let rtr = id
            .get_qp_attr(QueuePairState::ReadyToReceive)
            .map_err(|e| verbs("rdma_init_qp_attr(RTR)", chain(&e)))?;
        qp.modify(&rtr).map_err(|e| verbs("ibv_modify_qp(RTR)", chain(&e)))?;
        let mut rts = id
            .get_qp_attr(QueuePairState::ReadyToSend)
            .map_err(|e| verbs("rdma_init_qp_attr(RTS)", chain(&e)))?;
        if u32::from(rts.max_read_atomic()) > facts.max_qp_init_rd_atom {
            rts.setup_max_read_atomic(facts.max_qp_init_rd_atom.min(255) as u8);
        }
        qp.modify(&rts).map_err(|e| verbs("ibv_modify_qp(RTS)", chain(&e)))?;
        Ok(())
    }

    /// Our hello: receive parameters, private data and the READ depths the QP got.
    pub(super) fn local_hello(&self, params: &ConnParams, facts: &DeviceFacts) -> Hello {
        let mask = QueuePairAttributeMask::MaxReadAtomic | QueuePairAttributeMask::MaxDestinationReadAtomic;
        let (rd, dest) = self
            .qp
            .as_ref()
            .and_then(|qp| qp.query(mask).ok())
            .map(|(attr, _)| (u32::from(attr.max_read_atomic()), u32::from(attr.max_dest_read_atomic())))
            .unwrap_or((0, 0));
        // Some providers (iWARP) report 0 here; fall back to the device limits, at least 1 (and
        // at most what a hello may announce).
        let or_device =
            |v: u32, dev: u32| if v == 0 { dev.clamp(1, MAX_RD_ATOMIC) } else { v.min(MAX_RD_ATOMIC) };
        Hello {
            recv_depth: params.recv_depth,
            recv_size: params.recv_size,
            max_dest_rd_atomic: or_device(dest, facts.max_qp_rd_atom),
            max_rd_atomic: or_device(rd, facts.max_qp_init_rd_atom),
            private_data: params.private_data.clone(),
        }
    }

    /// Waits until the peer's hello arrived (or the connection failed).
    pub(super) async fn wait_hello(&mut self) -> Result<Hello, TransportError> {
        poll_fn(|cx| {
            self.poll_progress(cx);
            if let Some(hello) = self.peer_hello.take() {
                return Poll::Ready(hello);
            }
            if let Some(reason) = &self.failed {
                return Poll::Ready(Err(TransportError::Handshake(format!(
                    "connection failed before the hello: {reason}"
                ))));
            }
            if !self.ready.is_empty() {
                // poll_progress stopped early for a completion the caller will get later; it
                // registered no waker, so come back at once.
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        })
        .await
    }

    /// The active side's wait for the peer's hello on iWARP: after `hello_nudge_after` without
    /// it, a nudge, then again after twice as long, at most `HELLO_NUDGES` times (see
    /// [`RdmaConfig::hello_nudge_after`]); counted in `nudges_sent`.
    async fn wait_hello_nudging(&mut self, cfg: &RdmaConfig) -> Result<Hello, TransportError> {
        let mut wait = cfg.hello_nudge_after;
        while !wait.is_zero() && self.nudges_sent < HELLO_NUDGES && !cfg.silent_after_connect {
            if let Ok(hello) = tokio::time::timeout(wait, self.wait_hello()).await {
                return hello;
            }
            tracing::debug!(peer = %self.info.peer, after = ?wait, "no hello from the peer yet: nudging it");
            self.post_nudge()?;
            self.nudges_sent += 1;
            wait = wait.saturating_mul(2);
        }
        self.wait_hello().await
    }

    /// Records what the peer told us.
    pub(super) fn finish_setup(&mut self, ours: &Hello, theirs: Hello, facts: &DeviceFacts) {
        let max_reads = ours.max_rd_atomic.min(theirs.max_dest_rd_atomic).max(1);
        self.limits.max_reads = max_reads;
        self.info.max_reads_in_flight = max_reads;
        self.info.peer_recv_size = theirs.recv_size;
        self.info.peer_recv_depth = theirs.recv_depth;
        self.info.peer_private_data = theirs.private_data;
        tracing::debug!(
            peer = %self.info.peer,
            device = %facts.name,
            iwarp = facts.iwarp,
            max_reads,
            max_inline = self.limits.max_inline,
            "rdma connection established"
        );
    }
}

/// The passive side of connection setup for one connect request (unbounded in time: the
/// listener bounds it with `handshake_timeout`).
pub(super) async fn passive_setup(
    id: Arc<Identifier>,
    params: &ConnParams,
    cfg: &RdmaConfig,
    cm: Arc<CmChannel>,
    local: SocketAddr,
) -> Result<RdmaConnection, TransportError> {
    let sink = attach_sink(&id);
    let (mut conn, facts) = build_connection(&id, sink, cm, params, cfg, format!("peer of {local}"))?;
    if !facts.iwarp {
        conn.ready_to_send(&id, &facts)?;
    }
    let mut fields = ConnParamFields {
        qp_num: conn.qp_number(),
        responder_resources: RDMA_MAX_DEPTH,
        initiator_depth: RDMA_MAX_DEPTH,
        retry_count: cfg.retry_count,
        rnr_retry_count: cfg.rnr_retry_count,
    };
    if let Err(e) = id.accept(sys::conn_param(fields)) {
        tracing::debug!(error = %chain(&e), "accept with maximal depths refused; retrying with device limits");
        fields.responder_resources = facts.max_qp_rd_atom.min(254) as u8;
        fields.initiator_depth = facts.max_qp_init_rd_atom.min(254) as u8;
        id.accept(sys::conn_param(fields)).map_err(|e| verbs("rdma_accept", chain(&e)))?;
    }
    loop {
        match conn.cm_sink.next().await {
            CmEvent::Established => break,
            CmEvent::Failed { kind, status } => {
                return Err(TransportError::Handshake(format!(
                    "incoming connection failed: {kind} (status {status})"
                )))
            }
            CmEvent::Disconnected => {
                return Err(TransportError::Handshake("peer disconnected during setup".into()))
            }
            other => tracing::debug!(event = ?other, "ignoring rdma_cm event while accepting"),
        }
    }
    let theirs = conn.wait_hello().await?;
    let ours = conn.local_hello(params, &facts);
    if !cfg.hello_delay.is_zero() {
        tokio::time::sleep(cfg.hello_delay).await;
    }
    conn.post_hello(&ours.encode())?;
    conn.finish_setup(&ours, theirs, &facts);
    Ok(conn)
}

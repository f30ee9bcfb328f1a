//! Protocol counters of one connection.

/// Counters kept by the protocol core of one connection; cheap to copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProtoStats {
    /// Frames handed to the transport.
    pub frames_sent: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Credit-only frames sent.
    pub credit_frames: u64,
    /// Frames that had to wait for credits before they could be sent.
    pub credit_stalls: u64,
    /// Payloads sent inline.
    pub eager_sent: u64,
    /// Payloads advertised for READ.
    pub rendezvous_sent: u64,
    /// Payloads received inline.
    pub eager_received: u64,
    /// Payloads pulled with a READ.
    pub rendezvous_received: u64,
    /// READs issued.
    pub reads_issued: u64,
    /// Bytes pulled with READs.
    pub bytes_read: u64,
    /// Regions registered for the peer.
    pub regions_registered: u64,
    /// Keys revoked.
    pub keys_revoked: u64,
    /// Calls cancelled (client: cancels sent; server: cancels received).
    pub cancels: u64,
    /// Calls whose deadline expired.
    pub deadlines_expired: u64,
    /// Calls completed (client: responses delivered; server: responses sent).
    pub calls_completed: u64,
    /// Rendezvous bytes held now (READ destinations in flight, regions awaiting done).
    pub rendezvous_bytes_held: u64,
    /// The most rendezvous bytes held at once.
    pub rendezvous_bytes_peak: u64,
    /// Times a READ (or, on a server, a handler start) waited for the rendezvous budget.
    pub budget_waits: u64,
    /// The most frames ever waiting for credits at once.
    pub queued_frames_peak: u64,
    /// Keepalive pings sent.
    pub pings_sent: u64,
    /// Regions whose done report did not come in time (the connection was closed).
    pub done_timeouts: u64,
    /// READs that did not complete in time (the connection was closed).
    pub read_timeouts: u64,
    /// Frames the peer sent beyond its credits (the connection was closed).
    pub credit_violations: u64,
}

impl ProtoStats {
    /// Field-by-field sum, for totals over connections (peaks: the largest).
    pub fn merged(&self, other: &ProtoStats) -> ProtoStats {
        let mut out = *self;
        out.frames_sent += other.frames_sent;
        out.frames_received += other.frames_received;
        out.credit_frames += other.credit_frames;
        out.credit_stalls += other.credit_stalls;
        out.eager_sent += other.eager_sent;
        out.rendezvous_sent += other.rendezvous_sent;
        out.eager_received += other.eager_received;
        out.rendezvous_received += other.rendezvous_received;
        out.reads_issued += other.reads_issued;
        out.bytes_read += other.bytes_read;
        out.regions_registered += other.regions_registered;
        out.keys_revoked += other.keys_revoked;
        out.cancels += other.cancels;
        out.deadlines_expired += other.deadlines_expired;
        out.calls_completed += other.calls_completed;
        out.rendezvous_bytes_held += other.rendezvous_bytes_held;
        out.rendezvous_bytes_peak = out.rendezvous_bytes_peak.max(other.rendezvous_bytes_peak);
        out.budget_waits += other.budget_waits;
        out.queued_frames_peak = out.queued_frames_peak.max(other.queued_frames_peak);
        out.pings_sent += other.pings_sent;
        out.done_timeouts += other.done_timeouts;
        out.read_timeouts += other.read_timeouts;
        out.credit_violations += other.credit_violations;
        out
    }
}

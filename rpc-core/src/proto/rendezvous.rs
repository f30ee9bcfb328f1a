//! The rendezvous bookkeeping both roles share: READs we issue (queued for budget and READ
//! depth, then in flight) and regions we advertised (until the peer reports its READ done).
//!
//! Revocation rule: a region is revoked only when the peer can no longer be READing it: its done
//! report, the death of the connection, or the done timeout (which also closes the connection,
//! since a READ with a revoked key would break it anyway). A READ we issued stays in flight, and
//! counted in the budget, until its completion returns, even if its call was cancelled; only then
//! is the peer told we are done.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use rpc_transport::{RegionDesc, WrId};

use super::budget::Budget;
use super::deadlines::{earliest, DeadlineQueue};
use super::error::ProtoError;
use super::link::Op;
use super::stats::ProtoStats;

#[derive(Debug)]
struct InFlight {
    call_id: u64,
    len: u64,
    expires: Option<Instant>,
    /// The call was cancelled or expired meanwhile: drop the data, report done.
    abandoned: bool,
}

#[derive(Debug)]
struct Advertised {
    region: RegionDesc,
    expires: Option<Instant>,
}

/// What happened to a call's READ when the call was abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AbandonedRead {
    /// It had not been issued: the peer may be told at once that we will not READ.
    WasQueued,
    /// It is in flight: the peer is told when its completion returns.
    InFlight,
    /// The call had no READ.
    None,
}

/// A completed READ, as the owning role must see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadDone {
    pub call_id: u64,
    /// The call was abandoned meanwhile: report done, drop the data.
    pub abandoned: bool,
}

#[derive(Debug)]
pub(crate) struct Rendezvous {
    pub budget: Budget,
    max_reads: usize,
    read_timeout: Duration,
    done_timeout: Duration,
    queued: VecDeque<(u64, RegionDesc)>,
    in_flight: HashMap<WrId, InFlight>,
    next_read_wr: WrId,
    advertised: HashMap<u64, Advertised>,
    /// Our payloads handed out for registration and not yet back, by call.
    registering: HashMap<u64, u64>,
    read_deadlines: DeadlineQueue,
    done_deadlines: DeadlineQueue,
}

impl Rendezvous {
    pub fn new(budget: Budget, max_reads: u32, read_timeout: Duration, done_timeout: Duration) -> Self {
        Rendezvous {
            budget,
            max_reads: max_reads.max(1) as usize,
            read_timeout,
            done_timeout,
            queued: VecDeque::new(),
            in_flight: HashMap::new(),
            next_read_wr: 1,
            advertised: HashMap::new(),
            registering: HashMap::new(),
            read_deadlines: DeadlineQueue::default(),
            done_deadlines: DeadlineQueue::default(),
        }
    }

    /// Queues a READ of the peer's region for `call_id`; it is issued by [`Rendezvous::issue`].
    pub fn queue_read(&mut self, call_id: u64, remote: RegionDesc) {
        self.queued.push_back((call_id, remote));
    }

    /// Whether [`Rendezvous::issue`] has anything to do: a READ queued and room for one more in
    /// flight (it then issues it, or counts a wait for the budget).
    #[inline]
    pub fn can_issue(&self) -> bool {
        !self.queued.is_empty() && self.in_flight.len() < self.max_reads
    }

    /// What [`Rendezvous::issue`] can change, besides the budget and the counters: READs queued
    /// and in flight, the next READ's id, whether the budget blocked on the endpoint's.
    #[cfg(any(test, debug_assertions))]
    pub fn fingerprint(&self) -> (usize, usize, WrId, bool) {
        (self.queued.len(), self.in_flight.len(), self.next_read_wr, self.budget.blocked_on().is_some())
    }

    /// Issues queued READs, in order, while READ depth and budget allow.
    pub fn issue(&mut self, now: Instant, ops: &mut VecDeque<Op>, stats: &mut ProtoStats) {
        while self.can_issue() {
            let Some(&(call_id, remote)) = self.queued.front() else { break };
            if !self.budget.try_reserve_read(remote.len) {
                stats.budget_waits += 1;
                break;
            }
            self.queued.pop_front();
            let wr_id = self.next_read_wr;
            self.next_read_wr += 1;
            let expires = now.checked_add(self.read_timeout);
            if let Some(at) = expires {
                let reads = &self.in_flight;
                let live = |id, at| reads.get(&id).is_some_and(|r: &InFlight| r.expires == Some(at));
                self.read_deadlines.push_pruned(at, wr_id, reads.len() + 1, live);
            }
            self.in_flight.insert(wr_id, InFlight { call_id, len: remote.len, expires, abandoned: false });
            stats.reads_issued += 1;
            ops.push_back(Op::Read { wr_id, remote });
        }
    }

    /// The call's READ will not be used: forget it if queued, mark it if in flight.
    pub fn abandon_read(&mut self, call_id: u64) -> AbandonedRead {
        if let Some(i) = self.queued.iter().position(|(id, _)| *id == call_id) {
            self.queued.remove(i);
            return AbandonedRead::WasQueued;
        }
        match self.in_flight.values_mut().find(|r| r.call_id == call_id && !r.abandoned) {
            Some(read) => {
                read.abandoned = true;
                AbandonedRead::InFlight
            }
            None => AbandonedRead::None,
        }
    }

    /// A READ completion: releases its budget. `None` for an id we never issued.
    pub fn read_complete(&mut self, wr_id: WrId) -> Option<ReadDone> {
        let read = self.in_flight.remove(&wr_id)?;
        self.budget.release_read(read.len);
        Some(ReadDone { call_id: read.call_id, abandoned: read.abandoned })
    }

    /// Our payload of `len` bytes for `call_id` was handed to the protocol for registration:
    /// it counts from now (so that handlers are held back before the registrations are even
    /// posted).
    pub fn reserve_own(&mut self, call_id: u64, len: u64) {
        self.budget.force_reserve(len);
        self.registering.insert(call_id, len);
    }

    /// The registration of `call_id`'s payload came back. If it will not be advertised
    /// (`keep == false`: it failed, or the call was abandoned meanwhile) its bytes are released.
    pub fn registered(&mut self, call_id: u64, keep: bool) {
        let len = self.registering.remove(&call_id).unwrap_or(0);
        if !keep {
            self.budget.release(len);
        }
    }

    /// Our region for `call_id` was registered (and kept, see [`Self::registered`]) and is
    /// about to be advertised.
    pub fn advertise(&mut self, call_id: u64, desc: &RegionDesc, now: Instant) {
        let expires = now.checked_add(self.done_timeout);
        if let Some(at) = expires {
            let regions = &self.advertised;
            let live = |id, at| regions.get(&id).is_some_and(|r: &Advertised| r.expires == Some(at));
            self.done_deadlines.push_pruned(at, call_id, regions.len() + 1, live);
        }
        self.advertised.insert(call_id, Advertised { region: *desc, expires });
    }

    /// The connection is gone: every advertised region's key, to revoke now (the peer can no
    /// longer READ anything), and their bytes released.
    pub fn drain_advertised(&mut self) -> Vec<RegionDesc> {
        let keys = self.advertised.drain().map(|(_, r)| r.region).collect::<Vec<_>>();
        let held = self.budget.held();
        self.budget.release(held);
        keys
    }

    /// The peer reported its READ of our region for `call_id` done: the key to revoke.
    pub fn done(&mut self, call_id: u64) -> Option<RegionDesc> {
        let region = self.advertised.remove(&call_id)?;
        self.budget.release(region.region.len);
        Some(region.region)
    }

    /// Whether `call_id` still has a region advertised or a READ in flight (its id is not
    /// free for a new call yet).
    #[inline]
    pub fn busy(&self, call_id: u64) -> bool {
        // Small calls leave both empty: two looks at their lengths, no hashing, no scan.
        if self.advertised.is_empty() && self.in_flight.is_empty() {
            return false;
        }
        self.advertised.contains_key(&call_id) || self.in_flight.values().any(|r| r.call_id == call_id)
    }

    /// Nothing advertised, being registered, or being READ.
    pub fn is_idle(&self) -> bool {
        self.advertised.is_empty()
            && self.registering.is_empty()
            && self.in_flight.is_empty()
            && self.queued.is_empty()
    }

    /// Regions advertised and not yet reported done.
    pub fn advertised(&self) -> usize {
        self.advertised.len()
    }

    /// The earliest READ or done-report deadline added since the last look (see
    /// [`DeadlineQueue::take_added`]).
    #[inline]
    pub fn take_added_timeout(&mut self) -> Option<Instant> {
        earliest(self.read_deadlines.take_added(), self.done_deadlines.take_added())
    }

    /// The earliest READ or done deadline.
    pub fn next_timeout(&mut self) -> Option<Instant> {
        if self.read_deadlines.is_empty() && self.done_deadlines.is_empty() {
            return None;
        }
        let (reads, dones) = (&self.in_flight, &self.advertised);
        let read = self.read_deadlines.next(|id, at| reads.get(&id).is_some_and(|r| r.expires == Some(at)));
        let done = self.done_deadlines.next(|id, at| dones.get(&id).is_some_and(|r| r.expires == Some(at)));
        earliest(read, done)
    }

    /// A READ or a done report overdue is fatal for the connection.
    pub fn check(&mut self, now: Instant, stats: &mut ProtoStats) -> Result<(), ProtoError> {
        for (wr_id, at) in self.read_deadlines.expired(now) {
            if let Some(read) = self.in_flight.get(&wr_id).filter(|r| r.expires == Some(at)) {
                stats.read_timeouts += 1;
                return Err(ProtoError::ReadTimeout { call_id: read.call_id, timeout: self.read_timeout });
            }
        }
        for (call_id, at) in self.done_deadlines.expired(now) {
            if self.advertised.get(&call_id).is_some_and(|r| r.expires == Some(at)) {
                stats.done_timeouts += 1;
                return Err(ProtoError::DoneTimeout { call_id, timeout: self.done_timeout });
            }
        }
        Ok(())
    }
}

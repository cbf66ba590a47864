//! Statistics: what snapshots report.
//!
//! Exactness: `used`, `free`, `capacity` and `peak` are read from the
//! pool's one capacity word and are always exact (`peak` but for a charge
//! racing a capacity change; see [`PoolSnapshot::peak`]). In a tree of
//! pools each level has its own word: a parent's `used` includes its
//! descendants' charges, and `children_used` sums the children's `used`,
//! read one after the other (exact whenever no operation is in flight). The per-class figures are
//! sums of per-thread counters (see the module docs of
//! [`governor`](super)): exact whenever no operation on the pool is in
//! flight (for example after the threads that used it were joined); while
//! other threads operate, each figure is a sum of values read one after the
//! other, clamped at zero, so figures may disagree with each other and with
//! `used` by the operations in flight.
//!
//! Cumulative figures (`grants`, `granted_bytes`, `released_bytes`,
//! `failures`, `tickets`, `evictions`, `quarantines`) only grow. The bytes
//! side lives in the same per-thread shards as the rest: `granted_bytes`
//! is one more counter of the shard's cache line, and `released_bytes` is
//! derived (`granted_bytes` minus what is charged now), so the fast path
//! writes nothing shared for them.
//!
//! Per-class peaks ([`ClassStats::peak`]) are *sampled*: a per-class peak
//! kept exactly would need a shared counter per class on the fast path.
//! The peak is the highest per-class charge (`reserved + leased +
//! quarantined`) any sample saw, capped by the pool's exact `peak`. A
//! sample is taken by every snapshot (and so by every `OutOfBudget`, which
//! carries one) and by every request that goes to the slow path (the pool
//! was short: the moment its use is highest). It is therefore a lower
//! bound of the true per-class peak, equal to it when a sample was taken
//! at the peak with no operation in flight (for example a program that
//! reads statistics after each step); while other threads operate a sample
//! is as approximate as the other per-class figures.

use crate::ids::AllocationClass;
use crate::ids::{HolderId, PoolId, Priority};
use crate::sync::AtomicU64;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Figures of one allocation class, for a pool or for one holder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ClassStats {
    /// Bytes held by live grants (not yet committed).
    pub reserved: u64,
    /// Bytes charged to live leases, leaked leases included.
    pub leased: u64,
    /// Bytes quarantined (invariant 7): charged for good, never refunded.
    pub quarantined: u64,
    /// Live leases, leaked ones included.
    pub leases: u64,
    /// Grants made, cumulative.
    pub grants: u64,
    /// Grant requests refused, cumulative (one per refused call).
    pub failures: u64,
    /// Quarantine events (whole leases or parts), cumulative.
    pub quarantines: u64,
    /// Leases dropped without `release` or `quarantine`, cumulative. Their
    /// bytes are still counted in `leased`: a dropped lease is never
    /// refunded (nothing proves the memory was freed).
    pub leaked_leases: u64,
    /// Bytes those leaked leases held when dropped.
    pub leaked_bytes: u64,
    /// Bytes ever charged: grants, and what commits charged beyond their
    /// grant. Cumulative.
    pub granted_bytes: u64,
    /// Bytes given back, cumulative: releases (whole or part), grants
    /// dropped or committed for less, settlements of lost contexts.
    /// Always `granted_bytes - charged()`.
    pub released_bytes: u64,
    /// Pressure tickets of requests of this class: for a pool, those it
    /// issued; for a holder, those it received. Cumulative.
    pub tickets: u64,
    /// Of those tickets, the ones answered with bytes released (the
    /// holder evicted something). Cumulative.
    pub evictions: u64,
    /// Bytes those answers said were released (untrusted: only actual
    /// releases refund). Cumulative.
    pub evicted_bytes: u64,
    /// Highest [`charged`](Self::charged) seen by a sample (see the
    /// module docs: a lower bound, capped by the pool's exact peak).
    pub peak: u64,
}

impl ClassStats {
    /// `reserved + leased + quarantined`.
    pub fn charged(&self) -> u64 {
        self.reserved.saturating_add(self.leased).saturating_add(self.quarantined)
    }

    fn accumulate(&mut self, o: &ClassStats) {
        self.reserved = self.reserved.saturating_add(o.reserved);
        self.leased = self.leased.saturating_add(o.leased);
        self.quarantined = self.quarantined.saturating_add(o.quarantined);
        self.leases = self.leases.saturating_add(o.leases);
        self.grants = self.grants.saturating_add(o.grants);
        self.failures = self.failures.saturating_add(o.failures);
        self.quarantines = self.quarantines.saturating_add(o.quarantines);
        self.leaked_leases = self.leaked_leases.saturating_add(o.leaked_leases);
        self.leaked_bytes = self.leaked_bytes.saturating_add(o.leaked_bytes);
        self.granted_bytes = self.granted_bytes.saturating_add(o.granted_bytes);
        self.released_bytes = self.released_bytes.saturating_add(o.released_bytes);
        self.tickets = self.tickets.saturating_add(o.tickets);
        self.evictions = self.evictions.saturating_add(o.evictions);
        self.evicted_bytes = self.evicted_bytes.saturating_add(o.evicted_bytes);
        // Classes peak at different moments: the sum bounds the total's peak.
        self.peak = self.peak.saturating_add(o.peak);
    }

    /// Takes the ticket figures of this class.
    pub(crate) fn set_pressure(&mut self, p: &PressureStats) {
        self.tickets = p.tickets;
        self.evictions = p.tickets.saturating_sub(p.zero_answers);
        self.evicted_bytes = p.bytes_answered;
    }
}

/// Sampled per-class peaks of a pool or an account (see the module docs).
pub(crate) struct ClassPeaks([AtomicU64; AllocationClass::COUNT]);

impl ClassPeaks {
    pub fn new() -> Self {
        ClassPeaks(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    /// Raises each class's peak to its charge in `classes` (capped at
    /// `cap`, the pool's exact peak) and writes the peaks back into them.
    pub fn sample(&self, classes: &mut [ClassStats; AllocationClass::COUNT], cap: u64) {
        for (peak, c) in self.0.iter().zip(classes.iter_mut()) {
            let seen = c.charged().min(cap);
            c.peak = peak.fetch_max(seen, Relaxed).max(seen);
        }
    }
}

/// Sum over all classes.
pub(crate) fn total(classes: &[ClassStats; AllocationClass::COUNT]) -> ClassStats {
    let mut t = ClassStats::default();
    for c in classes {
        t.accumulate(c);
    }
    t
}

/// Pressure-ticket figures: for a pool, the tickets it issued; for a
/// holder, the tickets it received. Cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PressureStats {
    /// Tickets delivered to a callback.
    pub tickets: u64,
    /// Sum of `bytes_wanted` over those tickets.
    pub bytes_wanted: u64,
    /// Sum of the bytes the callbacks answered they released.
    pub bytes_answered: u64,
    /// Tickets answered with zero (legal: invariant 5).
    pub zero_answers: u64,
    /// Callbacks that panicked (the panic is contained; the answer counts as zero).
    pub callback_panics: u64,
}

/// A pool's figures at one moment (see the module docs for exactness).
///
/// In a tree of pools, `used` (and `free`, `peak`) count everything charged
/// at this level: the pool's own charges and those of every pool below it.
/// The per-class figures (`reserved`, `leased`, `quarantined`, `classes`)
/// are the pool's own accounts only; `children_used` is the share of the
/// pools below, so `used == own + children_used` with `own` =
/// `reserved + leased + quarantined` ([`own_used`](Self::own_used)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PoolSnapshot {
    /// The pool's id.
    pub pool: PoolId,
    /// The pool's name, unique within its governor.
    pub name: Arc<str>,
    /// The pool above this one, if any.
    pub parent: Option<PoolId>,
    /// Its name.
    pub parent_name: Option<Arc<str>>,
    /// Ancestors above this pool (0: no parent).
    pub depth: usize,
    /// Bytes the pool may charge in all (an ancestor may bind first).
    pub capacity: u64,
    /// Bytes charged at this level: grants, leases and quarantine, its
    /// descendants' included. Exact.
    pub used: u64,
    /// `capacity - used`. Exact.
    pub free: u64,
    /// Highest `used` ever reached. Exact, except that a charge made at the
    /// very moment the capacity changes may record its peak with the
    /// capacity before or after the change (off by at most the change).
    pub peak: u64,
    /// Bytes held by live grants not yet committed: the sum of
    /// [`ClassStats::reserved`] over `classes` (this pool's own accounts).
    pub reserved: u64,
    /// Bytes charged to live leases, the sum over `classes`.
    pub leased: u64,
    /// Bytes quarantined, the sum over `classes`.
    pub quarantined: u64,
    /// Pools directly below this one, alive now.
    pub children: usize,
    /// Bytes charged through those pools (the sum of their `used`, each
    /// exact, read one after the other).
    pub children_used: u64,
    /// Per class, indexed by [`AllocationClass::index`]; all accounts of
    /// the pool (not those of the pools below). In JSON, an object keyed
    /// by class name.
    #[cfg_attr(feature = "serde", serde(serialize_with = "classes_by_name"))]
    pub classes: [ClassStats; AllocationClass::COUNT],
    /// Tickets this pool issued.
    pub pressure: PressureStats,
    /// Requests that waited for room (deadline given, holders could not make room).
    pub waits: u64,
    /// Of those, the ones whose deadline passed.
    pub wait_timeouts: u64,
    /// Holders registered now.
    pub holders: usize,
}

impl PoolSnapshot {
    /// Figures of one class.
    pub fn class(&self, class: AllocationClass) -> &ClassStats {
        &self.classes[class.index()]
    }

    /// Sum of every class.
    pub fn totals(&self) -> ClassStats {
        total(&self.classes)
    }

    /// Bytes charged by this pool's own accounts: `used - children_used`
    /// (clamped at zero while operations are in flight).
    pub fn own_used(&self) -> u64 {
        self.used.saturating_sub(self.children_used)
    }
}

impl fmt::Display for PoolSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} '{}': capacity {} B, used {} B (reserved {}, leased {}, quarantined {}), free {} B",
            self.pool,
            self.name,
            self.capacity,
            self.used,
            self.reserved,
            self.leased,
            self.quarantined,
            self.free
        )?;
        if self.children > 0 {
            write!(f, ", {} B of it through {} child pool(s)", self.children_used, self.children)?;
        }
        if let Some(parent) = &self.parent_name {
            write!(f, ", under '{parent}'")?;
        }
        Ok(())
    }
}

/// One holder's figures: what is charged to it and the tickets it received.
/// Kept after the holder unregisters, for as long as the pool lives.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HolderStats {
    /// The holder's id.
    pub holder: HolderId,
    /// The pool it was registered with.
    pub pool: PoolId,
    /// The name given at registration (for reports; not unique).
    pub name: Arc<str>,
    /// The priority given at registration: it is asked only by requests of
    /// at least this priority.
    pub priority: Priority,
    /// False once the registration was dropped.
    pub registered: bool,
    /// Per class, indexed by [`AllocationClass::index`].
    #[cfg_attr(feature = "serde", serde(serialize_with = "classes_by_name"))]
    pub classes: [ClassStats; AllocationClass::COUNT],
    /// Tickets received.
    pub pressure: PressureStats,
}

impl HolderStats {
    /// Figures of one class.
    pub fn class(&self, class: AllocationClass) -> &ClassStats {
        &self.classes[class.index()]
    }

    /// Sum of every class.
    pub fn totals(&self) -> ClassStats {
        total(&self.classes)
    }
}

/// Per-class figures in JSON (the `serde` feature) as `{"weights": {..},
/// "kv": {..}, ...}`: an object keyed by class name.
#[cfg(feature = "serde")]
fn classes_by_name<S: serde::Serializer>(
    classes: &[ClassStats; AllocationClass::COUNT],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(classes.len()))?;
    for (class, stats) in AllocationClass::ALL.iter().zip(classes) {
        m.serialize_entry(class.name(), stats)?;
    }
    m.end()
}

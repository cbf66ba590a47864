//! Governor errors.

use super::stats::PoolSnapshot;
use crate::ids::AllocationClass;
use crate::ids::{HolderId, PoolId};
use std::fmt;
use std::sync::Arc;

/// A request the pool could not grant: what was asked, where in the tree
/// of pools it was short, and the short pool's figures just after the
/// refusal. The snapshot and the path are boxed so that results stay small
/// on the fast path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfBudget {
    /// Bytes requested.
    pub requested: u64,
    /// Class of the request.
    pub class: AllocationClass,
    /// The requesting holder, if any.
    pub holder: Option<HolderId>,
    /// The figures of the pool that was short (the pool asked, or one of
    /// its ancestors; see [`path`](Self::path)) when the request was
    /// refused.
    pub snapshot: Box<PoolSnapshot>,
    /// The pools the charge had to fit in, and which one was short.
    pub path: Box<ChargePath>,
}

/// The pools a charge had to fit in: the pool asked first, then each
/// ancestor, the root last; and which one had no room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargePath {
    /// Ids and names, the pool asked first, the root last (one entry for a
    /// pool without a parent).
    pub pools: Vec<(PoolId, Arc<str>)>,
    /// Index in `pools` of the pool that was short (0: the pool asked).
    pub short: usize,
}

impl OutOfBudget {
    /// The pool the request was made on.
    pub fn requested_pool(&self) -> PoolId {
        self.path.pools[0].0
    }

    /// The pool that had no room (the snapshot's).
    pub fn short_pool(&self) -> PoolId {
        self.snapshot.pool
    }

    /// Levels above the pool asked of the pool that was short (0: the pool
    /// asked itself).
    pub fn short_level(&self) -> usize {
        self.path.short
    }
}

impl fmt::Display for OutOfBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "out of budget: {} B of {} requested", self.requested, self.class)?;
        if let Some(h) = self.holder {
            write!(f, " by {h}")?;
        }
        if self.path.pools.len() > 1 {
            let names: Vec<&str> = self.path.pools.iter().map(|(_, n)| &**n).collect();
            let short = names.get(self.path.short).copied().unwrap_or("?");
            write!(f, " in '{}' (within {}), short in '{short}'", names[0], names.join(" < "))?;
        }
        write!(f, "; {}", self.snapshot)
    }
}

impl std::error::Error for OutOfBudget {}

/// Everything the governor can refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GovernorError {
    /// Not enough room (after pressure tickets and waiting, where asked for).
    #[error(transparent)]
    OutOfBudget(#[from] OutOfBudget),
    /// The holder is not registered with this pool (never was, belongs to
    /// another pool, or its registration was dropped).
    #[error("{holder} is not registered with {pool}")]
    UnknownHolder {
        /// The pool asked.
        pool: PoolId,
        /// The holder named.
        holder: HolderId,
    },
    /// A lease given to a pool other than the one that granted it.
    #[error("the lease belongs to {lease_pool}, not to {pool}")]
    WrongPool {
        /// The pool the lease was given to.
        pool: PoolId,
        /// The pool that granted it (the only one that can end it).
        lease_pool: PoolId,
    },
    /// Releasing or quarantining more bytes than the lease holds: a bug in
    /// the caller, reported instead of letting a counter go negative.
    #[error("cannot take {requested} B from a lease of {held} B")]
    OverRelease {
        /// Bytes asked to be taken from the lease.
        requested: u64,
        /// Bytes the lease holds.
        held: u64,
    },
    /// Growing a lease with a grant of another class.
    #[error("cannot grow a {lease} lease with a {grant} grant")]
    ClassMismatch {
        /// The lease's class.
        lease: AllocationClass,
        /// The grant's class.
        grant: AllocationClass,
    },
    /// Growing a lease with a grant made for another holder.
    #[error("cannot grow a lease of {lease:?} with a grant of {grant:?}")]
    HolderMismatch {
        /// The lease's holder (`None`: the pool's anonymous account).
        lease: Option<HolderId>,
        /// The grant's holder.
        grant: Option<HolderId>,
    },
    /// A capacity the governor cannot represent.
    #[error("capacity {capacity} B exceeds the maximum of {max} B")]
    CapacityTooLarge {
        /// The capacity asked, in bytes.
        capacity: u64,
        /// The largest capacity a pool can have, in bytes
        /// ([`MAX_CAPACITY`](super::MAX_CAPACITY)).
        max: u64,
    },
    /// A pool name already taken in this governor.
    #[error("a pool named '{name}' already exists")]
    DuplicatePool {
        /// The name asked.
        name: String,
    },
    /// A parent pool this governor does not have.
    #[error("{pool} is not a pool of this governor")]
    UnknownPool {
        /// The parent named.
        pool: PoolId,
    },
    /// A capacity lowered below the bytes live in the pool (its
    /// descendants' included), still too many after pressure tickets: the
    /// capacity stays as it was.
    #[error(
        "cannot lower the capacity of pool '{pool}' to {requested} B: {live} B are live \
         (the capacity stays {capacity} B)"
    )]
    CapacityBelowLive {
        /// The pool's name.
        pool: Arc<str>,
        /// The capacity asked, in bytes.
        requested: u64,
        /// Bytes still charged at the pool's level when it gave up.
        live: u64,
        /// The capacity it keeps, in bytes.
        capacity: u64,
    },
}

impl GovernorError {
    /// The refusal, when the error is one.
    pub fn out_of_budget(&self) -> Option<&OutOfBudget> {
        match self {
            GovernorError::OutOfBudget(o) => Some(o),
            _ => None,
        }
    }
}

/// An operation that consumes a token (a [`Lease`](super::Lease) or a
/// [`Grant`](super::Grant)) and failed: the token comes back
/// unchanged, so nothing is refunded or leaked by the failure.
pub struct Rejected<T> {
    /// The token, as it was.
    pub value: T,
    /// Why.
    pub error: GovernorError,
}

impl<T> Rejected<T> {
    /// The token back.
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T: fmt::Debug> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected").field("value", &self.value).field("error", &self.error).finish()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T: fmt::Debug> std::error::Error for Rejected<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

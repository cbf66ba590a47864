//! Identities and priorities.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// Source of every pool and holder identity in the process: never reused,
/// so a stale id can be told from a live one. (Plain `std` atomic even under
/// loom: id allocation is not part of any protocol the loom tests check.)
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_uid() -> NonZeroU64 {
    let v = NEXT_UID.fetch_add(1, Ordering::Relaxed);
    // 2^64 ids would take centuries to exhaust; fail loudly rather than wrap.
    NonZeroU64::new(v).expect("governor id space exhausted")
}

/// Identity of a pool (`governor::Pool`), unique in the process and never
/// reused. Thread-safety: a plain `Copy` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
pub struct PoolId(pub(crate) NonZeroU64);

impl PoolId {
    /// The raw value (for logs and the C API).
    pub const fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pool#{}", self.0)
    }
}

/// Identity of a registered holder, unique in the process and never
/// reused. A holder belongs to exactly one pool. Thread-safety: a plain
/// `Copy` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
pub struct HolderId(pub(crate) NonZeroU64);

impl HolderId {
    /// The raw value (for logs and the C API).
    pub const fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "holder#{}", self.0)
    }
}

/// How important a holder's bytes are: higher is more important.
///
/// A request made on behalf of a holder may send pressure tickets only to
/// holders whose priority is lower than or equal to its own; a request made
/// on behalf of no holder counts as [`Priority::HIGHEST`]. Thread-safety: a
/// plain `Copy` value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
pub struct Priority(pub u32);

impl Priority {
    /// Asked first, asks nobody but its equals.
    pub const LOWEST: Priority = Priority(0);
    /// May ask every holder.
    pub const HIGHEST: Priority = Priority(u32::MAX);
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

//! Process-wide counts of plugin misbehaviours the host survived without
//! trusting the plugin (issue 28): a sink written after its call, a
//! message length running past readable memory, a block whose size is not
//! the one asked, a descriptor that is not what it claims. Each is counted
//! where it is refused (a cold path: one relaxed add), and reported in
//! every manager's statistics ([`PluginFaults`], `plugin_faults` in JSON).
//! Process-wide because a late sink write can no longer be told apart by
//! mechanism; the refusals themselves name their mechanism and slot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(crate) static LATE_SINK_WRITES: AtomicU64 = AtomicU64::new(0);
pub(crate) static UNREADABLE_MESSAGES: AtomicU64 = AtomicU64::new(0);
pub(crate) static REFUSED_BLOCK_SIZES: AtomicU64 = AtomicU64::new(0);
pub(crate) static REFUSED_DESCRIPTORS: AtomicU64 = AtomicU64::new(0);

/// The counts at one moment (each exact; they only rise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PluginFaults {
    /// Writes into a message sink after the call it was given to returned
    /// (or with a `ctx` no call of this host gave out): dropped.
    pub late_sink_writes: u64,
    /// Plugin messages (and loss reasons) whose length ran past readable
    /// memory: kept up to the first unreadable byte.
    pub unreadable_messages: u64,
    /// Blocks, reservations and physical objects refused because their
    /// size was less than asked or more than the published rounding allows.
    pub refused_block_sizes: u64,
    /// Descriptors a plugin handed over (an export) that were refused: not
    /// new, not open, a standard stream, or not of the kind claimed.
    pub refused_descriptors: u64,
}

impl PluginFaults {
    /// The counts now.
    pub fn now() -> PluginFaults {
        PluginFaults {
            late_sink_writes: LATE_SINK_WRITES.load(Relaxed),
            unreadable_messages: UNREADABLE_MESSAGES.load(Relaxed),
            refused_block_sizes: REFUSED_BLOCK_SIZES.load(Relaxed),
            refused_descriptors: REFUSED_DESCRIPTORS.load(Relaxed),
        }
    }
}

/// The counts now (see [`PluginFaults`]).
pub fn plugin_faults() -> PluginFaults {
    PluginFaults::now()
}

#[cold]
pub(crate) fn count(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Relaxed) + 1
}

//! [`StatsReport`]: every figure a manager keeps, gathered in one value
//! that tools can read — as JSON (`to_json`, the `serde` feature) or as
//! Prometheus text ([`to_prometheus`](super::to_prometheus)).

use crate::deferred::QueueStats;
use crate::governor::{Governor, HolderStats, Pool, PoolSnapshot};
use crate::registry::Registry;

/// The version of the report's layout (its JSON `schema_version`). Raised
/// when a field is renamed, removed or changes meaning; adding a field
/// does not raise it.
pub const SCHEMA_VERSION: u32 = 1;

/// Every figure at one moment (each part as exact as its source says:
/// see [`governor::stats`](crate::governor::stats)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StatsReport {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Every pool, in creation order.
    pub pools: Vec<PoolReport>,
    /// The deferred-free queue (absent in a report of one pool).
    pub queue: Option<QueueStats>,
    /// Every registered context, in registration order (empty in a report
    /// of one pool).
    pub contexts: Vec<ContextReport>,
    /// Plugin misbehaviours the host survived, counted for the whole
    /// process (absent in a report of one pool; see
    /// [`PluginFaults`](crate::faults::PluginFaults)).
    pub plugin_faults: Option<crate::faults::PluginFaults>,
}

/// One pool: its snapshot and every holder it ever had.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PoolReport {
    /// The pool's figures (in JSON, the pool object's own fields).
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub snapshot: PoolSnapshot,
    /// In registration order, registered or not. In JSON `holder_stats`
    /// (the snapshot's `holders` is the count registered now).
    #[cfg_attr(feature = "serde", serde(rename = "holder_stats"))]
    pub holders: Vec<HolderStats>,
}

/// One context: its life and what pins it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ContextReport {
    /// `plugin/mechanism`.
    pub context: String,
    /// `active`, `retiring`, `lost` or `terminated`.
    pub state: String,
    /// Why it left `active`, if it did.
    pub reason: Option<String>,
    /// Objects of its mechanism alive now.
    pub pins: u64,
    /// Calls into the plugin in flight now.
    pub calls_in_flight: u64,
}

impl PoolReport {
    /// `pool`'s snapshot and holders now.
    pub fn of(pool: &Pool) -> PoolReport {
        PoolReport { snapshot: pool.snapshot(), holders: pool.holders() }
    }
}

impl StatsReport {
    /// One pool alone.
    pub fn of_pool(pool: &Pool) -> StatsReport {
        StatsReport {
            schema_version: SCHEMA_VERSION,
            pools: vec![PoolReport::of(pool)],
            queue: None,
            contexts: Vec::new(),
            plugin_faults: None,
        }
    }

    /// Every pool of `governor`, the queue's counters and every context of
    /// `registry`.
    pub(crate) fn gather(governor: &Governor, queue: QueueStats, registry: &Registry) -> StatsReport {
        StatsReport {
            schema_version: SCHEMA_VERSION,
            pools: governor.pools().iter().map(|p| PoolReport::of(p)).collect(),
            queue: Some(queue),
            contexts: registry
                .sweep()
                .iter()
                .map(|c| ContextReport {
                    context: c.label().into(),
                    state: c.state().to_string(),
                    reason: c.reason(),
                    pins: c.pins(),
                    calls_in_flight: c.calls_in_flight(),
                })
                .collect(),
            plugin_faults: Some(crate::faults::PluginFaults::now()),
        }
    }
}

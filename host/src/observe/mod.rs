//! Observability: statistics tools can read, events, and a log hook for
//! plugin messages.
//!
//! * [`StatsReport`] — every figure of a manager (pools, holders, the
//!   deferred-free queue, contexts) at one moment, with a
//!   [`SCHEMA_VERSION`]. As JSON with the `serde` feature (`to_json`), as
//!   Prometheus text always ([`to_prometheus`]). The names are documented
//!   in `docs/statistics.md`.
//! * [`Event`] — grants, OutOfBudget refusals, pressure tickets,
//!   evictions, quarantines, retired frees and context losses, delivered
//!   synchronously to the manager's [`Hub`] listener and, with the
//!   `tracing` feature, to `tracing`.
//! * Plugin messages — what a plugin writes into a call's message sink,
//!   and why a context was lost — go to the hub's log hook (and
//!   `tracing`), with a [`Level`] and their source.
//!
//! This module is what reads every layer (registry, deferred-free queue,
//! governor) and stands above them all; what every layer emits — the
//! events and the hub — lives below them in `crate::events`, and is named
//! here too, so users keep one path (`memplug_host::observe::...`). What
//! events cost is said there.

#[cfg(feature = "serde")]
mod json;
mod prometheus;
mod report;

pub use crate::events::{Event, EventKind, EventListener, Hub, Level, LogHook};
#[cfg(feature = "serde")]
pub use json::{to_json, to_json_pretty};
pub use prometheus::to_prometheus;
pub use report::{ContextReport, PoolReport, StatsReport, SCHEMA_VERSION};

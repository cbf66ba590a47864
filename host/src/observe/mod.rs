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
//! What it costs: a fast-path grant checks one process-wide word before
//! it builds an event (see `hub.rs`); nothing else on any hot path checks
//! anything, but a call whose plugin wrote a message on success (one test
//! of the capture on the stack). Grant events therefore exist only while a
//! listener is set (or, with `tracing`, while a subscriber takes `debug`
//! events of `memplug::event`).

mod event;
mod hub;
#[cfg(feature = "serde")]
pub(crate) mod json;
mod prometheus;
mod report;
mod trace;

pub use event::{Event, EventKind, Level};
pub(crate) use hub::{events_wanted, plugin_message, HubLink};
pub use hub::{EventListener, Hub, LogHook};
#[cfg(feature = "serde")]
pub use json::{to_json, to_json_pretty};
pub use prometheus::to_prometheus;
pub use report::{ContextReport, PoolReport, StatsReport, SCHEMA_VERSION};

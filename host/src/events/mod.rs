//! What every layer emits: [`Event`]s of the books and plugin messages,
//! delivered through a manager's [`Hub`] (and, with the `tracing`
//! feature, to `tracing`).
//!
//! It sits below everything that emits — the governor, the mechanism
//! call, the plugin loader, the deferred-free queue, contexts — and reads
//! none of them: an event carries only the keys of `crate::ids`. What
//! reads every layer (the statistics report and its JSON and Prometheus
//! forms) is `crate::observe`, which also names these items for users
//! (`memplug_host::observe::{Event, Hub, ...}`).
//!
//! What it costs: a fast-path grant checks one process-wide word before
//! it builds an event (see `hub.rs`); nothing else on any hot path checks
//! anything, but a call whose plugin wrote a message on success (one test
//! of the capture on the stack). Grant events therefore exist only while a
//! listener is set (or, with `tracing`, while a subscriber takes `debug`
//! events of `memplug::event`).

mod event;
mod hub;
mod trace;

pub use event::{Event, EventKind, Level};
pub(crate) use hub::{events_wanted, plugin_message, HubLink};
pub use hub::{EventListener, Hub, LogHook};

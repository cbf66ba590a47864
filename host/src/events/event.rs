//! What the host tells listeners: one [`Event`] per thing that happened to
//! the books, and the [`Level`] of a plugin's message.

use crate::ids::{AllocationClass, HolderId, PoolId};
use std::fmt;

/// What happened. Numbers are part of the C API (`MEMPLUG_HOST_EVENT_*`):
/// never renumbered; later kinds are appended.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A grant was made: `bytes` charged to `pool` for `holder`, `class`.
    /// The one event of the governor's fast path (see the module docs).
    Grant = 1,
    /// A request of `bytes` was refused: `pool` is the pool asked,
    /// `detail` the name of the pool that was short (it or an ancestor).
    OutOfBudget = 2,
    /// A pressure ticket is about to be delivered: `pool` is the short
    /// pool, `holder` the recipient, `bytes` the bytes wanted, `class` the
    /// request's class.
    PressureTicket = 3,
    /// A ticket was answered with bytes released: `bytes` is the answer
    /// (untrusted: only actual releases refund); fields as for the ticket.
    Eviction = 4,
    /// A lease (or part of one) was quarantined: `bytes` stay charged for
    /// good (a free the plugin could not complete).
    Quarantine = 5,
    /// A free made through the deferred-free queue was retired (the
    /// mechanism freed it once its fences completed, and the charge was
    /// refunded): `bytes` freed; pool, holder and class when the freed
    /// object says whom it was charged to.
    Retired = 6,
    /// A context was lost: one event per binding that held something
    /// (`pool`, `holder`, `class`, `bytes` charged, `count` objects), or
    /// one without a pool when none did. `detail` is the context
    /// (`plugin/mechanism`).
    ContextLost = 7,
}

impl EventKind {
    /// Every kind, in number order.
    pub const ALL: [EventKind; 7] = [
        EventKind::Grant,
        EventKind::OutOfBudget,
        EventKind::PressureTicket,
        EventKind::Eviction,
        EventKind::Quarantine,
        EventKind::Retired,
        EventKind::ContextLost,
    ];

    /// Stable lower-case name: `grant`, `out_of_budget`, `pressure_ticket`,
    /// `eviction`, `quarantine`, `retired`, `context_lost`.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::Grant => "grant",
            EventKind::OutOfBudget => "out_of_budget",
            EventKind::PressureTicket => "pressure_ticket",
            EventKind::Eviction => "eviction",
            EventKind::Quarantine => "quarantine",
            EventKind::Retired => "retired",
            EventKind::ContextLost => "context_lost",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One event, valid for the listener's call (the strings are borrowed).
/// Fields a kind does not have are `None` or zero; see [`EventKind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    /// What happened.
    pub kind: EventKind,
    /// The pool it happened in, if any.
    pub pool: Option<PoolId>,
    /// That pool's name.
    pub pool_name: Option<&'a str>,
    /// `None`: the pool's anonymous account (or no holder involved).
    pub holder: Option<HolderId>,
    /// The class charged (of the request, for tickets and evictions).
    pub class: Option<AllocationClass>,
    /// The bytes the event is about (see [`EventKind`]).
    pub bytes: u64,
    /// Objects involved (1 but for a context loss: the binding's objects).
    pub count: u64,
    /// The short pool (OutOfBudget), the context (ContextLost).
    pub detail: Option<&'a str>,
}

impl<'a> Event<'a> {
    /// An event of `kind` about `bytes` in `pool`, one object, nothing else.
    pub(crate) fn new(kind: EventKind, pool: PoolId, pool_name: &'a str, bytes: u64) -> Self {
        Event { pool: Some(pool), pool_name: Some(pool_name), ..Self::new_bare(kind, bytes) }
    }

    /// An event of `kind` about `bytes`, one object, no pool.
    pub(crate) fn new_bare(kind: EventKind, bytes: u64) -> Self {
        Event { kind, pool: None, pool_name: None, holder: None, class: None, bytes, count: 1, detail: None }
    }

    pub(crate) fn holder(mut self, holder: Option<HolderId>) -> Self {
        self.holder = holder;
        self
    }

    pub(crate) fn class(mut self, class: AllocationClass) -> Self {
        self.class = Some(class);
        self
    }

    pub(crate) fn detail(mut self, detail: &'a str) -> Self {
        self.detail = Some(detail);
        self
    }
}

/// How much a plugin's message matters. Numbers are part of the C API
/// (`MEMPLUG_HOST_LOG_*`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The context was lost; the message is why.
    Error = 1,
    /// A call failed; the message is the plugin's explanation (also in
    /// the call's error).
    Warn = 2,
    /// The plugin wrote a message during a call that succeeded.
    Info = 3,
}

impl Level {
    /// Stable lower-case name: `error`, `warn`, `info`.
    pub const fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

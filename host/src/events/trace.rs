//! Events and plugin messages through `tracing` (the `tracing` feature):
//! events under target `memplug::event` — grants and retirements at
//! `debug`, the others at `info` — with the event's fields; plugin
//! messages under target `memplug::plugin` at their level. Without the
//! feature every function here is empty.

use super::event::{Event, Level};

#[cfg(feature = "tracing")]
mod on {
    use super::super::event::EventKind;
    use super::*;

    /// Whether a subscriber would take a `debug` event (a fast-path grant).
    #[inline(always)]
    pub(crate) fn events_enabled() -> bool {
        tracing::enabled!(target: "memplug::event", tracing::Level::DEBUG)
    }

    pub(crate) fn event(e: &Event<'_>) {
        macro_rules! emit {
            ($level:expr) => {
                tracing::event!(
                    target: "memplug::event",
                    $level,
                    kind = e.kind.name(),
                    pool = e.pool.map(|p| p.get()),
                    pool_name = e.pool_name,
                    holder = e.holder.map(|h| h.get()),
                    class = e.class.map(|c| c.name()),
                    bytes = e.bytes,
                    count = e.count,
                    detail = e.detail,
                )
            };
        }
        match e.kind {
            EventKind::Grant | EventKind::Retired => emit!(tracing::Level::DEBUG),
            _ => emit!(tracing::Level::INFO),
        }
    }

    pub(crate) fn message(level: Level, source: &str, message: &str) {
        match level {
            Level::Error => tracing::error!(target: "memplug::plugin", source, "{message}"),
            Level::Warn => tracing::warn!(target: "memplug::plugin", source, "{message}"),
            Level::Info => tracing::info!(target: "memplug::plugin", source, "{message}"),
        }
    }
}

#[cfg(not(feature = "tracing"))]
mod on {
    use super::*;

    #[inline(always)]
    pub(crate) fn events_enabled() -> bool {
        false
    }

    #[inline(always)]
    pub(crate) fn event(_: &Event<'_>) {}

    #[inline(always)]
    pub(crate) fn message(_: Level, _: &str, _: &str) {}
}

pub(crate) use on::{event, events_enabled, message};

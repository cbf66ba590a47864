//! The demo's record of what happened: the timeline of events (with the
//! pool's `used` after each) and the checks the story makes. Both the story
//! and the measurements write here; the report reads it.

use super::{lock, mib};
use memplug_host::governor::{HolderId, Pool, PressureTicket, Priority};
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One line of the timeline.
#[derive(Serialize, Clone)]
pub(super) struct Event {
    pub(super) t_ms: f64,
    /// `setup`, `load`, `prefix`, `admit`, `grow`, `ticket`, `evict`,
    /// `out_of_budget`, `rollback`, `release`, `poll`, `fence`, `retired`,
    /// `finish`; the device loss's `lost`, `refused`, `told`, `settled`,
    /// `terminated`, `inert`, `unregister`, `replacement`, `resume`; then
    /// `teardown`, `drain`, `unload`, and `measure` throughout.
    pub(super) kind: &'static str,
    /// Who: a request (`r1`..), a holder, the queue, the plugin.
    pub(super) subject: String,
    pub(super) detail: String,
    /// The pool's `used` right after the event.
    pub(super) pool_used: u64,
}

#[derive(Serialize)]
pub(super) struct Check {
    pub(super) name: &'static str,
    pub(super) ok: bool,
    pub(super) detail: String,
}

pub(super) struct Recorder {
    start: Instant,
    pool: Arc<Pool>,
    events: Mutex<Vec<Event>>,
    holders: Mutex<Vec<(HolderId, &'static str)>>,
}

impl Recorder {
    /// A timeline that starts at `start` and notes `pool`'s `used` after
    /// each event.
    pub(super) fn new(start: Instant, pool: Arc<Pool>) -> Recorder {
        Recorder { start, pool, events: Mutex::default(), holders: Mutex::default() }
    }

    /// Names the holders tickets mention.
    pub(super) fn name_holders(&self, names: impl IntoIterator<Item = (HolderId, &'static str)>) {
        lock(&self.holders).extend(names);
    }

    /// The events so far.
    pub(super) fn timeline(&self) -> Vec<Event> {
        lock(&self.events).clone()
    }

    pub(super) fn log(&self, kind: &'static str, subject: impl Into<String>, detail: impl Into<String>) {
        let e = Event {
            t_ms: (self.start.elapsed().as_secs_f64() * 1e4).round() / 10.0,
            kind,
            subject: subject.into(),
            detail: detail.into(),
            pool_used: self.pool.used(),
        };
        lock(&self.events).push(e);
    }

    pub(super) fn holder_name(&self, h: Option<HolderId>) -> String {
        match h {
            None => "the scheduler".into(),
            Some(h) => lock(&self.holders)
                .iter()
                .find(|(id, _)| *id == h)
                .map_or_else(|| h.to_string(), |(_, n)| (*n).to_string()),
        }
    }

    pub(super) fn ticket_text(&self, t: &PressureTicket) -> String {
        let priority =
            if t.priority == Priority::HIGHEST { "highest".to_string() } else { t.priority.to_string() };
        let no_holder = if t.requester.is_none() { "no holder, " } else { "" };
        format!(
            "{} wanted by {} ({no_holder}class {}, priority {priority})",
            mib(t.bytes_wanted),
            self.holder_name(t.requester),
            t.class
        )
    }
}

#[derive(Default)]
pub(super) struct Checks(pub(super) Vec<Check>);

impl Checks {
    pub(super) fn add(&mut self, name: &'static str, ok: bool, detail: impl Into<String>) {
        self.0.push(Check { name, ok, detail: detail.into() });
    }
}

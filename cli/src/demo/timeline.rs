//! The demo's record of what happened: the scenes of the story, the
//! timeline of events (with the pool's use after each, in all and per
//! allocation class) and the checks the story makes. Both the story and
//! the measurements write here; the report, the chart and the trace read
//! it.

use super::{lock, mib};
use memplug_host::governor::{AllocationClass, HolderId, Pool, PressureTicket, Priority};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The story's scenes, in order: `(id, title)`. The steps of the module
/// comment of [`super`], one scene each.
pub(super) const SCENES: [(&str, &str); 10] = [
    ("setup", "pool, holders and bindings"),
    ("weights", "weights load"),
    ("requests", "shared prefix and requests admitted"),
    ("decode", "decode under pressure: tickets and evictions"),
    ("fence", "a free ordered behind a fence"),
    ("out_of_budget", "OutOfBudget rolls back, a smaller retry"),
    ("offload", "a shard offloaded under pressure, restored at its address"),
    ("copy_on_write", "a request diverges inside the last block of the prompt"),
    ("device_loss", "the device lost mid-decode, a replacement"),
    ("teardown", "teardown, drain, ledger and unload"),
];

/// The step of scene `id` (from 1), as the report and the chart number it.
pub(super) fn step(id: &str) -> usize {
    SCENES.iter().position(|(s, _)| *s == id).map_or(0, |p| p + 1)
}

/// Every kind of timeline event, in the order `docs/cli.md` lists them:
/// [`Recorder::log`] takes no other (a debug build asserts it), and a test
/// compares this list with the page.
pub(super) const EVENT_KINDS: [&str; 31] = [
    "setup",
    "load",
    "prefix",
    "admit",
    "grow",
    "ticket",
    "evict",
    "out_of_budget",
    "rollback",
    "release",
    "poll",
    "fence",
    "retired",
    "finish",
    // the offload and copy-on-write scenes
    "offload",
    "restore",
    "prefill",
    "privatise",
    // the device loss
    "lost",
    "refused",
    "told",
    "settled",
    "terminated",
    "inert",
    "unregister",
    "replacement",
    "resume",
    // the end, and throughout
    "teardown",
    "drain",
    "unload",
    "measure",
];

/// One scene as it ran.
#[derive(Serialize, Clone)]
pub(super) struct Scene {
    /// Its place in the story, from 1.
    pub(super) step: usize,
    /// One of [`SCENES`]' ids.
    pub(super) id: &'static str,
    pub(super) title: &'static str,
    pub(super) start_ms: f64,
    /// The next scene's start; the last event's time for the last scene.
    pub(super) end_ms: f64,
    /// Events logged during it.
    pub(super) events: usize,
}

/// One line of the timeline.
#[derive(Serialize, Clone)]
pub(super) struct Event {
    pub(super) t_ms: f64,
    /// One of [`EVENT_KINDS`].
    pub(super) kind: &'static str,
    /// Who: a request (`r1`..), a holder, the queue, the plugin.
    pub(super) subject: String,
    pub(super) detail: String,
    /// The scene it belongs to (a [`SCENES`] id).
    pub(super) scene: &'static str,
    /// The pool's `used` right after the event.
    pub(super) pool_used: u64,
    /// What each allocation class is charged right after the event
    /// (reserved + leased + quarantined), by class name: they add up to
    /// `pool_used`.
    pub(super) class_used: BTreeMap<&'static str, u64>,
}

#[derive(Serialize)]
pub(super) struct Check {
    pub(super) name: &'static str,
    /// Passed, or skipped: nothing failed.
    pub(super) ok: bool,
    /// Not run here (its detail says why): counted apart from the passes.
    pub(super) skipped: bool,
    pub(super) detail: String,
}

pub(super) struct Recorder {
    start: Instant,
    pool: Arc<Pool>,
    events: Mutex<Vec<Event>>,
    holders: Mutex<Vec<(HolderId, &'static str)>>,
    /// The scenes entered so far, with their start (ms).
    scenes: Mutex<Vec<(&'static str, f64)>>,
}

impl Recorder {
    /// A timeline that starts at `start` and notes `pool`'s `used` after
    /// each event.
    pub(super) fn new(start: Instant, pool: Arc<Pool>) -> Recorder {
        Recorder {
            start,
            pool,
            events: Mutex::default(),
            holders: Mutex::default(),
            scenes: Mutex::default(),
        }
    }

    fn now_ms(&self) -> f64 {
        (self.start.elapsed().as_secs_f64() * 1e4).round() / 10.0
    }

    /// Enters scene `id` (one of [`SCENES`]): the events logged from now
    /// on belong to it.
    pub(super) fn scene(&self, id: &'static str) {
        debug_assert!(SCENES.iter().any(|(s, _)| *s == id), "unknown scene {id}");
        let t = self.now_ms();
        lock(&self.scenes).push((id, t));
    }

    /// The scenes entered, in order, each ending where the next starts.
    pub(super) fn scenes(&self) -> Vec<Scene> {
        let entered = lock(&self.scenes).clone();
        let events = lock(&self.events);
        let last = events.last().map_or(0.0, |e| e.t_ms);
        entered
            .iter()
            .enumerate()
            .map(|(i, &(id, start_ms))| Scene {
                step: step(id),
                id,
                title: SCENES.iter().find(|(s, _)| *s == id).map_or("", |(_, t)| t),
                start_ms,
                end_ms: entered.get(i + 1).map_or(last.max(start_ms), |n| n.1),
                events: events.iter().filter(|e| e.scene == id).count(),
            })
            .collect()
    }

    /// Names the holders tickets mention.
    pub(super) fn name_holders(&self, names: impl IntoIterator<Item = (HolderId, &'static str)>) {
        lock(&self.holders).extend(names);
    }

    /// The events so far.
    pub(super) fn timeline(&self) -> Vec<Event> {
        lock(&self.events).clone()
    }

    /// Logs an event; returns its time (ms since the start).
    pub(super) fn log(
        &self,
        kind: &'static str,
        subject: impl Into<String>,
        detail: impl Into<String>,
    ) -> f64 {
        debug_assert!(EVENT_KINDS.contains(&kind), "event kind {kind} is not in EVENT_KINDS");
        let snap = self.pool.snapshot();
        let t_ms = self.now_ms();
        let e = Event {
            t_ms,
            kind,
            subject: subject.into(),
            detail: detail.into(),
            scene: lock(&self.scenes).last().map_or("", |s| s.0),
            pool_used: snap.used,
            class_used: AllocationClass::ALL.iter().map(|&c| (c.name(), snap.class(c).charged())).collect(),
        };
        lock(&self.events).push(e);
        t_ms
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
        self.0.push(Check { name, ok, skipped: false, detail: detail.into() });
    }
    /// A check that could not run here: reported and counted as skipped
    /// (never as a pass), with why.
    pub(super) fn skip(&mut self, name: &'static str, why: impl std::fmt::Display) {
        self.0.push(Check { name, ok: true, skipped: true, detail: format!("skipped: {why}") });
    }
}

/// The lists `docs/cli.md` gives are these: scene ids in order, the event
/// kinds, and the device loss's step.
#[cfg(test)]
mod docs_agree {
    use super::{step, EVENT_KINDS, SCENES};

    fn page() -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// The backquoted words of the page from `start` to the first `end`.
    fn quoted_after(page: &str, start: &str, end: &str) -> Vec<String> {
        let from = page.find(start).unwrap_or_else(|| panic!("docs/cli.md has no {start:?}")) + start.len();
        let text = &page[from..from + page[from..].find(end).expect("the end of the list")];
        text.split('`').skip(1).step_by(2).map(str::to_string).collect()
    }

    #[test]
    fn the_scene_ids_are_the_code_s_in_order() {
        let ids = quoted_after(&page(), "The ids: ", "|");
        let code: Vec<&str> = SCENES.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, code, "docs/cli.md's scene ids (the `scenes` row) differ from SCENES");
    }

    #[test]
    fn the_event_kinds_are_the_code_s() {
        let listed = quoted_after(&page(), "Event kinds: ", "throughout.");
        assert_eq!(listed, EVENT_KINDS, "docs/cli.md's event kinds differ from EVENT_KINDS");
    }

    #[test]
    fn the_device_loss_step_is_the_code_s() {
        let want = format!("the device-loss scene (step {})", step("device_loss"));
        assert!(page().contains(&want), "docs/cli.md does not say {want:?}");
    }
}

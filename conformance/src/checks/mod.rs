//! The run, each check in a process of its own.
//!
//! # How a run goes
//!
//! The kit's side ([`run`]) never loads the plugin and never calls it. For
//! the check at position `k` of the run it forks a child
//! ([`crate::os::supervise`]), which opens the plugin itself and runs the
//! whole sequence ([`orchestrate`]: load, negotiate, read the descriptor,
//! then every check in the order of [`crate::CHECKS`]) through a
//! [`Results`] aimed at position `k`:
//!
//! * a check before `k` is not run again: it answers how it ended when it
//!   ran ([`Results::run`] returns that), except the checks of
//!   [`REPLAYED`], whose bodies build what later checks stand on (the
//!   negotiated descriptor, the validated plugin view, the vtables, the
//!   properties): they run again, with the log muted;
//! * check `k` runs: the child tells the kit it starts, then its verdict,
//!   what it logged, and the plugin's live-object count around it;
//! * a check after `k` does not run (it returns false, and the sequence
//!   winds down).
//!
//! The kit reads the child's messages, records the result (a child that
//! dies or goes quiet is the check crashing or timing out), and forks the
//! next one; the first child that finds no check at its position ends the
//! run. What a check learns for later checks reaches them through the
//! fork: the kit's record (every outcome so far, the merged log of
//! messages and outputs the `messages.*` and `structs.*` checks judge, the
//! [`MechState`] each mechanism's checks have built, and the live objects
//! a check left behind) is in the kit's memory when it forks, so every
//! child starts with it. A [`MechState`] goes back to the kit at the
//! [`Results::share`] points between a mechanism's groups of checks.
//!
//! A check body therefore runs in its child alone: what it writes into
//! the variables it captures is lost when it ends, unless the check is in
//! [`REPLAYED`] or the variable is the [`MechState`].
//!
//! # Why fork, and why the child opens the plugin
//!
//! The checks start threads (the `concurrency.*` storms, watchdogs, the
//! plugin's own stream workers), and a fork copies only the forking
//! thread: forked from a process where they ran, a child would find locks
//! held forever and workers gone. So the fork is made where nothing of the
//! plugin or the checks ever ran: the kit's side starts no thread, loads
//! no plugin, and waits for its children with `poll`. Each child opens the
//! plugin after the fork, so the plugin's initialisers, threads and state
//! are the child's own, exactly as in a freshly started host, and a wild
//! pointer in the plugin can only kill that child. Re-executing the kit
//! would give the same isolation, but needs the embedding program's
//! co-operation (a library cannot re-exec its caller) and costs a process
//! start per check; a child, fork, plugin load and set-up included, costs
//! a few milliseconds. A side effect: no check sees what an earlier one
//! did to the plugin's state, only what the kit recorded of it.

mod allocator;
mod child;
mod claims_pinned;
mod concurrency;
mod copy;
mod descriptor;
mod descriptor_claims;
pub(crate) mod fresh;
mod host_fns;
mod identity_stable;
mod imports;
mod loss;
mod loss_host_fns;
mod loss_minor;
mod messages;
mod negotiation;
mod ordering;
mod queued_release;
mod shared_mapping;
mod stalls;
mod sync;
mod tracked;
mod typed_export;
mod virtual_backing;

use child::child_main;
pub(crate) use child::{open, Results};
pub(crate) use host_fns::{bounded, enqueue_job, Gate, Job};
pub(crate) use tracked::Scope;

use crate::os::{self, ChildEnd, Supervised};
use crate::raw::{Made, Mech};
use crate::services::KitServices;
use crate::sink::{Entries, Log, Write};
use crate::{
    printable, printable_text, CheckResult, Error, MechanismSummary, Options, Outcome, Report, CHECKS,
};
use core::ffi::c_void;
use memplug_sdk::abi::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How a check stops early.
#[derive(Debug)]
pub(crate) enum Verdict {
    Fail(String),
    Skip(String),
}

/// A check's result: `Ok(detail)` passes.
pub(crate) type Checked = Result<String, Verdict>;

/// The body of a per-mechanism check.
pub(crate) type CheckFn = fn(&Ctx, &Mech) -> Checked;

macro_rules! fail {
    ($($t:tt)*) => {
        return Err($crate::checks::Verdict::Fail(format!($($t)*)))
    };
}

macro_rules! skip {
    ($($t:tt)*) => {
        return Err($crate::checks::Verdict::Skip(format!($($t)*)))
    };
}

macro_rules! ensure {
    ($c:expr, $($t:tt)*) => {
        if !($c) {
            return Err($crate::checks::Verdict::Fail(format!($($t)*)));
        }
    };
}

pub(crate) use {ensure, fail, skip};

/// Fails unless `got` is one of `want`.
pub(crate) fn expect(got: MemplugStatus, want: &[MemplugStatus], what: &str) -> Result<(), Verdict> {
    if want.contains(&got) {
        return Ok(());
    }
    let names: Vec<String> = want.iter().map(|&s| crate::raw::status_name(s)).collect();
    fail!("{what}: got {}, expected {}", crate::raw::status_name(got), names.join(" or "))
}

/// Fails unless the plugin's live-object count is `want`.
pub(crate) fn expect_live(m: &Mech, want: u64, what: &str) -> Result<(), Verdict> {
    let got = m.live();
    ensure!(got == want, "{what}: live_objects is {got}, expected {want}");
    Ok(())
}

/// What every check can reach.
pub(crate) struct Ctx {
    pub log: Arc<Log>,
    pub opts: Options,
    pub entry: MemplugEntryV1,
    /// The plugin file as this process opened it (`/proc/self/fd/4`);
    /// `None` for a plugin linked into the kit's caller
    /// ([`crate::run_linked_streaming`]).
    pub path: Option<std::path::PathBuf>,
    /// The services table of the ordinary negotiation
    /// (`negotiation.accepts_host`, a 1.2 host).
    pub services: &'static KitServices,
}

/// Checks whose bodies build what the checks after them use; every child
/// runs them again (quietly) on its way to its own check, unless they
/// crashed or timed out.
const REPLAYED: &[&str] =
    &["negotiation.accepts_host", "descriptor.plugin", "descriptor.vtables", "descriptor.properties"];

/// The checks without which no mechanism can be checked: when the run
/// does not get past them, the kit could not run on the plugin at all.
const GATES: &[&str] = &["load.open", "load.entry_symbol", "negotiation.accepts_host", "descriptor.plugin"];

/// What the per-mechanism checks learn that later checks use. Each check
/// runs in its own process: the state travels to the kit and on to later
/// checks at [`Results::share`] points.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(crate) struct MechState {
    /// Allocations proved readable and writable (CPU): the storm may touch
    /// its blocks.
    pub touch_ok: bool,
    /// A fence failed to complete: later waits are short.
    pub fences_stuck: bool,
}

// ---------------------------------------------------------------------------
// What a child tells the kit
// ---------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
struct WireWrite {
    len: usize,
    null_msg: bool,
    foreign_thread: bool,
    utf8: bool,
    text: String,
}

#[derive(Serialize, Deserialize)]
struct WireCall {
    slot: String,
    status: MemplugStatus,
    writes: Vec<WireWrite>,
}

/// What one check added to the log.
#[derive(Default, Serialize, Deserialize)]
struct LogDelta {
    calls: Vec<WireCall>,
    overruns: Vec<(String, String)>,
    written_on_failure: Vec<(String, MemplugStatus)>,
    /// Writes into sinks after their calls returned: a few, and the count.
    #[serde(default)]
    late: (Vec<(String, String)>, usize),
}

impl LogDelta {
    fn new((calls, overruns, written): Entries, late: (Vec<(&'static str, String)>, usize)) -> Self {
        LogDelta {
            calls: calls
                .into_iter()
                .map(|c| WireCall {
                    slot: c.slot.to_string(),
                    status: c.status,
                    writes: c
                        .writes
                        .into_iter()
                        .map(|w| WireWrite {
                            len: w.len,
                            null_msg: w.null_msg,
                            foreign_thread: w.foreign_thread,
                            utf8: w.utf8,
                            text: w.text,
                        })
                        .collect(),
                })
                .collect(),
            overruns: overruns.into_iter().map(|(s, d)| (s.to_string(), d)).collect(),
            written_on_failure: written.into_iter().map(|(s, st)| (s.to_string(), st)).collect(),
            late: (late.0.into_iter().map(|(s, t)| (s.to_string(), t)).collect(), late.1),
        }
    }

    /// Adds what it holds to `log`.
    fn apply(self, log: &Log) {
        for c in self.calls {
            let writes = c
                .writes
                .into_iter()
                .map(|w| Write {
                    len: w.len,
                    null_msg: w.null_msg,
                    foreign_thread: w.foreign_thread,
                    utf8: w.utf8,
                    text: w.text,
                })
                .collect();
            log.record(intern(&c.slot), c.status, writes);
        }
        for (slot, d) in self.overruns {
            log.overrun(intern(&slot), d);
        }
        for (slot, s) in self.written_on_failure {
            log.wrote_on_failure(intern(&slot), s);
        }
        let (kept, count) = self.late;
        log.late(kept.into_iter().map(|(s, t)| (intern(&s), t)).collect(), count);
    }
}

/// The `&'static str` of a slot or capability name that came over a pipe
/// (names are a small fixed set; each is allocated once).
fn intern(s: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.get(s) {
        return n;
    }
    let n: &'static str = Box::leak(s.to_owned().into_boxed_str());
    names.insert(n);
    n
}

/// The name in [`CHECKS`] spelt `s`.
fn check_name(s: &str) -> &'static str {
    CHECKS.iter().find(|c| c.name == s).map(|c| c.name).unwrap_or_else(|| intern(s))
}

#[derive(Default, Serialize, Deserialize)]
struct WireMech {
    name: String,
    id: u64,
    device: String,
    capabilities: Vec<String>,
}

/// What a child learnt about the plugin, for the report's header.
#[derive(Default, Serialize, Deserialize)]
struct Header {
    abi: Option<String>,
    plugin_name: Option<String>,
    plugin_version: Option<String>,
    plugin_abi_range: Option<String>,
    mechanisms: Vec<WireMech>,
}

impl Header {
    /// Keeps what `h` knows (children stop reading the plugin after their
    /// check, so a later child may know less).
    fn merge(&mut self, h: Header) {
        self.abi = h.abi.or(self.abi.take());
        self.plugin_name = h.plugin_name.or(self.plugin_name.take());
        self.plugin_version = h.plugin_version.or(self.plugin_version.take());
        self.plugin_abi_range = h.plugin_abi_range.or(self.plugin_abi_range.take());
        if h.mechanisms.len() >= self.mechanisms.len() {
            self.mechanisms = h.mechanisms;
        }
    }

    fn fill(self, r: &mut Report) {
        r.abi = self.abi;
        r.plugin_name = self.plugin_name.as_deref().map(printable);
        r.plugin_version = self.plugin_version.as_deref().map(printable);
        r.plugin_abi_range = self.plugin_abi_range;
        r.mechanisms = self
            .mechanisms
            .into_iter()
            .map(|m| MechanismSummary {
                name: printable(&m.name),
                id: m.id,
                device: printable(&m.device),
                capabilities: m.capabilities.iter().map(|c| intern(c)).collect(),
            })
            .collect();
    }
}

/// One line from a child.
#[derive(Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
enum Msg {
    /// It re-runs check `index` (one of [`REPLAYED`]) to set the plugin up.
    Replay {
        index: usize,
    },
    /// Its check starts.
    Start {
        name: String,
        mechanism: Option<String>,
    },
    /// Its check ended.
    Verdict {
        outcome: Outcome,
        detail: String,
        duration_ns: u64,
        log: LogDelta,
    },
    /// Its check is still at work (a long storm): the watcher's deadline
    /// starts again; nothing else changes.
    Alive,
    /// The plugin's live objects before and after the check.
    Live {
        before: u64,
        after: u64,
    },
    /// A mechanism's state after the check.
    State {
        mechanism: String,
        state: MechState,
    },
    Header(Header),
    /// `--mechanism` names nothing the plugin publishes.
    NoSuchMechanism {
        name: String,
        available: Vec<String>,
    },
    /// Re-running the sequence led somewhere the recorded run did not go.
    Diverged {
        index: usize,
        name: String,
        mechanism: Option<String>,
    },
    /// There is no check at its position: the run is complete.
    End,
}

// ---------------------------------------------------------------------------
// The kit's side
// ---------------------------------------------------------------------------

/// One check as the kit recorded it (names as the plugin spelt them).
#[derive(Clone)]
struct Record {
    name: &'static str,
    mechanism: Option<String>,
    outcome: Outcome,
}

/// What the kit knows between children (each child starts with a copy).
#[derive(Default)]
struct Kit {
    history: Vec<Record>,
    states: HashMap<String, MechState>,
    /// Checks after which the plugin counted more (or fewer) live objects
    /// than before.
    leaks: Vec<String>,
    log: Log,
    header: Header,
}

/// What the kit does after a child.
enum Next {
    /// Record this result and go on with the next check.
    Go(CheckResult),
    /// Record this result and stop: the run cannot go on reliably.
    Stop(CheckResult),
    /// The run is complete.
    End,
}

/// What the checks run on.
pub(crate) enum Target<'a> {
    /// The plugin named `path` (as reports show it), whose opened file is
    /// `file`: every check's process loads and reads that descriptor (as
    /// `/proc/self/fd/4`), never the name again.
    File { path: &'a Path, file: &'a std::fs::File },
    /// A plugin linked into this executable, reached through its entry
    /// function; `name` is how reports show it.
    Linked { entry: MemplugEntryV1, name: &'a Path },
}

/// What a check's process loads the plugin from.
pub(crate) enum Source {
    Opened(std::path::PathBuf),
    Linked(MemplugEntryV1),
}

/// Runs the checks on `target`, each in its own process.
pub(crate) fn run(
    target: Target<'_>,
    opts: &Options,
    on_result: &mut dyn FnMut(&CheckResult),
) -> Result<Report, Error> {
    let mut kit = Kit::default();
    let (shown, keep, source) = match target {
        Target::File { path, file } => {
            let opened = std::path::PathBuf::from(format!("/proc/self/fd/{}", os::KEPT_FD));
            (path, Some(std::os::fd::AsRawFd::as_raw_fd(file)), Source::Opened(opened))
        }
        Target::Linked { entry, name } => (name, None, Source::Linked(entry)),
    };
    let mut report = Report::empty(shown, opts);
    let mut timed_out = Duration::ZERO;
    loop {
        let target = kit.history.len();
        // A plugin that hangs every check must not keep a run going for
        // checks x --timeout: once the run has lost TIMED_OUT_BUDGET to
        // timeouts, each later check gets at most SHORT_TIMEOUT, so the
        // run ends, and prints its summary, in bounded time.
        let shortened;
        let opts = if timed_out >= TIMED_OUT_BUDGET && opts.timeout > SHORT_TIMEOUT {
            shortened = Options { timeout: SHORT_TIMEOUT, ..opts.clone() };
            &shortened
        } else {
            opts
        };
        let child = os::supervise(opts.timeout, keep, |fd| child_main(&source, opts, &kit, target, fd))
            .map_err(Error::Isolation)?;
        let (mut result, go) = match kit.absorb(child, opts)? {
            Next::Go(r) => (r, true),
            Next::Stop(r) => (r, false),
            Next::End => break,
        };
        if result.outcome == Outcome::Timeout {
            timed_out += opts.timeout;
            if timed_out >= TIMED_OUT_BUDGET {
                result.detail += &format!(
                    " (the run has lost {} s to timed-out checks: each later check gets at most {} s)",
                    timed_out.as_secs(),
                    SHORT_TIMEOUT.as_secs()
                );
            }
        }
        on_result(&result);
        report.checks.push(result);
        if !go {
            break;
        }
    }
    std::mem::take(&mut kit.header).fill(&mut report);
    report.could_not_run = could_not_run(&report);
    report.settle();
    Ok(report)
}

/// Time lost to timed-out checks after which the run shortens the
/// timeout of each later check to [`SHORT_TIMEOUT`].
const TIMED_OUT_BUDGET: Duration = Duration::from_secs(30);

/// See [`TIMED_OUT_BUDGET`].
const SHORT_TIMEOUT: Duration = Duration::from_secs(2);

/// The most bytes of one check's detail a report keeps.
pub(crate) const DETAIL_MAX: usize = 8 * 1024;

/// `d` cut to [`DETAIL_MAX`] bytes (at a character boundary), saying how
/// much was left out: one check's detail never floods a report.
pub(crate) fn bounded_detail(d: String) -> String {
    if d.len() <= DETAIL_MAX {
        return d;
    }
    let mut cut = DETAIL_MAX - 128;
    while !d.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}\n… ({} more bytes left out: a check's detail is bounded to {DETAIL_MAX} bytes)",
        &d[..cut],
        d.len() - cut
    )
}

/// Why the run never got to the mechanisms, if it did not.
fn could_not_run(r: &Report) -> Option<String> {
    if r.checks.iter().any(|c| c.name == "descriptor.plugin" && c.outcome == Outcome::Pass) {
        return None;
    }
    let stopped =
        GATES.iter().find_map(|g| r.checks.iter().find(|c| c.name == *g && c.outcome != Outcome::Pass));
    Some(match stopped {
        Some(c) => {
            let how = match c.outcome {
                Outcome::Crash => "crashed",
                Outcome::Timeout => "timed out",
                Outcome::Skip => "was skipped",
                _ => "failed",
            };
            let first = c.detail.lines().next().unwrap_or("");
            format!("{} {how}: {first}", c.name)
        }
        None => "the run stopped before the plugin descriptor was read".into(),
    })
}

/// How a child that gave no verdict ended: the outcome, what to say, and
/// the signal.
fn died(child: &Supervised, opts: &Options) -> (Outcome, String, Option<&'static str>) {
    let (outcome, mut detail, signal) = match child.end {
        ChildEnd::TimedOut => (
            Outcome::Timeout,
            format!(
                "timed out: no sign of life for {} s (--timeout); its process was killed with SIGKILL",
                opts.timeout.as_secs_f64()
            ),
            None,
        ),
        ChildEnd::Signaled(s) => {
            let name = os::signal_name(s);
            (Outcome::Crash, format!("crashed: its process was killed by {name} (signal {s})"), Some(name))
        }
        ChildEnd::Exited(c) => (
            Outcome::Crash,
            format!(
                "crashed: its process exited with status {c} before giving a verdict (did the plugin exit, or \
                 close descriptor {} of the check's process, the kit's message pipe?)",
                os::MESSAGE_FD
            ),
            None,
        ),
        ChildEnd::ForkFailed => (Outcome::Crash, "its process could not be started".into(), None),
    };
    if child.output_len > 0 {
        let shown = child.output.len();
        let text = printable_text(&String::from_utf8_lossy(&child.output));
        let what = if shown < child.output_len {
            format!("the last {shown} of {} bytes it wrote", child.output_len)
        } else {
            format!("the {shown} bytes it wrote")
        };
        detail += &format!("\noutput ({what} to stdout/stderr):\n{}", text.trim_end());
    }
    (outcome, detail, signal)
}

impl Kit {
    /// Takes in what one child said and how it ended.
    fn absorb(&mut self, child: Supervised, opts: &Options) -> Result<Next, Error> {
        let mut start = None;
        let mut verdict = None;
        let mut live = None;
        let mut replay = None;
        let mut diverged = None;
        let mut end = false;
        for (at, line) in &child.lines {
            // A line that does not parse is not the kit's (a plugin wrote
            // to the descriptor): ignored.
            let Ok(msg) = serde_json::from_slice::<Msg>(line) else {
                continue;
            };
            match msg {
                Msg::Replay { index } => replay = Some(index),
                Msg::Start { name, mechanism } => start = Some((*at, check_name(&name), mechanism)),
                Msg::Verdict { outcome, detail, duration_ns, log } => {
                    verdict = Some((outcome, detail, Duration::from_nanos(duration_ns), log))
                }
                Msg::Live { before, after } => live = Some((before, after)),
                Msg::Alive => {}
                Msg::State { mechanism, state } => {
                    self.states.insert(mechanism, state);
                }
                Msg::Header(h) => self.header.merge(h),
                Msg::NoSuchMechanism { name, available } => {
                    return Err(Error::NoSuchMechanism { name, available })
                }
                Msg::Diverged { index, name, mechanism } => diverged = Some((index, name, mechanism)),
                Msg::End => end = true,
            }
        }
        if let Some((at, name, mechanism)) = start {
            let (outcome, detail, duration, signal) = match verdict {
                Some((outcome, detail, duration, log)) => {
                    log.apply(&self.log);
                    (outcome, bounded_detail(printable_text(&detail)), duration, None)
                }
                None => {
                    let (o, d, s) = died(&child, opts);
                    (o, bounded_detail(d), child.ended.saturating_duration_since(at), s)
                }
            };
            if let Some((before, after)) = live.filter(|(b, a)| b != a) {
                let on = mechanism.as_deref().map(|m| format!(" ({})", printable(m))).unwrap_or_default();
                self.leaks.push(format!("{name}{on}: {before} before, {after} after"));
            }
            self.history.push(Record { name, mechanism: mechanism.clone(), outcome });
            let mechanism = mechanism.as_deref().map(printable);
            return Ok(Next::Go(CheckResult { name, mechanism, outcome, detail, duration, signal }));
        }
        if end {
            return Ok(Next::End);
        }
        let stop = |name, mechanism: Option<String>, outcome, detail, signal| {
            Next::Stop(CheckResult {
                name,
                mechanism: mechanism.as_deref().map(printable),
                outcome,
                detail,
                duration: Duration::ZERO,
                signal,
            })
        };
        if let Some((index, name, mechanism)) = diverged {
            let expected = self.history.get(index).map(|r| r.name).unwrap_or("the end of the run");
            let detail = format!(
                "re-run in a fresh process, the plugin led the kit to {} where {expected} came before: it does not \
                 behave the same from one run to the next, so the run stops here",
                printable(&name)
            );
            return Ok(stop(check_name(&name), mechanism, Outcome::Fail, detail, None));
        }
        // It died before its check began.
        let (outcome, how, signal) = died(&child, opts);
        Ok(match replay.and_then(|i| self.history.get(i)).cloned() {
            Some(rec) => {
                let detail = format!(
                    "re-run in a fresh process to set up the next check (it ended {} on its own run), it {how}\nthe \
                     plugin does not behave the same from one run to the next, so the run stops here",
                    rec.outcome
                );
                stop(rec.name, rec.mechanism, outcome, detail, signal)
            }
            None => {
                let detail =
                    format!("the next check's process, before the check began: {how}\nthe run stops here");
                stop("load.open", None, outcome, detail, signal)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{bounded_detail, DETAIL_MAX};

    #[test]
    fn a_detail_is_bounded_and_says_so() {
        assert_eq!(bounded_detail("short".into()), "short");
        let long = "é".repeat(DETAIL_MAX);
        let b = bounded_detail(long.clone());
        assert!(b.len() <= DETAIL_MAX + 100, "{}", b.len());
        assert!(b.ends_with(&format!("bounded to {DETAIL_MAX} bytes)")), "{}", &b[b.len() - 80..]);
        assert!(b.contains(&format!("{} more bytes left out", long.len() - (DETAIL_MAX - 128))));
    }
}

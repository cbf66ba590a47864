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
mod concurrency;
mod copy;
mod descriptor;
mod descriptor_claims;
pub(crate) mod fresh;
mod loss;
mod messages;
mod negotiation;
mod ordering;
mod shared_mapping;
mod sync;
mod typed_export;
mod virtual_backing;

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
    /// The plugin file as this process opened it (`/proc/self/fd/4`).
    pub path: std::path::PathBuf,
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
}

impl LogDelta {
    fn new((calls, overruns, written): Entries) -> Self {
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

/// Runs the checks on the plugin named `path` (as reports show it), whose
/// opened file is `file`: every check's process loads and reads that
/// descriptor (as `/proc/self/fd/4`), never the name again.
pub(crate) fn run(
    path: &Path,
    file: &std::fs::File,
    opts: &Options,
    on_result: &mut dyn FnMut(&CheckResult),
) -> Result<Report, Error> {
    let mut kit = Kit::default();
    let mut report = Report::empty(path, opts);
    loop {
        let target = kit.history.len();
        let keep = std::os::fd::AsRawFd::as_raw_fd(file);
        let opened = std::path::PathBuf::from(format!("/proc/self/fd/{}", os::KEPT_FD));
        let child = os::supervise(opts.timeout, Some(keep), |fd| child_main(&opened, opts, &kit, target, fd))
            .map_err(Error::Isolation)?;
        let (result, go) = match kit.absorb(child, opts)? {
            Next::Go(r) => (r, true),
            Next::Stop(r) => (r, false),
            Next::End => break,
        };
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
                "crashed: its process exited with status {c} before giving a verdict (did the plugin exit?)"
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
                    (outcome, printable_text(&detail), duration, None)
                }
                None => {
                    let (o, d, s) = died(&child, opts);
                    (o, d, child.ended.saturating_duration_since(at), s)
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

// ---------------------------------------------------------------------------
// A check's process
// ---------------------------------------------------------------------------

/// The child of the check at `target`: the whole sequence, aimed at it.
fn child_main(path: &Path, opts: &Options, kit: &Kit, target: usize, out: RawFd) -> i32 {
    let log = Arc::new(kit.log.snapshot());
    log.set_muted(true);
    let mut res = Results {
        history: kit.history.clone(),
        states: kit.states.clone(),
        leaks: kit.leaks.clone(),
        target,
        next: 0,
        out,
        log,
        started: false,
        announced: None,
        done: false,
        state_sent: false,
        live: None,
        services: None,
    };
    let mut header = Header::default();
    if let Err(Error::NoSuchMechanism { name, available }) = orchestrate(path, opts, &mut res, &mut header) {
        res.send(&Msg::NoSuchMechanism { name, available });
    }
    res.send(&Msg::Header(header));
    if !res.started {
        res.send(&Msg::End);
    }
    0
}

/// Writes all of `b` to `fd` (a kit whose end is gone is not waited for).
fn write_all(fd: RawFd, mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: writes from a live buffer of its length.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n > 0 {
            b = &b[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        } else {
            return;
        }
    }
}

/// Runs `f`; a panic in the kit's own code is a failure of the check, not
/// of the run.
fn guarded(f: impl FnOnce() -> Checked) -> Checked {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(Verdict::Fail(format!("the check stopped: {what}")))
    })
}

fn passes(r: &Checked) -> bool {
    !matches!(r, Err(Verdict::Fail(_)))
}

/// The checks as one child sees them: the kit's record of those before its
/// own, its own check, and nothing after it (see the module documentation).
pub(crate) struct Results {
    history: Vec<Record>,
    states: HashMap<String, MechState>,
    leaks: Vec<String>,
    /// The position of this child's check.
    target: usize,
    /// The position of the next check reached.
    next: usize,
    /// Where messages to the kit go.
    out: RawFd,
    pub(crate) log: Arc<Log>,
    /// Its check's start was announced, and under which name.
    started: bool,
    announced: Option<(&'static str, Option<String>)>,
    /// Its check ran.
    done: bool,
    /// Its mechanism's state went to the kit.
    state_sent: bool,
    /// The plugin's `live_objects` and its context, once validated.
    live: Option<(unsafe extern "C" fn(*mut c_void) -> u64, *mut c_void)>,
    /// The services of the ordinary negotiation: a report the plugin makes
    /// during a check is noted in its detail.
    services: Option<&'static KitServices>,
}

impl Results {
    fn send(&self, m: &Msg) {
        let Ok(mut b) = serde_json::to_vec(m) else {
            return;
        };
        b.push(b'\n');
        write_all(self.out, &b);
    }

    /// Records `r`, a result already worked out, as check `name`.
    pub(crate) fn add(&mut self, name: &'static str, mechanism: Option<&str>, r: Checked) -> bool {
        self.step(name, mechanism, true, move || r)
    }

    /// Runs `f` as check `name` (when it is this process's check); returns
    /// whether it passed or was skipped.
    pub(crate) fn run(
        &mut self,
        name: &'static str,
        mechanism: Option<&str>,
        f: impl FnOnce() -> Checked,
    ) -> bool {
        self.step(name, mechanism, false, f)
    }

    /// Says the next check is `name`: work done before it reaches
    /// [`Results::add`] or [`Results::run`] (reading what it judges) is
    /// part of it, so a crash there is that check's.
    pub(crate) fn upcoming(&mut self, name: &'static str, mechanism: Option<&str>) {
        if self.next == self.target && !self.started {
            self.start(name, mechanism);
        }
    }

    fn start(&mut self, name: &'static str, mechanism: Option<&str>) {
        self.send(&Msg::Start { name: name.into(), mechanism: mechanism.map(str::to_string) });
        self.started = true;
        self.announced = Some((name, mechanism.map(str::to_string)));
    }

    fn diverged(&self, index: usize, name: &'static str, mechanism: Option<&str>) -> ! {
        self.send(&Msg::Diverged { index, name: name.into(), mechanism: mechanism.map(str::to_string) });
        // SAFETY: a check's process, leaving without unwinding into the
        // plugin or running the caller's atexit handlers.
        unsafe { libc::_exit(0) }
    }

    fn step(
        &mut self,
        name: &'static str,
        mechanism: Option<&str>,
        computed: bool,
        f: impl FnOnce() -> Checked,
    ) -> bool {
        debug_assert!(CHECKS.iter().any(|c| c.name == name), "{name} is not in CHECKS");
        let at = self.next;
        self.next += 1;
        if at < self.target {
            let rec = match self.history.get(at) {
                Some(r) if r.name == name && r.mechanism.as_deref() == mechanism => r.clone(),
                _ => self.diverged(at, name, mechanism),
            };
            if computed {
                return passes(&f());
            }
            if REPLAYED.contains(&name) && !matches!(rec.outcome, Outcome::Crash | Outcome::Timeout) {
                self.send(&Msg::Replay { index: at });
                return passes(&guarded(f));
            }
            return !rec.outcome.is_failure();
        }
        if at > self.target || self.done {
            return false;
        }
        // Announced by `upcoming` under another name (a check was put in
        // between): the later Start is the one the kit keeps.
        if self.announced.as_ref().is_none_or(|(n, m)| *n != name || m.as_deref() != mechanism) {
            self.start(name, mechanism);
        }
        let before = mechanism.and_then(|_| self.live_count());
        let reports_before = self.services.map_or(0, |s| s.count());
        let marks = self.log.marks();
        self.log.set_muted(false);
        let t = Instant::now();
        let r = guarded(f);
        let duration = t.elapsed();
        self.log.set_muted(true);
        let passed = passes(&r);
        let (outcome, mut detail) = match r {
            Ok(d) => (Outcome::Pass, d),
            Err(Verdict::Fail(d)) => (Outcome::Fail, d),
            Err(Verdict::Skip(d)) => (Outcome::Skip, d),
        };
        if let Some(s) = self.services {
            for r in s.seen().iter().skip(reports_before) {
                detail += &format!(
                    "\nnote: during this check the plugin reported the loss of mechanism id {} through the kit's \
                     services ({}, {}; answered {})",
                    r.mechanism_id,
                    r.thread(),
                    r.reason.describe(),
                    crate::raw::status_name(r.answer)
                );
            }
        }
        let log = LogDelta::new(self.log.since(marks));
        self.send(&Msg::Verdict { outcome, detail, duration_ns: duration.as_nanos() as u64, log });
        self.done = true;
        if let Some(before) = before {
            if let Some(after) = self.live_count() {
                self.send(&Msg::Live { before, after });
            }
        }
        passed
    }

    /// Where a mechanism's groups of checks meet: before this process's
    /// check, `st` becomes what the checks before it built; after it, `st`
    /// goes to the kit for the checks after it.
    pub(crate) fn share(&mut self, mechanism: &str, st: &mut MechState) {
        if !self.done {
            if let Some(s) = self.states.get(mechanism) {
                *st = *s;
            }
        } else if !self.state_sent {
            self.send(&Msg::State { mechanism: mechanism.into(), state: *st });
            self.state_sent = true;
        }
    }

    /// From now on the plugin's live objects are counted around each
    /// per-mechanism check.
    pub(crate) fn set_live_probe(&mut self, plugin: &descriptor::PluginView) {
        self.live = Some((plugin.live_objects, plugin.ctx));
    }

    fn live_count(&self) -> Option<u64> {
        let (f, ctx) = self.live?;
        // SAFETY: the plugin's validated live_objects slot and context.
        Some(unsafe { f(ctx) })
    }

    /// The checks after which the plugin counted a different number of live
    /// objects than before, as the kit recorded them.
    pub(crate) fn leaks(&self) -> &[String] {
        &self.leaks
    }
}

/// The whole sequence of checks, as one child runs it through `res`.
fn orchestrate(path: &Path, opts: &Options, res: &mut Results, h: &mut Header) -> Result<(), Error> {
    // An initialiser of the plugin that crashes does so in load.open.
    res.upcoming("load.open", None);
    let lib = match open(path) {
        Ok(l) => {
            res.add("load.open", None, Ok("opened with RTLD_NOW | RTLD_LOCAL".into()));
            l
        }
        Err(e) => {
            res.add("load.open", None, Err(Verdict::Fail(e)));
            res.run("exports.only_entry_symbols", None, || exports(path));
            return Ok(());
        }
    };
    // SAFETY: the symbol's type is fixed by the ABI for this name.
    let entry = match unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin_v1\0") } {
        Ok(f) => {
            res.add("load.entry_symbol", None, Ok("memplug_plugin_v1 found".into()));
            *f
        }
        Err(e) => {
            res.add(
                "load.entry_symbol",
                None,
                Err(Verdict::Fail(format!("memplug_plugin_v1 is not defined: {e}"))),
            );
            res.run("exports.only_entry_symbols", None, || exports(path));
            return Ok(());
        }
    };
    // The library stays loaded for the life of the process: a plugin may
    // keep threads or mappings past the last call the kit makes.
    std::mem::forget(lib);
    res.run("exports.only_entry_symbols", None, || exports(path));

    let services = KitServices::leak();
    res.services = Some(services);
    let ctx = Ctx { log: res.log.clone(), opts: opts.clone(), entry, path: path.to_path_buf(), services };
    let Some((desc, agreed)) = negotiation::run_all(res, &ctx) else {
        return Ok(());
    };
    h.abi = Some(format!("{MEMPLUG_ABI_MAJOR}.{agreed}"));
    let Some(plugin) = descriptor::plugin(res, &desc, agreed) else {
        return Ok(());
    };
    res.set_live_probe(&plugin);
    h.plugin_name = Some(plugin.name.clone());
    h.plugin_version = Some(plugin.version.clone());
    h.plugin_abi_range = Some(format!("1.{}..=1.{}", plugin.min_minor, plugin.max_minor));
    // Reading the mechanism descriptors is descriptor.mechanisms' work.
    res.upcoming("descriptor.mechanisms", None);
    let published = descriptor::mechanisms(res, &plugin);
    // From now on the kit's services take the plugin's reports.
    services.publish(agreed, published.iter().map(|d| d.desc.mechanism_id).collect());
    if let Some(want) = &opts.mechanism {
        if !published.iter().any(|d| &d.name == want) {
            return Err(Error::NoSuchMechanism {
                name: want.clone(),
                available: published.iter().map(|d| d.name.clone()).collect(),
            });
        }
    }
    let mut checked = Vec::new();
    for d in &published {
        h.mechanisms.push(WireMech {
            name: d.name.clone(),
            id: d.desc.mechanism_id,
            device: descriptor::device_string(d.desc.device),
            capabilities: descriptor::capability_names(d.desc.capabilities)
                .iter()
                .map(|c| c.to_string())
                .collect(),
        });
        if opts.mechanism.as_ref().is_some_and(|w| w != &d.name) || !d.checkable {
            continue;
        }
        let Some(m) = descriptor::mechanism(res, &ctx, &plugin, d) else {
            continue;
        };
        per_mechanism(res, &ctx, &m);
        checked.push(m);
    }
    loss::run_plugin(res, &ctx, &checked);
    messages::finish(res, &ctx, &plugin, &checked);
    Ok(())
}

fn per_mechanism(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let mut st = MechState::default();
    let name = Some(m.name.as_str());
    res.share(&m.name, &mut st);
    descriptor_claims::run_descriptor(res, ctx, m);
    allocator::run_all(res, ctx, m, &mut st);
    res.share(&m.name, &mut st);
    virtual_backing::run_all(res, ctx, m);
    res.share(&m.name, &mut st);
    shared_mapping::run_all(res, ctx, m);
    typed_export::run_all(res, ctx, m);
    descriptor_claims::run_claims(res, ctx, m);
    res.share(&m.name, &mut st);
    sync::run_all(res, ctx, m, &mut st);
    res.share(&m.name, &mut st);
    ordering::run_all(res, ctx, m, &st);
    copy::run_all(res, ctx, m, &st);
    concurrency::run_all(res, ctx, m, &st);
    res.share(&m.name, &mut st);
    loss::run_mech(res, ctx, m);
    res.run("lifecycle.live_objects", name, || allocator::live_objects(ctx, m));
}

pub(crate) fn open(path: &Path) -> Result<libloading::Library, String> {
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: loading runs the library's initialisers: that is what
    // checking a plugin means; the path was chosen by the user.
    unsafe { libloading::os::unix::Library::open(Some(path), flags) }
        .map(libloading::Library::from)
        .map_err(|e| format!("not a loadable library: {e}"))
}

/// How many offending names `exports.only_entry_symbols` lists.
const LISTED_EXPORTS: usize = 24;

fn exports(path: &Path) -> Checked {
    let names = crate::elf::exported_symbols(path).map_err(Verdict::Fail)?;
    let extra: Vec<&String> =
        names.iter().filter(|n| !crate::elf::is_entry_symbol(n) && !fresh::is_loss_trigger(n)).collect();
    let entries: Vec<&String> = names.iter().filter(|n| crate::elf::is_entry_symbol(n)).collect();
    let triggers: Vec<&str> =
        names.iter().filter(|n| fresh::is_loss_trigger(n)).map(|s| s.as_str()).collect();
    if !extra.is_empty() {
        // Sorted, each name whole.
        let listed: Vec<&str> = extra.iter().take(LISTED_EXPORTS).map(|s| s.as_str()).collect();
        let more = extra.len().saturating_sub(LISTED_EXPORTS);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        fail!(
            "exports {} symbol(s) besides its entry symbols (build with -fvisibility=hidden and mark only the \
             entry MEMPLUG_EXPORT, or link with a version script whose `local: *;` hides the rest): {}{more}",
            extra.len(),
            listed.join(", ")
        );
    }
    ensure!(!entries.is_empty(), "exports no memplug_plugin_v<N> entry symbol");
    let triggers = if triggers.is_empty() {
        String::new()
    } else {
        format!(" and the kit's device-loss test trigger {}", triggers.join(", "))
    };
    Ok(format!(
        "exports only {}{triggers}",
        entries.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    ))
}

// ---------------------------------------------------------------------------
// Objects a check makes, released whatever way it ends
// ---------------------------------------------------------------------------

/// Tracks what a check made and releases, in dependency order, whatever is
/// left when it ends: gates are opened first (so no stream waits forever),
/// then fences, streams, mappings, physical-object references,
/// reservations and allocations.
pub(crate) struct Scope<'a> {
    pub m: &'a Mech,
    pub log: &'a Log,
    allocs: Vec<MemplugObjectRef>,
    reservations: Vec<MemplugObjectRef>,
    objects: Vec<MemplugObjectRef>,
    mappings: Vec<(MemplugObjectRef, u64, u64)>,
    streams: Vec<u64>,
    fences: Vec<u64>,
    gates: Vec<Arc<Gate>>,
}

impl<'a> Scope<'a> {
    pub(crate) fn new(ctx: &'a Ctx, m: &'a Mech) -> Self {
        Scope {
            m,
            log: &ctx.log,
            allocs: Vec::new(),
            reservations: Vec::new(),
            objects: Vec::new(),
            mappings: Vec::new(),
            streams: Vec::new(),
            fences: Vec::new(),
            gates: Vec::new(),
        }
    }

    fn forget(list: &mut Vec<MemplugObjectRef>, o: &MemplugObjectRef) {
        if let Some(i) = list.iter().position(|x| x == o) {
            list.swap_remove(i);
        }
    }

    /// Allocates; a success is tracked.
    pub(crate) fn allocate(&mut self, req: &MemplugRequest) -> Made {
        let made = self.m.allocate(self.log, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.allocs.push(made.obj);
        }
        made
    }

    /// Allocates `size` bytes aligned to `align`, or fails the check.
    pub(crate) fn alloc_ok(&mut self, size: u64, align: u64) -> Result<MemplugObjectRef, Verdict> {
        let req = crate::raw::request(self.m, size, align);
        let made = self.allocate(&req);
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("allocate({size}, align {align})"))?;
        ensure!(
            made.block.addr != 0 && made.block.size >= size,
            "allocate({size}, align {align}) returned OK with address {:#x} and size {}",
            made.block.addr,
            made.block.size
        );
        Ok(made.obj)
    }

    pub(crate) fn free(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.deallocate(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.allocs, o);
        }
        s
    }

    /// Reserves `size` bytes, or fails the check.
    pub(crate) fn reserve_ok(&mut self, size: u64) -> Result<MemplugObjectRef, Verdict> {
        let made = self.m.reserve(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("reserve({size})"))?;
        ensure!(
            made.block.addr != 0 && made.block.size >= size,
            "reserve({size}) returned OK with address {:#x} and size {}",
            made.block.addr,
            made.block.size
        );
        Ok(made.obj)
    }

    /// Reserves and tracks whatever the plugin says (for checks of the
    /// answer itself).
    pub(crate) fn reserve(&mut self, size: u64) -> Made {
        let made = self.m.reserve(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        made
    }

    /// Reserves with the request as given (ABI 1.2 fields); a success is
    /// tracked.
    pub(crate) fn reserve_req(&mut self, req: &MemplugRequest) -> Made {
        let made = self.m.reserve_req(self.log, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        made
    }

    pub(crate) fn release_reservation(&mut self, r: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.release_reservation(self.log, r);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.reservations, r);
            self.mappings.retain(|(res, _, _)| res != r);
        }
        s
    }

    pub(crate) fn create(&mut self, size: u64) -> Made {
        let made = self.m.create(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    /// Creates with the request as given (ABI 1.2 fields); a success is
    /// tracked.
    pub(crate) fn create_req(&mut self, req: &MemplugRequest) -> Made {
        let made = self.m.create_req(self.log, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    /// Imports a typed handle (ABI 1.2); a success is tracked.
    pub(crate) fn import_handle(&mut self, h: &MemplugHandle, req: &MemplugRequest) -> Made {
        let made = self.m.import_handle(self.log, h, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    pub(crate) fn create_ok(&mut self, size: u64) -> Result<MemplugObjectRef, Verdict> {
        let made = self.create(size);
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("create({size})"))?;
        ensure!(made.block.size >= size, "create({size}) returned OK with size {}", made.block.size);
        Ok(made.obj)
    }

    /// Imports `size` bytes from `fd` (ABI 1.1); a success is tracked.
    pub(crate) fn import(&mut self, fd: i32, size: u64) -> Made {
        let made = self.m.import_fd(self.log, fd, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    pub(crate) fn retain(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.retain(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            self.objects.push(*o);
        }
        s
    }

    pub(crate) fn release_object(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.release_object(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.objects, o);
        }
        s
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map(
        &mut self,
        o: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        access: u32,
    ) -> MemplugStatus {
        let s = self.m.map(self.log, o, object_offset, r, offset, len, access);
        if s == MEMPLUG_STATUS_OK {
            self.mappings.push((*r, offset, len));
        }
        s
    }

    pub(crate) fn unmap(&mut self, r: &MemplugObjectRef, offset: u64, len: u64) -> MemplugStatus {
        let s = self.m.unmap(self.log, r, offset, len);
        if s == MEMPLUG_STATUS_OK {
            if let Some(i) = self.mappings.iter().position(|x| *x == (*r, offset, len)) {
                self.mappings.swap_remove(i);
            }
        }
        s
    }

    pub(crate) fn stream_ok(&mut self) -> Result<u64, Verdict> {
        let (s, h) = self.m.stream_create(self.log);
        expect(s, &[MEMPLUG_STATUS_OK], "stream_create")?;
        ensure!(h != 0, "stream_create returned OK with the handle 0");
        self.streams.push(h);
        Ok(h)
    }

    pub(crate) fn stream_destroy(&mut self, h: u64) -> MemplugStatus {
        let s = self.m.stream_destroy(self.log, h);
        if s == MEMPLUG_STATUS_OK {
            self.streams.retain(|&x| x != h);
        }
        s
    }

    pub(crate) fn fence_ok(&mut self, stream: u64) -> Result<u64, Verdict> {
        let (s, h) = self.m.fence_record(self.log, stream);
        expect(s, &[MEMPLUG_STATUS_OK], "fence_record")?;
        ensure!(h != 0, "fence_record returned OK with the handle 0");
        self.fences.push(h);
        Ok(h)
    }

    pub(crate) fn fence_destroy(&mut self, h: u64) -> MemplugStatus {
        let s = self.m.fence_destroy(self.log, h);
        if s == MEMPLUG_STATUS_OK {
            self.fences.retain(|&x| x != h);
        }
        s
    }

    /// Enqueues `job` on `stream`, or fails the check.
    pub(crate) fn enqueue_ok(&mut self, stream: u64, job: Job) -> Result<(), Verdict> {
        if let Job::Gate(g) = &job {
            self.gates.push(g.clone());
        }
        let s = enqueue_job(self.m, self.log, stream, job);
        expect(s, &[MEMPLUG_STATUS_OK], "enqueue_host_fn")
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        for g in self.gates.drain(..) {
            g.open();
        }
        for f in std::mem::take(&mut self.fences) {
            self.m.fence_destroy(self.log, f);
        }
        for s in std::mem::take(&mut self.streams) {
            self.m.stream_destroy(self.log, s);
        }
        for (r, off, len) in std::mem::take(&mut self.mappings) {
            self.m.unmap(self.log, &r, off, len);
        }
        for o in std::mem::take(&mut self.objects) {
            self.m.release_object(self.log, &o);
        }
        for r in std::mem::take(&mut self.reservations) {
            self.m.release_reservation(self.log, &r);
        }
        for a in std::mem::take(&mut self.allocs) {
            self.m.deallocate(self.log, &a);
        }
    }
}

// ---------------------------------------------------------------------------
// Host functions the kit enqueues on plugin streams
// ---------------------------------------------------------------------------

/// A gate a host function waits at until the kit opens it (or 30 s pass:
/// a stream worker is never held forever by the kit).
#[derive(Default)]
pub(crate) struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    /// Set once the host function has passed the gate.
    pub passed: AtomicBool,
}

impl Gate {
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            open = self.cv.wait_timeout(open, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.passed.store(true, Ordering::SeqCst);
    }
}

/// Work the kit puts on a stream.
pub(crate) enum Job {
    /// Sleeps, then sets the flag.
    SleepThenSet(Duration, Arc<AtomicBool>),
    /// Waits at the gate.
    Gate(Arc<Gate>),
    /// Appends a number.
    Push(Arc<Mutex<Vec<u32>>>, u32),
}

unsafe extern "C" fn run_job(userdata: *mut c_void) {
    // Runs on a plugin thread: nothing may unwind into it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the Box leaked by `enqueue_job`, run once.
        let job = unsafe { Box::from_raw(userdata.cast::<Job>()) };
        match *job {
            Job::SleepThenSet(d, flag) => {
                std::thread::sleep(d);
                flag.store(true, Ordering::SeqCst);
            }
            Job::Gate(g) => g.wait(),
            Job::Push(v, n) => v.lock().unwrap_or_else(|e| e.into_inner()).push(n),
        }
    }));
}

/// Enqueues `job`; on refusal the job is dropped here (the plugin must
/// not run what it refused).
pub(crate) fn enqueue_job(m: &Mech, log: &Log, stream: u64, job: Job) -> MemplugStatus {
    let userdata = Box::into_raw(Box::new(job)).cast::<c_void>();
    let s = m.enqueue(log, stream, Some(run_job), userdata);
    if s != MEMPLUG_STATUS_OK {
        // SAFETY: refused, so never run: the box is still ours.
        drop(unsafe { Box::from_raw(userdata.cast::<Job>()) });
    }
    s
}

/// Runs `f` on its own thread and gives up on it after `limit` (a plugin
/// call that never returns must not stop the run; the thread is left).
pub(crate) fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("memplug-conformance-bounded".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

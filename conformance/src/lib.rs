//! memplug conformance kit: the suite a vendor runs on their own plugin.
//!
//! The kit opens the plugin library itself (libloading), negotiates through
//! `memplug_plugin_v1`, and drives the raw vtables of
//! [`memplug_sdk::abi`] exactly as `include/memplug.h` describes them. It
//! uses nothing of the host and nothing the reference plugins do
//! privately, so it also exercises what a host would refuse.
//!
//! Every check has a stable name ([`CHECKS`]) and ends [`Outcome::Pass`],
//! [`Outcome::Fail`], [`Outcome::Skip`], [`Outcome::Crash`] or
//! [`Outcome::Timeout`]. A check is skipped only where the plugin
//! explicitly lacks what it tests (a NULL optional slot, an absent
//! capability flag, an attribute it does not claim, an item of a minor it
//! did not agree on) or where the device cannot show it to the host
//! (residency and memory contents of non-CPU devices that are not
//! host-visible), always with the reason.
//!
//! ```no_run
//! let report = memplug_conformance::run(
//!     std::path::Path::new("libmy_plugin.so"),
//!     &memplug_conformance::Options::default(),
//! )
//! .unwrap();
//! assert!(report.passed(), "{:?}", report.failures().collect::<Vec<_>>());
//! ```
//!
//! # Isolation
//!
//! The calling process never loads the plugin. Every check runs in a child
//! process of its own, forked from the caller's thread (which starts no
//! thread of its own for the run): the child opens the plugin, negotiates,
//! reads the descriptor, runs that one check and reports its verdict over a
//! pipe. A child that dies (SIGSEGV, SIGABRT, `exit`) is reported as the
//! check crashing, one that sends nothing for [`Options::timeout`] is
//! killed (SIGKILL, with anything it started) and reported as timed out,
//! and the run goes on with the next check. Whatever a child writes to
//! stdout or stderr is captured; the last bytes of it are part of a
//! crashed or timed-out check's detail. See `checks/mod.rs` for how later
//! checks still see what earlier ones learnt.
//!
//! Because of the fork, call [`run`] from a process that is not loading
//! libraries on another thread at the same moment (the `memplug` command
//! calls it from its only thread).
//!
//! Inside a check, probes expected (or feared) to crash — NULL arguments,
//! NULL sinks, writes to read-only views — run in a further child, so a
//! plugin that crashes on them fails that check. Memory of CPU-kind
//! devices is touched only after `/proc/self/maps` says it is mapped
//! writable.
//!
//! # ABI 1.2: services and device loss
//!
//! The kit negotiates as a 1.2 host (a 32-byte host info with a services
//! table that records every `report_device_lost`). The `loss.*` checks
//! each load a fresh copy of the plugin in their process, negotiate with
//! it once, and provoke a loss through a test trigger the library exports
//! ([`LOSS_TRIGGERS`]); without one, the checks that need a loss are
//! skipped, saying so. For the CPU plugin's trigger the kit sets
//! `MEMPLUG_CPU_TEST_SWITCHES=1` in that check's process before the copy
//! is loaded (`docs/conformance-json.md`, "Device-loss test triggers").
//!
//! # ABI 1.2: the memory descriptor and its claims
//!
//! At 1.2 the kit reads the properties at their 1.2 size and judges the
//! memory descriptor (`descriptor.memory_descriptor`), the device identity
//! (`descriptor.identity`), requests naming page sizes and export kinds
//! (`descriptor.page_size_requests`, `shared_mapping.export_kinds_requested`)
//! and typed export (`shared_mapping.typed_export*`); and an attribute
//! claimed is an attribute delivered, as far as the host can see
//! (`claims.*`: read-only views fault, new memory reads zero, huge pages
//! back what was asked for them). `docs/conformance-json.md` lists what
//! fails each.
//!
//! Strings that come from the plugin (names, versions, messages, its
//! output) reach the report with control characters escaped
//! ([`printable`]), so no report format can carry a terminal escape
//! sequence.

mod catalog;
mod checks;
pub mod elf;
mod meanings;
mod os;
mod raw;
mod services;
mod sink;

pub use catalog::{checks_markdown, CheckInfo, CHECKS};
pub use checks::fresh::{is_loss_trigger, LossTrigger, LOSS_TRIGGERS};

use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The version of the JSON report (`docs/conformance-json.md`): bumped
/// when a field changes meaning or goes away, not when one is added.
pub const SCHEMA_VERSION: u32 = 1;

/// How long a check may run by default before its process is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How one check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    Skip,
    /// The check's process died before it gave a verdict (a signal, or an
    /// exit the plugin made).
    Crash,
    /// The check's process gave no sign of life for [`Options::timeout`]
    /// and was killed.
    Timeout,
}

impl Outcome {
    /// Fail, crash and timeout: what makes a run fail.
    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Fail | Outcome::Crash | Outcome::Timeout)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
            Outcome::Crash => "crash",
            Outcome::Timeout => "timeout",
        })
    }
}

fn as_millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
}

fn as_secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The result of one check (for one mechanism, when it is per mechanism).
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    /// Stable name, one of [`CHECKS`].
    pub name: &'static str,
    /// The mechanism checked, for per-mechanism checks.
    pub mechanism: Option<String>,
    pub outcome: Outcome,
    /// What was seen: for a failure what is wrong, for a skip why, for a
    /// crash or timeout how the process ended and the tail of its output.
    /// Control characters other than newlines are escaped.
    pub detail: String,
    /// How long the check ran (from its start in its process to its
    /// verdict, or to the process's end).
    #[serde(rename = "duration_ms", serialize_with = "as_millis")]
    pub duration: Duration,
    /// For a crash by a signal, its name (`"SIGSEGV"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<&'static str>,
}

/// A mechanism as the plugin published it.
#[derive(Clone, Debug, Serialize)]
pub struct MechanismSummary {
    pub name: String,
    pub id: u64,
    pub device: String,
    pub capabilities: Vec<&'static str>,
}

/// How many checks ended each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub pass: usize,
    pub fail: usize,
    pub skip: usize,
    pub crash: usize,
    pub timeout: usize,
    /// The sum of the five above.
    pub total: usize,
}

impl Counts {
    /// The counts of `checks`.
    pub fn of<'a>(checks: impl IntoIterator<Item = &'a CheckResult>) -> Counts {
        let mut c = Counts::default();
        for check in checks {
            *match check.outcome {
                Outcome::Pass => &mut c.pass,
                Outcome::Fail => &mut c.fail,
                Outcome::Skip => &mut c.skip,
                Outcome::Crash => &mut c.crash,
                Outcome::Timeout => &mut c.timeout,
            } += 1;
            c.total += 1;
        }
        c
    }
}

/// The counts of one mechanism's checks (`mechanism` null: the
/// plugin-wide checks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MechanismCounts {
    pub mechanism: Option<String>,
    #[serde(flatten)]
    pub counts: Counts,
}

/// Everything one run found. Serialised, it is the JSON report of
/// `docs/conformance-json.md`.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The kit's own version.
    pub kit_version: &'static str,
    /// The library checked.
    pub plugin_path: PathBuf,
    pub plugin_name: Option<String>,
    pub plugin_version: Option<String>,
    /// The agreed ABI version (`"1.0"`), when negotiation succeeded.
    pub abi: Option<String>,
    /// The minor range the plugin declared (`"1.0..=1.0"`).
    pub plugin_abi_range: Option<String>,
    /// The per-check timeout of the run.
    #[serde(rename = "timeout_s", serialize_with = "as_secs")]
    pub timeout: Duration,
    pub mechanisms: Vec<MechanismSummary>,
    pub checks: Vec<CheckResult>,
    /// Kept equal to the counts of `checks` by the kit.
    pub counts: Counts,
    /// The same split by mechanism: the plugin-wide checks first (a null
    /// mechanism), then each mechanism checked, in the order its checks
    /// first ran. Their sums are `counts`.
    pub counts_by_mechanism: Vec<MechanismCounts>,
    /// Why the kit could not check the plugin at all (the file is missing,
    /// does not load, has no entry symbol, does not negotiate, or its
    /// descriptor cannot be read), or `None` when it got that far.
    pub could_not_run: Option<String>,
    /// True when the kit could run and no check failed, crashed or timed
    /// out (skips allowed).
    pub ok: bool,
}

impl Report {
    /// A report of a run that found nothing: `path` could not be checked
    /// because of `reason`.
    pub fn could_not_run(path: &Path, opts: &Options, reason: String) -> Report {
        let mut r = Report::empty(path, opts);
        r.could_not_run = Some(printable(&reason));
        r.settle();
        r
    }

    pub(crate) fn empty(path: &Path, opts: &Options) -> Report {
        Report {
            schema_version: SCHEMA_VERSION,
            kit_version: env!("CARGO_PKG_VERSION"),
            plugin_path: path.to_path_buf(),
            plugin_name: None,
            plugin_version: None,
            abi: None,
            plugin_abi_range: None,
            timeout: opts.timeout,
            mechanisms: Vec::new(),
            checks: Vec::new(),
            counts: Counts::default(),
            counts_by_mechanism: Vec::new(),
            could_not_run: None,
            ok: false,
        }
    }

    /// Recomputes `counts` and `ok` from `checks` and `could_not_run`.
    pub(crate) fn settle(&mut self) {
        self.counts = Counts::of(&self.checks);
        let mut names: Vec<Option<&str>> = vec![None];
        for c in &self.checks {
            if !names.contains(&c.mechanism.as_deref()) {
                names.push(c.mechanism.as_deref());
            }
        }
        self.counts_by_mechanism = names
            .into_iter()
            .map(|m| MechanismCounts {
                mechanism: m.map(str::to_string),
                counts: Counts::of(self.checks.iter().filter(|c| c.mechanism.as_deref() == m)),
            })
            .collect();
        self.ok = self.could_not_run.is_none() && !self.checks.iter().any(|c| c.outcome.is_failure());
    }

    /// True when the kit could run and no check failed, crashed or timed
    /// out.
    pub fn passed(&self) -> bool {
        self.ok
    }

    pub fn count(&self, o: Outcome) -> usize {
        self.checks.iter().filter(|c| c.outcome == o).count()
    }

    /// The checks that failed, crashed or timed out.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| c.outcome.is_failure())
    }

    /// Every result of the check called `name` (one per mechanism for
    /// per-mechanism checks).
    pub fn results(&self, name: &str) -> impl Iterator<Item = &CheckResult> + '_ {
        let name = name.to_string();
        self.checks.iter().filter(move |c| c.name == name)
    }
}

/// Knobs of a run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Check only this mechanism (plugin-wide checks still run).
    pub mechanism: Option<String>,
    /// How long a fence whose work has run may take to complete.
    pub fence_timeout: Duration,
    /// Threads of the `concurrency.*` checks.
    pub threads: usize,
    /// Operations per thread in the `concurrency.*` checks.
    pub iterations: usize,
    /// How long a check's process may go without a sign of life before it
    /// is killed and the check reported as timed out.
    pub timeout: Duration,
    /// Stalls each `concurrency.*` storm makes before it stops (after one
    /// round at least). `None`: the kit's own figures, which catch a handle
    /// table without a lock in 100 runs of 100 but cost seconds per
    /// mechanism on a correct plugin. Lower it only for runs that are not
    /// about thread safety (a compatibility matrix): fewer stalls, fewer
    /// races caught.
    pub storm_stalls: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mechanism: None,
            fence_timeout: Duration::from_secs(2),
            threads: 4,
            iterations: 1000,
            timeout: DEFAULT_TIMEOUT,
            storm_stalls: None,
        }
    }
}

/// Why no report could be made.
#[derive(Debug)]
pub enum Error {
    /// The file does not exist.
    NotFound(PathBuf),
    /// A bare file name (no `/`): `dlopen` would search for it
    /// (`LD_LIBRARY_PATH`, the loader cache), so the file checked and the
    /// file loaded could differ. The kit, like the host, takes a path.
    BareName(PathBuf),
    /// The file exists but cannot be opened, or is not a regular file.
    Unreadable { path: PathBuf, reason: String },
    /// `--mechanism` named a mechanism the plugin does not publish.
    NoSuchMechanism { name: String, available: Vec<String> },
    /// The kit could not start the process of a check (fork or pipe
    /// failed).
    Isolation(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound(p) => write!(f, "{} does not exist", p.display()),
            Error::BareName(p) => write!(
                f,
                "{} is a bare file name, which is not searched for (not in LD_LIBRARY_PATH, the loader \
                 cache or the current directory); give the plugin's path: ./{} for the file in the \
                 current directory, or an absolute path",
                p.display(),
                p.display()
            ),
            Error::Unreadable { path, reason } => write!(f, "cannot open {}: {reason}", path.display()),
            Error::NoSuchMechanism { name, available } => {
                let available: Vec<String> = available.iter().map(|a| printable(a)).collect();
                write!(
                    f,
                    "the plugin has no mechanism '{}' (it publishes: {})",
                    printable(name),
                    available.join(", ")
                )
            }
            Error::Isolation(e) => write!(f, "cannot start a check's process: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// `s` with every control character escaped (`\n`, `\r`, `\t`, `\x1b`,
/// `\u{9b}`, …): safe to print on a terminal, in one line.
pub fn printable(s: &str) -> String {
    escape(s, false)
}

/// [`printable`], but newlines stay (for multi-line details).
pub fn printable_text(s: &str) -> String {
    escape(s, true)
}

fn escape(s: &str, keep_newlines: bool) -> String {
    use std::fmt::Write;
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' if keep_newlines => out.push('\n'),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Runs every check on the plugin library at `path`, each in its own
/// process (see the crate documentation).
pub fn run(path: &Path, opts: &Options) -> Result<Report, Error> {
    run_streaming(path, opts, &mut |_| {})
}

/// [`run`], calling `on_result` with each result as its check ends (in
/// report order), before the report is complete.
pub fn run_streaming(
    path: &Path,
    opts: &Options,
    on_result: &mut dyn FnMut(&CheckResult),
) -> Result<Report, Error> {
    use std::os::unix::ffi::OsStrExt;
    if !path.as_os_str().as_bytes().contains(&b'/') {
        return Err(Error::BareName(path.to_path_buf()));
    }
    if !path.exists() {
        return Err(Error::NotFound(path.to_path_buf()));
    }
    // Opened once: every check's process loads this descriptor (inherited
    // through fork) and the export check reads it, so what is checked is
    // what was opened, even if the name is replaced during the run.
    let unreadable = |reason: String| Error::Unreadable { path: path.to_path_buf(), reason };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?;
    let meta = file.metadata().map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    checks::run(checks::Target::File { path, file: &file }, opts, on_result)
}

/// [`run_streaming`] on a plugin linked into the calling executable,
/// reached through its entry function `entry` (for a tool that carries a
/// plugin, as `memplug` carries the reference CPU plugin); `name` is how
/// the report shows it. Without a library file, the checks of the file
/// (`load.open`, `exports.only_entry_symbols`) and those that load a second
/// copy of it (`loss.*`) are skipped, saying so; every other check runs,
/// each in its own process as usual.
///
/// # Safety
/// `entry` must be a `memplug_plugin_v1` entry function (it is called as
/// the ABI says, in each check's process).
pub unsafe fn run_linked_streaming(
    entry: memplug_sdk::abi::MemplugEntryV1,
    name: &Path,
    opts: &Options,
    on_result: &mut dyn FnMut(&CheckResult),
) -> Result<Report, Error> {
    checks::run(checks::Target::Linked { entry, name }, opts, on_result)
}

#[cfg(test)]
mod tests {
    use super::{printable, printable_text, CHECKS};
    use std::collections::HashSet;

    #[test]
    fn check_names_are_unique_and_grouped() {
        let mut seen = HashSet::new();
        for c in CHECKS {
            assert!(seen.insert(c.name), "{} listed twice", c.name);
            let (group, name) = c.name.split_once('.').expect("group.name");
            assert!(!group.is_empty() && !name.is_empty(), "{}", c.name);
            assert!(
                c.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.'),
                "{}",
                c.name
            );
            assert!(!c.verifies.is_empty());
        }
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("memplug-cpu 0.1.0"), "memplug-cpu 0.1.0");
        assert_eq!(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(printable("bell\x07 del\x7f"), "bell\\x07 del\\x7f");
        assert_eq!(printable("csi\u{9b}31m"), "csi\\u{9b}31m");
        assert_eq!(printable("two\nlines\r"), "two\\nlines\\r");
        assert_eq!(printable_text("two\nlines\r\x1b"), "two\nlines\\r\\x1b");
        assert_eq!(printable("ünïcödé ✓"), "ünïcödé ✓");
        for s in [printable("\x00\x1b\u{85}\u{9f}"), printable_text("\x1b]0;title\x07")] {
            assert!(!s.chars().any(|c| c.is_control() && c != '\n'), "{s:?}");
        }
    }
}

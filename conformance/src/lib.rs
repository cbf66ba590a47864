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

mod checks;
pub mod elf;
mod os;
mod raw;
mod services;
mod sink;

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
            could_not_run: None,
            ok: false,
        }
    }

    /// Recomputes `counts` and `ok` from `checks` and `could_not_run`.
    pub(crate) fn settle(&mut self) {
        let n = |o| self.checks.iter().filter(|c| c.outcome == o).count();
        self.counts = Counts {
            pass: n(Outcome::Pass),
            fail: n(Outcome::Fail),
            skip: n(Outcome::Skip),
            crash: n(Outcome::Crash),
            timeout: n(Outcome::Timeout),
        };
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
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mechanism: None,
            fence_timeout: Duration::from_secs(2),
            threads: 4,
            iterations: 1000,
            timeout: DEFAULT_TIMEOUT,
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

/// One entry of the check list.
#[derive(Clone, Copy, Debug)]
pub struct CheckInfo {
    pub name: &'static str,
    /// Whether it runs once per mechanism.
    pub per_mechanism: bool,
    pub verifies: &'static str,
}

const fn plugin_wide(name: &'static str, verifies: &'static str) -> CheckInfo {
    CheckInfo { name, per_mechanism: false, verifies }
}

const fn per_mechanism(name: &'static str, verifies: &'static str) -> CheckInfo {
    CheckInfo { name, per_mechanism: true, verifies }
}

/// Every check, in the order a run reports them. Names are stable.
pub const CHECKS: &[CheckInfo] = &[
    plugin_wide("load.open", "the file opens as a shared library with every symbol resolved (RTLD_NOW)"),
    plugin_wide("load.entry_symbol", "memplug_plugin_v1 is defined"),
    plugin_wide(
        "exports.only_entry_symbols",
        "the dynamic symbol table exports nothing but memplug_plugin_v<N> entry symbols",
    ),
    plugin_wide(
        "negotiation.accepts_host",
        "a host speaking 1.0..=1.<newest> (a 1.2 host info with the kit's services table) gets OK, a \
         descriptor, an agreed minor in the common range, and nothing written past the host's struct_size",
    ),
    plugin_wide(
        "negotiation.host_range_above",
        "a host whose minors all lie above the plugin's is refused with VERSION_MISMATCH",
    ),
    plugin_wide(
        "negotiation.host_range_below",
        "a host range ending at the plugin's oldest minor agrees on it; one ending below it is refused \
         with VERSION_MISMATCH",
    ),
    plugin_wide(
        "negotiation.host_range_wider",
        "a host range reaching past the plugin's newest minor agrees on a minor the plugin speaks",
    ),
    plugin_wide(
        "negotiation.refuses_wrong_major",
        "hosts saying major 0 or 2 are refused with VERSION_MISMATCH",
    ),
    plugin_wide(
        "negotiation.short_host_struct",
        "host info shorter than ABI 1.0 (struct_size 0, 12) is refused with INVALID_ARGUMENT",
    ),
    plugin_wide(
        "negotiation.long_host_struct",
        "host info longer than the plugin knows, garbage after the fields the kit knows, is accepted",
    ),
    plugin_wide(
        "negotiation.host_size_respected",
        "a 24-byte (ABI 1.0/1.1) host info offering up to 1.1 or 1.<newest>, ending at an inaccessible page, \
         is negotiated without a read past its struct_size: no 1.2 services field is looked for (probed in a \
         child)",
    ),
    plugin_wide(
        "negotiation.short_out",
        "an answer struct shorter than ABI 1.0 is refused with INVALID_ARGUMENT and not written past",
    ),
    plugin_wide(
        "negotiation.null_arguments",
        "NULL host info or NULL answer is refused with INVALID_ARGUMENT (probed in a child)",
    ),
    plugin_wide(
        "descriptor.plugin",
        "plugin struct_size, major 1, minor range, name, version, live_objects, mechanism list",
    ),
    plugin_wide(
        "descriptor.mechanisms",
        "every mechanism: struct_size, name (NUL-terminated UTF-8), non-zero id; ids and names unique",
    ),
    per_mechanism(
        "descriptor.capabilities",
        "allocator flag and pointer present; every optional flag agrees with its pointer; \
         MEMPLUG_CAP_SHARED_EXPORT only with shared mapping and an agreed minor >= 1, \
         MEMPLUG_CAP_TYPED_EXPORT only with shared mapping and an agreed minor >= 2; no bit the plugin's \
         newest minor does not define",
    ),
    per_mechanism(
        "descriptor.minor_0_is_1_0",
        "negotiated with a host speaking only 1.0, the mechanism's descriptor sets no capability bit a later \
         minor added (MEMPLUG_CAP_SHARED_EXPORT, MEMPLUG_CAP_TYPED_EXPORT)",
    ),
    per_mechanism(
        "descriptor.minor_1_is_1_1",
        "negotiated with a host speaking 1.0..=1.1, the mechanism's descriptor sets no capability bit 1.2 \
         added (MEMPLUG_CAP_TYPED_EXPORT), and properties asked at the 1.1 size write nothing of the 1.2 \
         memory descriptor past it",
    ),
    per_mechanism(
        "descriptor.device",
        "the device kind is one the agreed minor defines: 1.0's CPU and CUDA below 1.2; at 1.2 every DLPack \
         kind or one in the vendor range",
    ),
    per_mechanism(
        "descriptor.vtables",
        "each published sub-vtable is at least its 1.0 size with every required slot non-NULL",
    ),
    per_mechanism(
        "descriptor.properties",
        "properties (at the 1.2 size when the agreed minor is 2): OK, alignments and granularity powers of \
         two, min <= max, nothing written past struct_size",
    ),
    per_mechanism(
        "descriptor.memory_descriptor",
        "ABI 1.2: properties write the memory descriptor, and it is self-consistent: recommended_granularity \
         zero or a power-of-two multiple of the granularity; page sizes this kernel offers (CPU) or plausible, \
         the smallest no larger than the granularity; attributes, export kinds and flags of known bits, \
         HOST_COHERENT only when host-visible; export kinds only with shared mapping and an export slot, \
         at least one with MEMPLUG_CAP_TYPED_EXPORT, a descriptor kind with MEMPLUG_CAP_SHARED_EXPORT; \
         location kind known or a vendor's, its id zero where it names nothing, an existing NUMA node",
    ),
    per_mechanism(
        "descriptor.identity",
        "ABI 1.2, when the mechanism points at an identity: struct_size >= 48, only known valid bits, fields \
         not named in valid zero, a non-nil UUID, a PCI address in range, an existing NUMA node (a CPU \
         device's ordinal)",
    ),
    per_mechanism(
        "descriptor.page_size_requests",
        "ABI 1.2: allocate, reserve and create naming a page size the mechanism does not publish, or no power \
         of two, are refused with INVALID_ARGUMENT and make nothing; naming the smallest one it publishes they \
         are served",
    ),
    per_mechanism(
        "allocator.usable",
        "an allocation is at least the size asked, non-NULL, readable and writable (CPU), and frees",
    ),
    per_mechanism(
        "allocator.alignment",
        "every power of two from 1 to max_alignment is honoured (and min_alignment always)",
    ),
    per_mechanism(
        "allocator.bad_alignment",
        "alignments 0, 3 and 2 * max_alignment are refused with INVALID_ARGUMENT, nothing allocated",
    ),
    per_mechanism("allocator.zero_size", "size 0 is refused with INVALID_ARGUMENT, nothing allocated"),
    per_mechanism(
        "allocator.huge_size",
        "sizes 2^62, 2^63 and 2^64-1 are refused with OUT_OF_MEMORY or INVALID_ARGUMENT, no crash",
    ),
    per_mechanism(
        "allocator.unknown_flags",
        "request flags unknown to 1.0 are refused with INVALID_ARGUMENT",
    ),
    per_mechanism(
        "allocator.memory_info",
        "memory_info, when published, is OK with 0 < total and free <= total (a published slot must not \
         answer UNSUPPORTED)",
    ),
    per_mechanism(
        "allocator.class_tags",
        "ABI 1.1: requests tagged with every class, and an unknown class, are served alike",
    ),
    per_mechanism(
        "allocator.block_size_sane",
        "allocate (4 KiB), reserve and create report request <= size <= round_up(request, max(granularity, \
         max_alignment, 4096)) + max(granularity, 2 MiB)",
    ),
    per_mechanism(
        "structs.short_host_structs",
        "requests, object references and outputs shorter than 1.0 are refused with INVALID_ARGUMENT and \
         change nothing",
    ),
    per_mechanism(
        "structs.long_host_structs",
        "requests and object references longer than 1.0, garbage after the prefix, are accepted",
    ),
    per_mechanism(
        "identity.wrong_mechanism",
        "a reference naming another mechanism id is refused with WRONG_MECHANISM; live_objects unchanged",
    ),
    per_mechanism(
        "identity.wrong_device",
        "a reference or request naming another device is refused with WRONG_DEVICE; live_objects unchanged",
    ),
    per_mechanism(
        "identity.unknown_allocation",
        "forged handles, never-issued handles and altered object ids are refused with UNKNOWN_ALLOCATION",
    ),
    per_mechanism(
        "identity.double_free",
        "freeing twice is refused with UNKNOWN_ALLOCATION; live_objects unchanged",
    ),
    per_mechanism(
        "identity.reservation",
        "reservations: forged, foreign and released references are refused with their codes",
    ),
    per_mechanism(
        "identity.no_overlap",
        "64 live allocations of mixed sizes and 4 live reservations: no two address ranges overlap (and, on \
         CPU devices, no two show the same memory)",
    ),
    per_mechanism(
        "virtual_backing.reserve",
        "reserve: granularity-aligned address, size rounded up to the granularity, nothing committed; \
         zero and huge sizes refused",
    ),
    per_mechanism(
        "virtual_backing.accounting",
        "committed_bytes is exact through commits, decommits and release",
    ),
    per_mechanism(
        "virtual_backing.residency",
        "committed pages are mapped read-write and resident once touched; decommitted pages are \
         inaccessible and not resident; a recommit reads zeros (CPU devices)",
    ),
    per_mechanism(
        "virtual_backing.out_of_range",
        "ranges past the end, overflowing, unaligned or empty are refused with OUT_OF_RANGE; committed_bytes \
         unchanged",
    ),
    per_mechanism(
        "virtual_backing.invalid_state",
        "double commit and decommit of uncommitted pages are refused with INVALID_STATE; nothing changes",
    ),
    per_mechanism(
        "virtual_backing.release_drops_mappings",
        "releasing a reservation that still has shared mappings drops their references: the object's own \
         release then brings live_objects back",
    ),
    per_mechanism(
        "shared_mapping.create",
        "create: size rounded up, address zero, zero and huge sizes refused; release frees it",
    ),
    per_mechanism(
        "shared_mapping.coherence",
        "a write through one view is read through another, including at an object offset (at 1.2 only with \
         MEMPLUG_PROP_MAPS_AT_OFFSETS: objects are otherwise mapped whole)",
    ),
    per_mechanism(
        "shared_mapping.read_only",
        "a read-only view reads the object, and a write through it kills a forked child with SIGSEGV or \
         SIGBUS",
    ),
    per_mechanism(
        "shared_mapping.invalid_state",
        "mapping over committed or mapped pages is refused with INVALID_STATE; unmapping what is not a \
         mapping is refused",
    ),
    per_mechanism(
        "shared_mapping.mapped_not_committed",
        "committed_bytes counts what commit committed and never a mapped range, before and after unmap",
    ),
    per_mechanism(
        "shared_mapping.out_of_range",
        "object or reservation ranges out of bounds are refused with OUT_OF_RANGE",
    ),
    per_mechanism(
        "shared_mapping.unknown_access",
        "access other than READ or READ|WRITE is refused with INVALID_ARGUMENT",
    ),
    per_mechanism(
        "shared_mapping.references",
        "an object lives while created, retained or mapped references remain; a release too many is \
         refused",
    ),
    per_mechanism(
        "shared_mapping.export_import",
        "ABI 1.1 MEMPLUG_CAP_SHARED_EXPORT: an exported descriptor imports as an object showing the same \
         memory; bad descriptors, oversized imports and forged exports are refused",
    ),
    per_mechanism(
        "shared_mapping.export_is_fresh_fd",
        "ABI 1.1: each export_fd is a new descriptor (never 0, 1 or 2): two differ, closing one leaves the \
         other usable, and it stays open on the same memory after the object's release and further calls",
    ),
    per_mechanism(
        "shared_mapping.physical_identity",
        "map, retain, release and export_fd of a physical object naming another mechanism, another device, \
         a forged handle, another object id or size, or a released object are refused with their codes; \
         nothing changes",
    ),
    per_mechanism(
        "shared_mapping.typed_export",
        "ABI 1.2 MEMPLUG_CAP_TYPED_EXPORT: for each kind export_types offers, an object made exportable as it \
         exports as a handle of that kind (a MEMFD a new /memfd: descriptor, two exports two descriptors), \
         nothing written past the handle's struct_size, and imports as an object showing the same memory",
    ),
    per_mechanism(
        "shared_mapping.typed_export_refusals",
        "ABI 1.2 MEMPLUG_CAP_TYPED_EXPORT: export_handle of a kind not offered (or unknown) is UNSUPPORTED, of \
         no kind or two kinds refused, of a forged object UNKNOWN_ALLOCATION; import_handle of a kind not \
         offered UNSUPPORTED, of a descriptor kind with fd -1 INVALID_ARGUMENT; nothing made",
    ),
    per_mechanism(
        "shared_mapping.export_kinds_requested",
        "ABI 1.2: create naming an export kind the mechanism does not offer is refused with UNSUPPORTED and \
         makes nothing; naming one it offers is served",
    ),
    per_mechanism(
        "claims.read_only_enforced",
        "ABI 1.2, MEMPLUG_ATTR_READ_ONLY_ENFORCED claimed (host-visible memory): a read-only view of a physical \
         object is mapped without write access and a write through it kills a forked child with SIGSEGV or \
         SIGBUS, leaving the object unchanged",
    ),
    per_mechanism(
        "claims.zero_filled",
        "ABI 1.2, MEMPLUG_ATTR_ZERO_FILLED claimed (host-visible memory): new allocations (also reusing freed, \
         dirtied memory), committed and recommitted ranges and new physical objects read as zero",
    ),
    per_mechanism(
        "claims.page_size_used",
        "ABI 1.2, a CPU mechanism claiming pages larger than the base page: a reservation made with each such \
         page size (up to 64 MiB), committed and touched, is backed by pages of that size (/proc/self/smaps: \
         KernelPageSize, or transparent huge pages)",
    ),
    per_mechanism(
        "sync.streams",
        "streams are created and destroyed; destroy waits for submitted work; a second destroy is refused",
    ),
    per_mechanism("sync.in_order", "host functions run in the order they were enqueued"),
    per_mechanism(
        "sync.fence_orders",
        "a fence behind a sleeping host function is NOT_READY until the function ran, then OK",
    ),
    per_mechanism(
        "sync.wait_timeout",
        "waiting on a fence behind blocked work returns TIMEOUT after about the timeout, then OK",
    ),
    per_mechanism(
        "sync.unknown_fence",
        "a fence handle never recorded, or already destroyed, is refused with UNKNOWN_ALLOCATION",
    ),
    per_mechanism("sync.stream_adopt", "stream_adopt, when published, refuses a NULL native stream"),
    per_mechanism(
        "sync.fence_after_stream_destroy",
        "fences recorded on a stream stay valid after stream_destroy, report complete, and destroy",
    ),
    per_mechanism(
        "sync.wait_forever",
        "fence_wait(UINT64_MAX) on a fence behind ~50 ms of work returns OK, never TIMEOUT (under a \
         watchdog)",
    ),
    per_mechanism(
        "sync.fence_monotonic",
        "once a fence reported complete (query or wait) every later query reports complete, also while later \
         work on its stream is blocked",
    ),
    per_mechanism(
        "sync.enqueue_refusal",
        "a host function whose enqueue_host_fn was refused (stream 0, never made, forged, destroyed) never \
         runs; an accepted one runs exactly once",
    ),
    per_mechanism(
        "concurrency.allocator",
        "several threads allocating and freeing at once: every call succeeds, no two live blocks overlap, \
         live_objects balances",
    ),
    per_mechanism(
        "concurrency.virtual_backing",
        "several threads reserving, committing, decommitting and releasing at once balance",
    ),
    per_mechanism(
        "concurrency.sync",
        "several threads with their own streams and fences at once complete and balance",
    ),
    per_mechanism(
        "concurrency.shared_mapping",
        "several threads creating, mapping into their own reservations, unmapping, retaining and releasing \
         physical objects at once: every call succeeds, live_objects balances",
    ),
    per_mechanism(
        "loss.reported_through_services",
        "ABI 1.2, with a device-loss test trigger exported (LOSS_TRIGGERS), on a fresh instance: triggering the \
         loss delivers a report through the kit's services naming the mechanism, with a UTF-8 (pointer, length) \
         reason, and no report of a mechanism the plugin does not publish",
    ),
    per_mechanism(
        "loss.every_slot_device_lost",
        "ABI 1.2, with a test trigger: after the reported loss every published slot of the mechanism, called \
         with objects made before it, answers DEVICE_LOST (none OK), writes no output, runs no host function, \
         and nothing crashes or hangs",
    ),
    per_mechanism(
        "lifecycle.live_objects",
        "live_objects counts every allocation, reservation, physical object, stream and fence exactly",
    ),
    plugin_wide(
        "loss.negotiation_reports",
        "a fresh instance negotiating with a 1.2 host calls no service during the entry (answered \
         INVALID_STATE), or re-reports once it returned or keeps the mechanism working; no service at a minor \
         below 1.2; reports name only published mechanisms, with valid reasons",
    ),
    plugin_wide(
        "loss.unknown_mechanism",
        "ABI 1.2, with a test trigger: triggering an id the plugin does not publish is refused, reports nothing \
         and latches no mechanism (the trigger then works for a published one)",
    ),
    plugin_wide("messages.present", "every refused call explained itself through the sink"),
    plugin_wide(
        "messages.bounded",
        "every message is at most MEMPLUG_MESSAGE_MAX bytes of UTF-8 with a non-NULL pointer",
    ),
    plugin_wide("messages.calling_thread", "every message was written on the thread that made the call"),
    plugin_wide(
        "messages.null_sink",
        "refused calls with a NULL sink, or a sink whose write is NULL, do not crash (probed in a child)",
    ),
    plugin_wide("structs.writes_within_size", "no call wrote an output past the struct_size the host set"),
    plugin_wide("structs.out_untouched_on_failure", "no failed call changed its output"),
    plugin_wide(
        "lifecycle.unload_ready",
        "live_objects is 0 once everything the kit made is released (then unload is called)",
    ),
];

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
    checks::run(path, &file, opts, on_result)
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

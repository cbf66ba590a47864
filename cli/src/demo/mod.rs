//! `memplug demo`: a scripted LLM-serving scenario on the reference CPU
//! plugin, under a hard budget, that shows every part of memplug at work
//! and checks it against what the kernel says.
//!
//! The story (a few seconds, debug build included):
//!
//! 1. A 64 MiB pool for cpu:0 and two holders: `weights` (priority 1; on a
//!    pressure ticket it evicts its least recently used expert shards) and
//!    `kv` (priority 10; live sequences are never dropped, so it answers 0).
//! 2. Weights load: 2 pinned shards and 8 expert shards of 4 MiB, every page
//!    written.
//! 3. One shared system-prompt prefix (`create_shared`), mapped read-only
//!    into every request's region (`reserve_virtual` + `map_prefix`); each
//!    request decodes token by token, writing each token's KV, and its
//!    region grows by a 2 MiB block (`grow_to`) at a stable address when
//!    the next token does not fit.
//! 4. The budget runs out: growth sends tickets to `weights`, which evicts
//!    cold experts so decoding goes on.
//! 5. A finished request's region is dropped while a host function on a
//!    CPU stream still reads it: the free waits behind a `PluginFence`
//!    (queue pending 1, charge kept), then retires (pending 0, refunded).
//! 6. A request admitted by the scheduler (no holder: it may ask every
//!    holder) asks for more than anyone can give: `weights` gives what it
//!    can, `kv` answers 0, and the grow fails with `OutOfBudget`, leaving
//!    the old view; a smaller retry succeeds.
//! 7. An expert shard held as a region is offloaded to a host pool when a
//!    long prefill runs the device pool short, and restored at the same
//!    address, bytes intact ([`offload`]).
//! 8. Copy-on-write: one of three requests mapping the system prompt
//!    diverges inside its last block and gets a private copy of that block
//!    (`privatise`); the other two keep reading the shared one.
//! 9. The device is lost mid-decode ([`loss`]): a new batch decodes next to
//!    the pinned weights when the context is lost (declared by the
//!    runtime, or, with `MEMPLUG_CPU_TEST_SWITCHES=1`, reported by the CPU
//!    plugin through its test switch); `weights` and `kv` receive the
//!    `Lost` event with a notice per binding; the context terminates and
//!    settles every binding's charge exactly once; the lost handles are
//!    inert; the requests continue, re-prefilled, on a replacement (the
//!    copy of the CPU plugin linked into `memplug`, registered once the
//!    lost plugin is unregistered: a registry holds one plugin per name).
//! 10. Teardown, drain, a ledger that ends at zero (and balances: the one
//!     discharge is the settlement), and the plugin unloads.
//!
//! Next to the governor's figures, the demo measures resident memory
//! through the kernel: `/proc/self/pagemap` page by page over the live
//! objects' address ranges (exact), and `/proc/self/smaps` over the whole
//! process (a delta since the start, with a tolerance). Any failed check
//! makes the command exit non-zero.
//!
//! The steps are [`timeline::SCENES`], in this order.
//!
//! The code follows that split: [`story`] is the script (steps 1–10 and
//! the checks they make), [`offload`] its steps 7 and 8, [`loss`] its step 9, [`serving`] the parts it moves (the weights
//! holder, requests and their KV regions, decoding), [`measure`] the
//! kernel's view (`/proc/self/pagemap`, `/proc/self/smaps`) next to the
//! governor's, [`timeline`] the scenes and events they record, and
//! [`report`] the ledger, the checks and the text and `--json` output;
//! [`plot`] draws the timeline (`--plot`), [`trace`] writes it as a trace
//! (`--trace`).

mod loss;
mod loss_report;
mod measure;
mod offload;
mod plot;
mod report;
mod serving;
mod session;
mod story;
mod timeline;
mod trace;

use crate::exit::{COULD_NOT_RUN, FAILED, OK, USAGE};
use crate::output::{complain, Stdout};
use crate::schema::{self, CouldNotRun};
use memplug_host::governor::Priority;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The pool's hard capacity.
const CAPACITY: u64 = 64 * MIB;
/// One weight shard.
const SHARD: u64 = 4 * MIB;
/// Shards never evicted (the dense part of the model).
const PINNED: [&str; 2] = ["embed+attn", "lm_head"];
/// Evictable expert shards.
const EXPERTS: usize = 8;
/// The shared system-prompt prefix.
const PREFIX: u64 = 2 * MIB;
/// KV bytes per token, and tokens per decode step: one step grows a region
/// by `STEP` bytes (a multiple of any page size up to 2 MiB).
const KV_PER_TOKEN: u64 = 128 * KIB;
const TOKENS_PER_STEP: u64 = 16;
const STEP: u64 = KV_PER_TOKEN * TOKENS_PER_STEP;
/// Address space each request reserves (nothing is committed up front).
const REGION_MAX: u64 = 64 * MIB;
/// Requests decoded round-robin, and their decode steps.
const REQUESTS: usize = 4;
const DECODE_STEPS: usize = 4;
/// The late request's prefill chunks: the first fits after evictions, the
/// second cannot fit (pinned weights and live KV leave too little), the
/// retry does.
const PREFILL: u64 = 16 * MIB;
const PREFILL_TOO_BIG: u64 = 16 * MIB;
const PREFILL_RETRY: u64 = 8 * MIB;
/// How long the host function "still reads" a finished request's KV.
const KERNEL_MS: u64 = 150;
const WEIGHTS_PRIORITY: Priority = Priority(1);
const KV_PRIORITY: Priority = Priority(10);

/// One 64-byte line of the system prompt, repeated over the prefix (64
/// divides every page size, so each page holds whole lines).
const SYSTEM_PROMPT: &[u8; 64] = b"<|system|> You are memplug-bot, a helpful assistant. Be brief. \n";

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn signed_mib(b: i64) -> String {
    format!("{}{}", if b < 0 { "-" } else { "" }, mib(b.unsigned_abs()))
}

fn mib(b: u64) -> String {
    if b % MIB == 0 {
        format!("{} MiB", b / MIB)
    } else {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    }
}

/// The arguments of `memplug demo`.
pub struct Args {
    pub json: bool,
    /// `--plot FILE.svg`.
    pub plot: Option<PathBuf>,
    /// `--trace FILE`.
    pub trace: Option<PathBuf>,
}

/// An output file, created before the run: a path that cannot be written
/// is a usage error, found before the demo rather than after it.
struct OutFile {
    path: PathBuf,
    file: File,
}

impl OutFile {
    fn create(path: &Option<PathBuf>, what: &str) -> Result<Option<OutFile>, String> {
        let Some(path) = path else { return Ok(None) };
        match File::create(path) {
            Ok(file) => Ok(Some(OutFile { path: path.clone(), file })),
            Err(e) => Err(format!("cannot create the {what} {}: {e}", path.display())),
        }
    }

    /// Writes `content`; false (said on stderr) when it could not.
    fn write(mut self, what: &str, content: Result<String, String>) -> bool {
        let written = content.and_then(|c| {
            self.file.write_all(c.as_bytes()).and_then(|()| self.file.flush()).map_err(|e| e.to_string())
        });
        match written {
            Ok(()) => true,
            Err(e) => {
                complain(&format!("cannot write the {what} {}: {e}", self.path.display()));
                false
            }
        }
    }
}

/// The CPU plugin's allocations come from the C allocator. glibc raises
/// its mmap threshold each time an mmapped block is freed, so after the
/// weights holder evicts a 4 MiB shard the next blocks of that size come
/// from the heap, and freeing them keeps their pages in the process: the
/// governor refunds bytes the kernel still counts. A fixed threshold turns
/// that adjustment off: blocks of 1 MiB and more are mapped, and unmapped
/// when freed.
fn fix_malloc_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; called before
    // the demo allocates anything it measures.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, (MIB as i32).max(1));
    }
}

/// `memplug demo [--json] [--plot FILE.svg] [--trace FILE]`; returns the
/// exit status.
pub fn run(args: Args) -> u8 {
    let mut out = Stdout::default();
    let files = OutFile::create(&args.plot, "chart")
        .and_then(|p| OutFile::create(&args.trace, "trace").map(|t| (p, t)));
    let (plot, trace) = match files {
        Ok(f) => f,
        Err(why) => {
            complain(&why);
            return USAGE;
        }
    };
    fix_malloc_threshold();
    let report = match story::scenario() {
        Ok(r) => r,
        Err(e) => {
            let why = format!("demo: {e}");
            if args.json {
                if let Ok(s) =
                    schema::to_json(&CouldNotRun::new(schema::DEMO, &why, report::Counts::default()))
                {
                    out.write(&s);
                }
            }
            complain(&why);
            // Nothing to draw: leave no empty chart or trace behind.
            for f in [plot, trace].into_iter().flatten() {
                let _ = std::fs::remove_file(&f.path);
            }
            return COULD_NOT_RUN;
        }
    };
    if args.json {
        match schema::to_json(&report) {
            Ok(s) => out.write(&s),
            Err(e) => complain(&format!("cannot write the JSON document: {e}")),
        }
    } else {
        out.write(&report::render_text(&report));
    }
    let mut written = true;
    if let Some(f) = plot {
        written &= f.write("chart", plot::svg(&report));
    }
    if let Some(f) = trace {
        written &= f.write("trace", schema::to_json(&trace::trace(&report)).map_err(|e| e.to_string()));
    }
    let failed: Vec<&str> = report.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    if !failed.is_empty() {
        complain(&format!("demo: {} check(s) failed: {}", failed.len(), failed.join(", ")));
        return FAILED;
    }
    out.status(if written { OK } else { FAILED })
}

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
//! 7. The device is lost mid-decode ([`loss`]): a new batch decodes next to
//!    the pinned weights when the context is lost (declared by the
//!    runtime, or, with `MEMPLUG_CPU_TEST_SWITCHES=1`, reported by the CPU
//!    plugin through its test switch); `weights` and `kv` receive the
//!    `Lost` event with a notice per binding; the context terminates and
//!    settles every binding's charge exactly once; the lost handles are
//!    inert; the requests continue, re-prefilled, on a replacement (the
//!    copy of the CPU plugin linked into `memplug`, registered once the
//!    lost plugin is unregistered: a registry holds one plugin per name).
//! 8. Teardown, drain, a ledger that ends at zero (and balances: the one
//!    discharge is the settlement), and the plugin unloads.
//!
//! Next to the governor's figures, the demo measures resident memory
//! through the kernel: `/proc/self/pagemap` page by page over the live
//! objects' address ranges (exact), and `/proc/self/smaps` over the whole
//! process (a delta since the start, with a tolerance). Any failed check
//! makes the command exit non-zero.
//!
//! The code follows that split: [`story`] is the script (steps 1–8 and
//! the checks they make) and [`loss`] its step 7, [`serving`] the parts it moves (the weights
//! holder, requests and their KV regions, decoding), [`measure`] the
//! kernel's view (`/proc/self/pagemap`, `/proc/self/smaps`) next to the
//! governor's, and [`report`] the timeline, the ledger, the checks and the
//! text and `--json` output.

mod loss;
mod loss_report;
mod measure;
mod report;
mod serving;
mod session;
mod story;
mod timeline;

use memplug_host::governor::Priority;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::error::Error;
use std::io::Write as _;
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

/// `memplug demo [--json]`.
pub fn run(json: bool) -> Result<(), Box<dyn Error>> {
    let report = story::scenario()?;
    let text = if json { report::render_json(&report)? } else { report::render_text(&report) };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // A reader that stopped early (`| head`) is not a failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    let failed: Vec<&str> = report.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("demo: {} check(s) failed: {}", failed.len(), failed.join(", ")).into())
    }
}

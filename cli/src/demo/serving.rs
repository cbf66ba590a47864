//! What the story moves: the weights holder (expert shards evicted least
//! recently used first under pressure), requests with their KV regions,
//! token-by-token decoding that grows a region at a stable address, and the
//! read-backs that prove the bytes (KV and the shared prefix) intact.

use super::timeline::Recorder;
use super::{lock, mib, KV_PER_TOKEN, PREFIX, REGION_MAX, SHARD, STEP, SYSTEM_PROMPT};
use memplug_host::governor::PressureTicket;
use memplug_host::{BindingError, GrowError, MemoryBinding, OwnedAllocation, Region, SharedPrefix};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

// ----- the weights holder --------------------------------------------------------

pub(super) struct Shard {
    pub(super) name: String,
    pub(super) pinned: bool,
    pub(super) alloc: OwnedAllocation,
    /// Decode tick (tokens decoded so far) of the last use: LRU order.
    pub(super) last_used: u64,
}

/// The weights holder: owns the shards; under pressure evicts the least
/// recently used unpinned ones until it released what the ticket wants.
pub(super) struct Weights {
    pub(super) shards: Mutex<Vec<Shard>>,
    pub(super) rec: Arc<Recorder>,
}

impl Weights {
    pub(super) fn on_ticket(&self, t: &PressureTicket) -> u64 {
        let mut victims = Vec::new();
        let mut released = 0;
        {
            let mut shards = lock(&self.shards);
            while released < t.bytes_wanted {
                // A shard that went with a lost device frees nothing.
                let coldest = shards
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.pinned && !s.alloc.is_lost())
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(i, _)| i);
                let Some(i) = coldest else { break };
                let s = shards.remove(i);
                released += s.alloc.charged();
                victims.push(s);
            }
        }
        let answer = if victims.is_empty() {
            "answers 0: only pinned shards left".to_string()
        } else {
            format!("answers {} (evicts {} LRU expert(s))", mib(released), victims.len())
        };
        self.rec.log("ticket", "weights", format!("{} → {answer}", self.rec.ticket_text(t)));
        // Release outside our lock: the drop frees through the plugin and
        // refunds the pool (re-entering the governor is allowed here).
        for v in victims {
            let (name, last, bytes) = (v.name, v.last_used, v.alloc.charged());
            drop(v.alloc);
            self.rec.log(
                "evict",
                "weights",
                format!("{name} freed ({}, last used at token {last})", mib(bytes)),
            );
        }
        released
    }

    /// Loads `names` (`(name, pinned)`) as shards of `SHARD` bytes through
    /// `b`, aligned to `align`, writing every page (the `i`-th of `names`
    /// holds byte `0x10 + i`, so a reload writes what the first load did).
    pub(super) fn load(
        &self,
        b: &MemoryBinding,
        names: impl IntoIterator<Item = (String, bool)>,
        align: u64,
    ) -> Result<(), BindingError> {
        for (i, (name, pinned)) in names.into_iter().enumerate() {
            let alloc = b.allocate(SHARD, align)?;
            // SAFETY: a fresh CPU allocation of SHARD bytes, ours alone.
            unsafe { std::slice::from_raw_parts_mut(alloc.addr() as *mut u8, SHARD as usize) }
                .fill(0x10 + i as u8);
            lock(&self.shards).push(Shard { name, pinned, alloc, last_used: 0 });
        }
        Ok(())
    }

    /// Marks the shards one token uses (the pinned ones and the router's
    /// choice among the resident experts) and reads a byte of each.
    pub(super) fn route(&self, tick: u64, request: usize) {
        let mut shards = lock(&self.shards);
        let experts: Vec<usize> = (0..shards.len()).filter(|&i| !shards[i].pinned).collect();
        let mut used: Vec<usize> = (0..shards.len()).filter(|&i| shards[i].pinned).collect();
        if !experts.is_empty() {
            used.push(experts[(tick as usize * 3 + request) % experts.len()]);
        }
        for i in used {
            let s = &mut shards[i];
            s.last_used = tick;
            // SAFETY: a live CPU allocation of at least one byte.
            let _ = unsafe { std::ptr::read_volatile(s.alloc.addr() as *const u8) };
        }
    }

    pub(super) fn ranges(&self) -> Vec<(u64, u64)> {
        lock(&self.shards).iter().map(|s| (s.alloc.addr(), s.alloc.size())).collect()
    }
}

// ----- requests ------------------------------------------------------------------

pub(super) struct Request {
    pub(super) name: String,
    pub(super) region: Region,
    pub(super) addr: u64,
    pub(super) kv_byte: u8,
    /// Tokens whose KV is written.
    pub(super) tokens: u64,
}

impl Request {
    /// The private (KV) part: after the prefix, up to the usable length.
    pub(super) fn private_range(&self) -> (u64, u64) {
        let base = self.region.len() - self.region.committed();
        (self.addr + base, self.region.committed())
    }
    pub(super) fn prefix_range(&self) -> (u64, u64) {
        (self.addr, self.region.len() - self.region.committed())
    }
}

/// The system prompt's KV: one shared object of `PREFIX` bytes made on
/// `b`, filled with the prompt's lines through its temporary writable view.
pub(super) fn system_prompt(b: &MemoryBinding) -> Result<Arc<SharedPrefix>, BindingError> {
    b.create_shared(PREFIX, |v| {
        // SAFETY: the temporary writable view of the new object.
        for line in unsafe { v.as_mut_slice() }.chunks_mut(SYSTEM_PROMPT.len()) {
            line.copy_from_slice(&SYSTEM_PROMPT[..line.len()]);
        }
    })
}

/// Admits request `name`: reserves its region on `b`, maps `prefix`
/// read-only at its start and reads the system prompt back through it.
pub(super) fn admit(
    name: String,
    b: &MemoryBinding,
    prefix: &Arc<SharedPrefix>,
    kv_byte: u8,
    tally: &mut Tally,
) -> Result<Request, BindingError> {
    let mut region = b.reserve_virtual(REGION_MAX)?;
    region.map_prefix(prefix)?;
    let r = Request { addr: region.addr(), name, region, kv_byte, tokens: 0 };
    tally.admitted += 1;
    tally.prefix_reads += 1;
    if prefix_intact(&r) {
        tally.prefix_ok += 1;
    }
    Ok(r)
}

#[derive(Default)]
pub(super) struct Tally {
    /// Tokens decoded, all requests together (the LRU clock).
    pub(super) tokens: u64,
    pub(super) grows: u64,
    pub(super) stable: u64,
    pub(super) unstable: Vec<String>,
    /// Regions admitted (each maps the prefix and reads it back).
    pub(super) admitted: u64,
    pub(super) prefix_reads: u64,
    pub(super) prefix_ok: u64,
}

/// Grows `r` by `delta` bytes as one transaction. With `fill`, the update
/// writes `r`'s KV byte into every new page (a prefill chunk); without, the
/// block is left for the tokens that follow.
pub(super) fn grow(
    r: &mut Request,
    delta: u64,
    fill: bool,
    tally: &mut Tally,
) -> Result<(), GrowError<Infallible>> {
    let old = r.region.len();
    let byte = r.kv_byte;
    let mut seen = 0u64;
    r.region.grow_to(old + delta, |view| {
        seen = view.addr;
        if fill {
            // SAFETY: CPU memory; [old, view.len) was just committed
            // writable and belongs to this region alone.
            unsafe {
                std::slice::from_raw_parts_mut((view.addr + old) as *mut u8, (view.len - old) as usize)
            }
            .fill(byte);
        }
        Ok(())
    })?;
    tally.grows += 1;
    if seen == r.addr && r.region.addr() == r.addr {
        tally.stable += 1;
    } else {
        tally.unstable.push(format!("{} moved from {:#x} to {:#x}", r.name, r.addr, r.region.addr()));
    }
    Ok(())
}

/// Decodes `n` tokens one at a time: each token's KV goes right after the
/// previous one's; when the region has no room for it, the region grows by
/// one block of `STEP` bytes first. Returns the blocks grown.
pub(super) fn decode(
    r: &mut Request,
    n: u64,
    weights: &Weights,
    lane: usize,
    tally: &mut Tally,
) -> Result<u64, GrowError<Infallible>> {
    let mut blocks = 0;
    for _ in 0..n {
        let tick = tally.tokens + 1;
        weights.route(tick, lane);
        let (start, committed) = r.private_range();
        let used = r.tokens * KV_PER_TOKEN;
        if used + KV_PER_TOKEN > committed {
            grow(r, STEP, false, tally)?;
            blocks += 1;
        }
        // SAFETY: CPU memory inside the committed private part of `r`.
        unsafe { std::slice::from_raw_parts_mut((start + used) as *mut u8, KV_PER_TOKEN as usize) }
            .fill(r.kv_byte);
        r.tokens += 1;
        tally.tokens = tick;
    }
    Ok(blocks)
}

/// Scratch comparisons use this stack buffer, never the heap: the heap is
/// part of what the smaps measurement sees.
const CHUNK: usize = 4096;

/// Whether `len` bytes at `addr` repeat `line` (a divisor of `CHUNK`),
/// compared a chunk at a time.
///
/// # Safety
/// The range must be mapped readable.
pub(super) unsafe fn repeats(addr: u64, len: u64, line: &[u8]) -> bool {
    let mut pattern = [0u8; CHUNK];
    for c in pattern.chunks_mut(line.len()) {
        c.copy_from_slice(line);
    }
    let s = std::slice::from_raw_parts(addr as *const u8, len as usize);
    s.chunks(CHUNK).all(|c| c == &pattern[..c.len()])
}

/// Whether `len` bytes at `addr` all hold `byte`.
///
/// # Safety
/// The range must be mapped readable.
pub(super) unsafe fn filled_with(addr: u64, len: u64, byte: u8) -> bool {
    repeats(addr, len, &[byte])
}

/// Reads the prefix through `r`'s read-only mapping.
pub(super) fn prefix_intact(r: &Request) -> bool {
    let (addr, len) = r.prefix_range();
    // SAFETY: mapped read-only for the region's life.
    len == PREFIX && unsafe { repeats(addr, len, SYSTEM_PROMPT) }
}

pub(super) fn kv_intact(r: &Request) -> bool {
    let (addr, len) = r.private_range();
    // SAFETY: the committed private part of a live region.
    unsafe { filled_with(addr, len, r.kv_byte) }
}

//! Embedding the memplug host in a Rust runtime, on the reference CPU
//! plugin, in four scenes that share one pool of 16 MiB:
//!
//! 1. a KV cache grows token block by token block inside one reserved
//!    region whose address never moves, and a grow whose block-table update
//!    refuses rolls back;
//! 2. a system-prompt prefix is made once, charged once, and mapped
//!    read-only at the start of two requests' regions;
//! 3. a weights holder evicts its least recently used experts when a KV
//!    grow finds the pool full;
//! 4. an allocation is freed only after the runtime fence of the work
//!    still reading it.
//!
//! Each scene prints what happens and asserts what it shows; a broken
//! invariant panics, and the program exits non-zero. At the end every
//! charge has been refunded and the plugin unloads.
//!
//! ```sh
//! cargo run -p memplug-example-embedding       # the copy of the CPU plugin linked in
//! cargo build -p memplug-plugin-cpu             # or its library, by path:
//! cargo run -p memplug-example-embedding -- ./target/debug/libmemplug_plugin_cpu.so
//! ```
//!
//! The README's "Embedding the host from Rust" is the code between the
//! `README` markers, character for character (`tests/readme.rs`);
//! `tests/run.rs` runs this program both ways.

use memplug_host::governor::{AllocationClass, Pool, PressureTicket, Priority};
use memplug_host::{
    BindingError, BindingSpec, Context, FnFence, GrowError, LoadOptions, MemoryBinding, OwnedAllocation,
    Plugin, ProcessMemoryManager, Region, RegionView, Requirements,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
/// The pool's hard capacity: small, so that scene 3 fills it.
const CAPACITY: u64 = 16 * MIB;
/// One KV block: what a grow adds and what the block table indexes.
const BLOCK: u64 = MIB;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mgr = ProcessMemoryManager::new();
    let plugin = match std::env::args_os().nth(1) {
        // A path (`./libx.so`, `/opt/x/libx.so`), never a bare file name.
        Some(path) => mgr.load_plugin(&path, &LoadOptions::default())?,
        None => {
            // SAFETY: the entry is the reference CPU plugin's, built from
            // this workspace against the same ABI.
            let linked = unsafe {
                Plugin::from_entry(
                    memplug_plugin_cpu::cpu_plugin_entry,
                    "memplug-cpu",
                    &LoadOptions::default(),
                )
            }?;
            let name = linked.name().to_string();
            mgr.register_plugin(linked)?;
            name
        }
    };
    println!("loaded plugin '{plugin}'");

    // README: begin
    let ctx = mgr.select(CPU0, Requirements { virtual_backing: true, shared_mapping: true, sync: false })?;
    let pool = mgr.create_pool("cpu0", CAPACITY)?; // a hard budget for this memory
    let kv = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv))?;

    // A KV cache: address space for the longest sequence, committed (and
    // charged) block by block; the base never moves, so nothing is copied.
    let mut cache = kv.reserve_virtual(8 * BLOCK)?;
    let mut table = BlockTable::new(6);
    for blocks in 1..=4 {
        cache.grow_to(blocks * BLOCK, |view| table.update(view))?; // grant → commit → update → charge
    }
    assert_eq!(table.blocks[0], cache.addr()); // same base after every grow
    assert_eq!(pool.used(), 4 * BLOCK); // charged what is committed, not what is reserved
                                        // README: end
    println!(
        "1. KV region at {:#x}: grew to {} blocks in place, {} MiB charged of {} MiB reserved",
        cache.addr(),
        table.blocks.len(),
        pool.used() / MIB,
        cache.capacity() / MIB
    );
    kv_writes_survive_growth(&mut cache, &mut table)?;
    rollback_keeps_the_old_view(&mut cache, &mut table, &pool)?;

    let requests = prefix_shared_read_only(&kv, &pool)?;
    let experts = weights_evicted_under_pressure(&mgr, &ctx, &pool, &mut cache, &mut table)?;
    free_waits_for_its_fence(&mgr, &pool, experts)?;

    drop((cache, requests));
    mgr.poll();
    assert_eq!(pool.used(), 0, "every charge refunded");
    assert!(pool.peak() <= CAPACITY, "the pool never went over its capacity");
    drop((kv, ctx));
    mgr.unload_plugin(&plugin)?;
    println!(
        "ledger at zero (peak {} MiB of {} MiB), plugin '{plugin}' unloaded",
        pool.peak() / MIB,
        CAPACITY / MIB
    );
    Ok(())
}

/// The runtime's view of a KV region: the address of each block. A grow
/// hands it the new view; it refuses past `max` blocks (a full table).
struct BlockTable {
    blocks: Vec<u64>,
    max: usize,
}

impl BlockTable {
    fn new(max: usize) -> BlockTable {
        BlockTable { blocks: Vec::new(), max }
    }

    fn update(&mut self, view: &RegionView) -> std::result::Result<(), String> {
        let wanted = (view.len / BLOCK) as usize;
        if wanted > self.max {
            return Err(format!("block table holds {} blocks, the view has {wanted}", self.max));
        }
        let have = self.blocks.len() as u64;
        self.blocks.extend((have..wanted as u64).map(|i| view.addr + i * BLOCK));
        Ok(())
    }
}

/// Fills block `i` with its own byte, through its address in the table.
fn write_block(table: &BlockTable, i: usize) {
    // SAFETY: the CPU plugin's addresses are this process's; the block is
    // committed (it is in the table) and nothing else touches it.
    unsafe { std::ptr::write_bytes(table.blocks[i] as *mut u8, i as u8 + 1, BLOCK as usize) };
}

fn block_holds(table: &BlockTable, i: usize) -> bool {
    // SAFETY: as in write_block; read only.
    let b = unsafe { std::slice::from_raw_parts(table.blocks[i] as *const u8, BLOCK as usize) };
    b.iter().all(|&x| x == i as u8 + 1)
}

/// Tokens written before a grow are where they were after it: the region
/// grew in place.
fn kv_writes_survive_growth(cache: &mut Region, table: &mut BlockTable) -> Result<()> {
    (0..table.blocks.len()).for_each(|i| write_block(table, i));
    cache.grow_to(5 * BLOCK, |view| table.update(view))?;
    write_block(table, 4);
    assert!((0..5).all(|i| block_holds(table, i)), "a grow moved or lost earlier blocks");
    println!("   wrote blocks 0-3, grew to 5: every block still holds its bytes at its address");
    Ok(())
}

/// A grow whose update refuses is undone: the range is decommitted, the
/// grant returned, and the region keeps its old view and charge.
fn rollback_keeps_the_old_view(cache: &mut Region, table: &mut BlockTable, pool: &Pool) -> Result<()> {
    let (len, used) = (cache.len(), pool.used());
    match cache.grow_to(7 * BLOCK, |view| table.update(view)) {
        Err(GrowError::Update(why)) => {
            println!("   grow to 7 blocks refused by the update ({why}): rolled back")
        }
        other => panic!("the update should refuse 7 blocks, got {other:?}"),
    }
    assert_eq!((cache.len(), pool.used(), table.blocks.len()), (len, used, 5));
    assert!((0..5).all(|i| block_holds(table, i)), "the rollback touched committed blocks");
    Ok(())
}

/// One system prompt, charged once, mapped read-only at the start of two
/// requests' regions; each request's own tokens follow it.
fn prefix_shared_read_only(kv: &MemoryBinding, pool: &Pool) -> Result<Vec<Region>> {
    const PROMPT: &[u8] = b"You are a helpful assistant.";
    let before = pool.used();
    let prefix = kv.create_shared(BLOCK, |view| {
        // SAFETY: CPU memory, mapped writable for the initialiser only.
        unsafe { view.as_mut_slice()[..PROMPT.len()].copy_from_slice(PROMPT) }
    })?;
    let mut requests = Vec::new();
    for _ in 0..2 {
        let mut r = kv.reserve_virtual(4 * BLOCK)?;
        r.map_prefix(&prefix)?;
        r.grow_to(prefix.len() + BLOCK, |_| Ok::<(), String>(()))?;
        // SAFETY: the prefix is mapped readable at the region's base.
        let start = unsafe { std::slice::from_raw_parts(r.addr() as *const u8, PROMPT.len()) };
        assert_eq!(start, PROMPT, "the prefix's bytes at the start of every region");
        assert!(r.prefix_is_read_only(), "the CPU plugin maps a prefix read-only");
        requests.push(r);
    }
    assert_ne!(requests[0].addr(), requests[1].addr());
    assert_eq!(pool.used() - before, prefix.charged() + 2 * BLOCK, "the prefix is charged once");
    println!(
        "2. prefix of {} MiB mapped read-only into 2 regions ({:#x}, {:#x}): charged {} MiB once, plus 1 MiB each",
        prefix.len() / MIB,
        requests[0].addr(),
        requests[1].addr(),
        prefix.charged() / MIB
    );
    // The regions keep the prefix alive; this handle is not needed.
    drop(prefix);
    Ok(requests)
}

/// Expert weights kept while there is room: oldest first.
type Experts = Arc<Mutex<Vec<OwnedAllocation>>>;

/// The weights holder fills the pool; a KV grow that finds it full sends
/// the holder a ticket, and the holder evicts its oldest experts until the
/// grow fits. The governor chooses no victim: the holder does.
fn weights_evicted_under_pressure(
    mgr: &ProcessMemoryManager,
    ctx: &Arc<Context>,
    pool: &Arc<Pool>,
    cache: &mut Region,
    table: &mut BlockTable,
) -> Result<Experts> {
    let experts: Experts = Arc::default();
    let cached = experts.clone();
    let holder = pool.register_holder("weights", Priority(10), move |t: &PressureTicket| {
        let mut victims = Vec::new();
        let mut released = 0;
        let mut cached = cached.lock().unwrap();
        while released < t.bytes_wanted && !cached.is_empty() {
            let oldest = cached.remove(0);
            released += oldest.charged();
            victims.push(oldest);
        }
        drop(cached);
        drop(victims); // freed through the plugin and refunded, outside our lock
        released
    });
    let weights = mgr.bind(ctx, pool, BindingSpec::new(AllocationClass::Weights).holder(holder.id()))?;
    // Load experts until the pool is full: the holder's own requests never
    // ask the holder, so the last one is refused.
    loop {
        match weights.allocate(MIB, 4096) {
            Ok(expert) => experts.lock().unwrap().push(expert),
            Err(BindingError::Budget(_)) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let loaded = experts.lock().unwrap().len();
    assert_eq!(pool.free(), 0, "experts fill the pool");
    println!(
        "3. {loaded} experts of 1 MiB fill the pool ({} MiB used of {} MiB)",
        pool.used() / MIB,
        CAPACITY / MIB
    );

    cache.grow_to(6 * BLOCK, |view| table.update(view))?; // does not fit: a ticket to the holder
    let left = experts.lock().unwrap().len();
    let tickets = pool.holder_stats(holder.id()).expect("registered here").pressure.tickets;
    assert_eq!((left, table.blocks.len()), (loaded - 1, 6), "one expert evicted for one block");
    assert!(tickets >= 1, "the holder was asked");
    assert!(pool.used() <= CAPACITY);
    println!(
        "   KV grew to 6 blocks: the holder got {tickets} ticket(s) and evicted {} expert(s)",
        loaded - left
    );
    Ok(experts)
}

/// An expert still read by in-flight work is released after that work's
/// fence: it stays charged (and mapped) until the fence completes and the
/// queue is polled.
fn free_waits_for_its_fence(mgr: &ProcessMemoryManager, pool: &Pool, experts: Experts) -> Result<()> {
    let done = Arc::new(AtomicBool::new(false));
    let (q, w) = (done.clone(), done.clone());
    let fence = FnFence::new(
        "decode step",
        move || q.load(Ordering::Acquire),
        move |_timeout: Duration| w.load(Ordering::Acquire),
    );
    let expert = experts.lock().unwrap().pop().expect("experts left");
    let (bytes, before) = (expert.charged(), pool.used());
    expert.release_after([fence]);
    mgr.poll();
    assert_eq!(pool.used(), before, "still charged while the fence is pending");
    done.store(true, Ordering::Release);
    mgr.poll();
    assert_eq!(pool.used(), before - bytes, "refunded once the fence completed");
    println!("4. an expert released behind a fence: charged until the fence completed, then freed");
    // The rest go now (the holder's callback may still hold the list).
    experts.lock().unwrap().clear();
    Ok(())
}

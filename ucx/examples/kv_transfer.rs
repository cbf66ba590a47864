//! Disaggregated serving in miniature: a prefill process fills KV blocks of
//! a region behind a shared system prompt; a decode process pulls them into
//! regions of its own, at its own stable addresses, following its own block
//! tables. The system prompt crosses the wire once: the decode side makes
//! one shared prefix of it and maps that read-only into every region.
//!
//! ```text
//! cargo run -p memplug-ucx --example kv_transfer
//! ```
//!
//! This process is the decode side; it starts the prefill side (this
//! executable again). Transports: `UCX_TLS` if set, else TCP on loopback.
//! The CPU plugin is found next to the example (`MEMPLUG_CPU_PLUGIN`
//! overrides). Exits non-zero if any byte or charge is not as expected.

use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, Context, LoadOptions, MemoryBinding, ProcessMemoryManager, Requirements};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_ucx::{Access, Peer, Ucx};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const PROMPT: u64 = 2 * MIB;
const BLOCK: u64 = 256 * KIB;
const BLOCKS: u64 = 8;
const TIMEOUT: Duration = Duration::from_secs(20);
const TAG_PROMPT: u64 = 0;
const TAG_BLOCKS: u64 = 1;

fn byte(seed: u64, i: u64) -> u8 {
    (i as u8).wrapping_mul(13).wrapping_add(seed as u8) ^ ((i >> 10) as u8)
}

/// Writes `seed`'s pattern over `[addr, +len)`.
///
/// # Safety
/// Writable host memory.
unsafe fn fill(addr: u64, len: u64, seed: u64) {
    let s = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
    s.iter_mut().enumerate().for_each(|(i, b)| *b = byte(seed, i as u64));
}

/// # Safety
/// Readable host memory.
unsafe fn holds(addr: u64, len: u64, seed: u64) -> bool {
    let s = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    s.iter().enumerate().all(|(i, b)| *b == byte(seed, i as u64))
}

fn plugin() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMPLUG_CPU_PLUGIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    for p in [dir.join("deps/libmemplug_plugin_cpu.so"), dir.join("libmemplug_plugin_cpu.so")] {
        if p.is_file() {
            return p;
        }
    }
    panic!("libmemplug_plugin_cpu.so not found near {}: set MEMPLUG_CPU_PLUGIN", exe.display());
}

struct Memory {
    manager: ProcessMemoryManager,
    context: Arc<Context>,
    pool: Arc<memplug_host::governor::Pool>,
    kv: MemoryBinding,
}

fn memory() -> Memory {
    let manager = ProcessMemoryManager::new();
    manager.load_plugin(plugin(), &LoadOptions::default()).expect("load the CPU plugin");
    let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let needs = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
    let context = manager.select(cpu0, needs).unwrap();
    let pool = manager.create_pool("kv", 64 * MIB).unwrap();
    let kv = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    Memory { manager, context, pool, kv }
}

fn ucx() -> Ucx {
    if std::env::var_os("UCX_TLS").is_some() {
        Ucx::new().unwrap()
    } else {
        Ucx::with_config(&[("TLS", "tcp"), ("NET_DEVICES", "lo")]).unwrap()
    }
}

fn main() {
    if let Err(e) = Ucx::available() {
        eprintln!("kv_transfer: {e}");
        std::process::exit(2);
    }
    match std::env::var_os("MEMPLUG_UCX_KV_SOCKET") {
        Some(path) => prefill(UnixStream::connect(path).unwrap()),
        None => decode(),
    }
}

/// The prefill side: the prompt as a shared prefix, blocks after it, both
/// offered read-only; serves until the decode side leaves.
fn prefill(stream: UnixStream) {
    let ucx = ucx();
    let mut peer = Peer::connect(&ucx, stream, TIMEOUT).unwrap();
    let m = memory();
    // SAFETY (both fills): the temporary view and the committed private
    // part are writable CPU memory.
    let prompt = m.kv.create_shared(PROMPT, |v| unsafe { fill(v.addr, v.len, 99) }).unwrap();
    let mut region = m.kv.reserve_virtual(64 * MIB).unwrap();
    region.map_prefix(&prompt).unwrap();
    region.grow_to(PROMPT + BLOCKS * BLOCK, |_| Ok::<(), String>(())).unwrap();
    for b in 0..BLOCKS {
        // SAFETY: as above.
        unsafe { fill(region.addr() + PROMPT + b * BLOCK, BLOCK, b) };
    }
    let p = ucx.register_region(&m.context, &mut region, 0, PROMPT, Access::Read).unwrap();
    let blocks = ucx.register_region(&m.context, &mut region, PROMPT, BLOCKS * BLOCK, Access::Read).unwrap();
    peer.offer(&p, TAG_PROMPT).unwrap();
    peer.offer(&blocks, TAG_BLOCKS).unwrap();
    peer.serve(Duration::from_secs(60)).unwrap();
    drop((p, blocks, region, prompt));
    m.manager.poll();
    assert_eq!(m.pool.used(), 0, "prefill: every byte refunded");
}

/// The decode side.
fn decode() {
    let dir = std::env::temp_dir().join(format!("memplug-ucx-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("control.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("MEMPLUG_UCX_KV_SOCKET", &path)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (stream, _) = listener.accept().unwrap();
    let ucx = ucx();
    let mut peer = Peer::connect(&ucx, stream, TIMEOUT).unwrap();
    let (mut prompt_range, mut blocks_range) = (None, None);
    while prompt_range.is_none() || blocks_range.is_none() {
        let r = peer.next_offer(TIMEOUT).unwrap();
        match r.tag {
            TAG_PROMPT => prompt_range = Some(r),
            _ => blocks_range = Some(r),
        }
    }
    let (prompt_range, blocks_range) = (prompt_range.unwrap(), blocks_range.unwrap());
    let m = memory();

    // The prompt crosses once, into a shared prefix of this side (charged
    // once, filled through its temporary writable view).
    let mut pulled = None;
    let prompt =
        m.kv.create_shared(prompt_range.len, |v| {
            // SAFETY: the view is writable until this closure returns, and
            // the transfer is waited for inside it.
            let t = unsafe { peer.get_raw(&prompt_range, 0, v.addr, v.len) };
            pulled = Some(t.and_then(|t| t.wait(TIMEOUT)));
        })
        .unwrap();
    pulled.unwrap().unwrap();

    // Two sequences, each a region at its own stable address with the
    // prompt mapped read-only and its blocks pulled per its block table.
    let tables: [[u64; 4]; 2] = [[3, 1, 0, 2], [7, 6, 5, 4]];
    let mut regions = Vec::new();
    for table in &tables {
        let mut r = m.kv.reserve_virtual(16 * MIB).unwrap();
        r.map_prefix(&prompt).unwrap();
        assert!(r.prefix_is_read_only());
        let mut transfers = Vec::new();
        for (slot, &remote_block) in table.iter().enumerate() {
            let at = PROMPT + slot as u64 * BLOCK;
            transfers
                .push(peer.pull_into_region(&mut r, at, &blocks_range, remote_block * BLOCK, BLOCK).unwrap());
        }
        for t in transfers {
            t.wait(TIMEOUT).unwrap();
        }
        regions.push(r);
    }
    for (r, table) in regions.iter().zip(&tables) {
        // SAFETY: the prefix is mapped readable; the blocks are committed
        // and their transfers complete.
        assert!(unsafe { holds(r.addr(), PROMPT, 99) }, "the prompt differs");
        for (slot, &b) in table.iter().enumerate() {
            // SAFETY: as above.
            assert!(unsafe { holds(r.addr() + PROMPT + slot as u64 * BLOCK, BLOCK, b) }, "block {b} differs");
        }
    }
    let expected = prompt.charged() + tables.len() as u64 * 4 * BLOCK;
    assert_eq!(m.pool.used(), expected, "the prompt is charged once, each region's blocks once");
    println!(
        "decode: prompt of {} KiB pulled once and mapped read-only into {} regions at {:#x} and {:#x}; {} blocks of \
         {} KiB pulled by block table; pool holds {} KiB",
        PROMPT / KIB,
        regions.len(),
        regions[0].addr(),
        regions[1].addr(),
        tables.len() * 4,
        BLOCK / KIB,
        m.pool.used() / KIB
    );
    peer.release(&prompt_range, TIMEOUT).unwrap();
    peer.release(&blocks_range, TIMEOUT).unwrap();
    drop(peer);
    let status = child.wait().unwrap();
    drop(regions);
    drop(prompt);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0, "decode: every byte refunded");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "the prefill side failed: {status}");
    println!("prefill and decode: pools exact");
}

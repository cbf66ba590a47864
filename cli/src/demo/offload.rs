//! Two scenes between serving and the device loss:
//!
//! * **offload**: an expert shard held as a region (not a plain
//!   allocation, so it can come back at the same address) is offloaded to
//!   a host pool by its holder when a long prefill runs the device pool
//!   short, and restored at the same address, bytes intact, once the
//!   prefill is done (`Region::offload_to`, `Region::restore`);
//! * **copy_on_write**: three requests map the system prompt; one diverges
//!   inside the prompt's last block and gets a private copy of that block
//!   (`Region::privatise`) while the other two keep reading the shared one.
//!
//! On the CPU plugin the host pool's memory is the same mechanism's (its
//! memory is host memory); the copies are its stream worker's. Every
//! measurement counts the host copies' pages against the host pool.

use super::serving::{filled_with, repeats, system_prompt};
use super::session::{Session, State};
use super::{lock, mib, CAPACITY, KIB, PREFIX, REGION_MAX, SHARD, SYSTEM_PROMPT, WEIGHTS_PRIORITY};
use memplug_host::governor::{AllocationClass, PressureTicket};
use memplug_host::{BindingSpec, Context, MemoryBinding, ProcessMemoryManager, Region, Residence, Stream};
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long an offload may wait for the shard's work and its copy.
const OFFLOAD_WAIT: Duration = Duration::from_secs(5);
/// The byte every page of the offloadable shard holds.
const SHARD_BYTE: u8 = 0x5A;
/// The diverging request's own tokens in its private block.
const DIVERGED: u8 = 0xD7;

/// The holder that offloads: answers a ticket by moving its shard to the
/// host pool (the bytes it answers are the device bytes decommitted).
struct Offloader {
    shard: Mutex<Option<Region>>,
    host: MemoryBinding,
    stream: Stream,
    rec: Arc<super::timeline::Recorder>,
}

impl Offloader {
    fn on_ticket(&self, t: &PressureTicket) -> u64 {
        let mut slot = lock(&self.shard);
        let Some(shard) = slot.as_mut().filter(|s| s.residence() == Residence::Device) else {
            self.rec.log(
                "ticket",
                "experts",
                format!("{} → answers 0: nothing on the device", self.rec.ticket_text(t)),
            );
            return 0;
        };
        match shard.offload_to(&self.host, &self.stream, OFFLOAD_WAIT) {
            Ok(report) => {
                self.rec.log(
                    "offload",
                    "experts",
                    format!(
                        "{} → offloads expert.hot to the host pool: {} decommitted at {:#x}, copy held in host memory",
                        self.rec.ticket_text(t),
                        mib(report.released),
                        shard.addr()
                    ),
                );
                report.released
            }
            Err(e) => {
                self.rec.log(
                    "ticket",
                    "experts",
                    format!("{} → offload refused: {e}", self.rec.ticket_text(t)),
                );
                0
            }
        }
    }
}

/// The offload scene. Leaves nothing charged to either pool.
pub(super) fn offload_scene(
    manager: &ProcessMemoryManager,
    ctx: &Arc<Context>,
    session: &Session,
    st: &mut State<'_>,
) -> Result<(), Box<dyn Error>> {
    let rec = st.rec.clone();
    let pool = st.pool.clone();
    let host_pool = manager.create_pool("host", CAPACITY)?;
    st.host.pool = Some(host_pool.clone());
    let host = manager.bind(ctx, &host_pool, BindingSpec::new(AllocationClass::Weights))?;
    let sync = ctx.mechanism().sync().ok_or("the cpu mechanism has no sync capability")?;
    let offloader = Arc::new(Offloader {
        shard: Mutex::new(None),
        host,
        stream: sync.stream_create()?,
        rec: rec.clone(),
    });
    let o = offloader.clone();
    let reg = pool.register_holder("experts", WEIGHTS_PRIORITY, move |t| o.on_ticket(t));
    rec.name_holders([(reg.id(), "experts")]);
    let experts_b = manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Weights).holder(reg.id()))?;

    let mut shard = experts_b.reserve_virtual(SHARD)?;
    shard.grow_to(SHARD, |v| {
        // SAFETY: CPU memory, just committed writable, this region's alone.
        unsafe { std::slice::from_raw_parts_mut(v.addr as *mut u8, v.len as usize) }.fill(SHARD_BYTE);
        Ok::<(), String>(())
    })?;
    let shard_addr = shard.addr();
    *lock(&offloader.shard) = Some(shard);
    rec.log(
        "load",
        "experts",
        format!(
            "expert.hot: a region of {} at {shard_addr:#x} (offloadable: it can come back at the same address)",
            mib(SHARD)
        ),
    );
    let pinned = session.weights.ranges();
    let with_shard: Vec<(u64, u64)> = pinned.iter().copied().chain([(shard_addr, SHARD)]).collect();
    st.measure("offloadable shard loaded", &with_shard, &[]);

    // A prefill that needs every byte but the pinned weights: the pool is
    // short by the shard, the weights holder has only pinned shards, kv
    // refuses, and the experts holder offloads.
    let prefill_b = manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Kv))?;
    let mut long = prefill_b.reserve_virtual(REGION_MAX)?;
    let prefill = pool.capacity() - pool.used() + SHARD / 2;
    let prefill = prefill.div_ceil(2 * KIB * KIB) * 2 * KIB * KIB;
    long.grow_to(prefill, |v| {
        // SAFETY: CPU memory, just committed writable, this region's alone.
        unsafe { std::slice::from_raw_parts_mut(v.addr as *mut u8, v.len as usize) }.fill(0xB0);
        Ok::<(), String>(())
    })?;
    let (res_after, host_used) = {
        let s = lock(&offloader.shard);
        (s.as_ref().map(Region::residence), host_pool.used())
    };
    let offloaded_copy = match res_after {
        Some(Residence::Host { addr, bytes }) => Some((addr, bytes)),
        _ => None,
    };
    rec.log(
        "prefill",
        "prefill",
        format!(
            "long prefill: {} at {:#x} after the shard was offloaded",
            mib(long.committed()),
            long.addr()
        ),
    );
    st.host.ranges = offloaded_copy.into_iter().collect();
    st.measure("shard offloaded under pressure", &pinned, &[(long.addr(), long.committed())]);
    let copy_intact = offloaded_copy.is_some_and(|(a, l)| {
        // SAFETY: the host copy, a live allocation of the host pool.
        unsafe { filled_with(a, l, SHARD_BYTE) }
    });
    let answered = reg.stats().pressure.bytes_answered;
    st.checks.add(
        "offload answers pressure",
        offloaded_copy.is_some_and(|(_, b)| b == SHARD) && host_used == SHARD && answered == SHARD && copy_intact,
        format!(
            "experts answered {} (device bytes decommitted); host pool holds {} with the shard's bytes: {copy_intact}",
            mib(answered),
            mib(host_used)
        ),
    );
    drop(long);
    rec.log("finish", "prefill", "done; its region is freed");

    let fence = lock(&offloader.shard).as_mut().ok_or("the shard is gone")?.restore(&offloader.stream)?;
    let done = fence.wait(OFFLOAD_WAIT).unwrap_or(false);
    drop(fence);
    manager.poll();
    st.host.ranges.clear();
    let (addr_now, intact) = {
        let s = lock(&offloader.shard);
        let r = s.as_ref().ok_or("the shard is gone")?;
        // SAFETY: the restored region's committed bytes, read after the
        // restore's fence.
        (r.addr(), r.residence() == Residence::Device && unsafe { filled_with(r.addr(), SHARD, SHARD_BYTE) })
    };
    rec.log(
        "restore",
        "experts",
        format!(
            "expert.hot restored at {addr_now:#x} (same address: {}), bytes intact: {intact}; host pool {}",
            addr_now == shard_addr,
            mib(host_pool.used())
        ),
    );
    st.measure("shard restored", &with_shard, &[]);
    st.checks.add(
        "restore at the same address",
        done && intact && addr_now == shard_addr && host_pool.used() == 0,
        format!(
            "restore fence completed: {done}; address {addr_now:#x} = {shard_addr:#x}; bytes intact: {intact}; \
             host copy freed: {}",
            host_pool.used() == 0
        ),
    );
    drop(reg);
    lock(&offloader.shard).take();
    // The shard's release waits for the restore's fence (complete).
    manager.poll();
    drop(experts_b);
    drop(prefill_b);
    // The holder's callback (and its hold on the offloader) went with
    // its registration.
    let Offloader { stream, .. } = Arc::try_unwrap(offloader).map_err(|_| "the offloader is still shared")?;
    sync.stream_destroy(stream).map_err(|e| e.error)?;
    Ok(())
}

/// The copy-on-write scene: three requests on one system prompt; `r8`
/// diverges inside its last block.
pub(super) fn copy_on_write_scene(
    manager: &ProcessMemoryManager,
    ctx: &Arc<Context>,
    session: &Session,
    st: &mut State<'_>,
) -> Result<(), Box<dyn Error>> {
    let rec = st.rec.clone();
    let granule = ctx.mechanism().properties().granularity;
    let block = (256 * KIB).max(granule);
    let sync = ctx.mechanism().sync().ok_or("the cpu mechanism has no sync capability")?;
    let stream = sync.stream_create()?;
    let prefix = system_prompt(&session.kv_b)?;
    let mut regions = Vec::new();
    for _ in 0..3 {
        let mut r = session.kv_b.reserve_virtual(REGION_MAX)?;
        r.map_prefix(&prefix)?;
        regions.push(r);
    }
    rec.log("prefix", "kv", format!("r6, r7, r8 map the system prompt ({}) read-only", mib(PREFIX)));
    let charged_before = st.pool.used();
    let offset = PREFIX - block;
    let fence = regions[2].privatise(offset, block, &stream, OFFLOAD_WAIT)?;
    let done = fence.wait(OFFLOAD_WAIT).unwrap_or(false);
    let r8 = regions[2].addr();
    // SAFETY: r8's private copy of the block, committed writable, read
    // after the privatise's fence.
    let copied = unsafe { repeats(r8 + offset, block, SYSTEM_PROMPT) };
    // SAFETY: the second half of that private block, r8's alone.
    unsafe { std::slice::from_raw_parts_mut((r8 + offset + block / 2) as *mut u8, (block / 2) as usize) }
        .fill(DIVERGED);
    rec.log(
        "privatise",
        "r8",
        format!(
            "diverges inside the prompt's last block: +{} ({}) made private, a copy of the shared bytes \
             ({copied}), then its own tokens written",
            mib(offset),
            mib(block)
        ),
    );
    let charged = st.pool.used() - charged_before;
    // SAFETY: the prefix mapped read-only in r6 and r7; r8's prefix up to
    // the block (still shared) and its private block.
    let (others, r8_shared, r8_own) = unsafe {
        (
            regions[..2].iter().all(|r| repeats(r.addr(), PREFIX, SYSTEM_PROMPT)),
            repeats(r8, offset + block / 2, SYSTEM_PROMPT),
            filled_with(r8 + offset + block / 2, block / 2, DIVERGED),
        )
    };
    // After the reads: pagemap counts the prefix's pages as r6 mapped them.
    let kv: Vec<(u64, u64)> = [(regions[0].addr(), PREFIX), (r8 + offset, block)].into();
    st.measure("r8 diverged in the last block", &session.weights.ranges(), &kv);
    st.checks.add(
        "copy-on-write of the last block",
        done && copied && charged == block && others && r8_shared && r8_own && regions[2].prefix_is_read_only(),
        format!(
            "r8's private block charged once ({}); r6 and r7 still read the shared prompt: {others}; r8 reads the \
             prompt before its own tokens: {r8_shared}, its own tokens: {r8_own}",
            mib(charged)
        ),
    );
    drop(fence);
    drop(regions);
    drop(prefix);
    // r8's release waits for the privatise's fence (complete).
    manager.poll();
    sync.stream_destroy(stream).map_err(|e| e.error)?;
    rec.log("finish", "kv", "r6, r7, r8 done; the private block and the shared prompt are freed");
    Ok(())
}

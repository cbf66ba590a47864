//! `concurrency.*`: several threads calling the same mechanism at once,
//! while the kit stalls their calls at random points (`stalls.rs`) so that
//! a table without a lock is caught half-way through an update.

use super::allocator::touch;
use super::stalls::{Stalls, ALIVE_EVERY, ENOUGH_ALLOCATOR, ENOUGH_OTHERS};
use super::{ensure, expect_live, fail, skip, Checked, Ctx, Job, MechState, Results};
use crate::raw::{request, status_name, Mech};
use memplug_sdk::abi::*;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech, st: &MechState) {
    let name = Some(m.name.as_str());
    res.run("concurrency.allocator", name, || allocator(ctx, m, st));
    res.run("concurrency.virtual_backing", name, || virtual_backing(ctx, m, st));
    res.run("concurrency.sync", name, || sync(ctx, m, st));
    res.run("concurrency.shared_mapping", name, || shared_mapping(ctx, m, st));
}

/// What a storm ended with: the errors, first per thread, and how many
/// plugin calls were stalled.
struct Storm {
    errors: Vec<String>,
    stalled: usize,
}

/// Runs `body(thread)` on `ctx.opts.threads` threads, each stalled by its
/// own timer when it is inside a plugin call (`stalls.rs`), for at least
/// `enough` stalls: a thread that is done goes round again (`body` makes
/// and gives back what it made each time) until then.
fn storm(ctx: &Ctx, enough: usize, body: impl Fn(usize) -> Result<(), String> + Sync) -> Storm {
    let errors = Mutex::new(Vec::new());
    let stalls = Stalls::new();
    let failed = AtomicBool::new(false);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..ctx.opts.threads.max(1))
            .map(|t| {
                let (body, errors, stalls, failed) = (&body, &errors, &stalls, &failed);
                s.spawn(move || {
                    let _timer = stalls.enlist(t);
                    loop {
                        if let Err(e) = body(t) {
                            errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("thread {t}: {e}"));
                            // The others stop going round too: the check has
                            // its failure (and a lone thread has nobody to
                            // stall it).
                            failed.store(true, Ordering::Release);
                            break;
                        }
                        if failed.load(Ordering::Acquire) || stalls.had(enough) {
                            break;
                        }
                    }
                })
            })
            .collect();
        // Tells the kit the check is alive while plugin calls keep
        // returning (a storm may run for seconds); a hung call stops it,
        // so --timeout still catches a hang.
        let beat = s.spawn(|| {
            let mut seen = crate::sink::calls_done();
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(ALIVE_EVERY);
                let now = crate::sink::calls_done();
                if now != seen {
                    super::child::still_alive();
                    seen = now;
                }
            }
        });
        for w in workers {
            let _ = w.join();
        }
        done.store(true, Ordering::Release);
        let _ = beat.join();
    });
    Storm { errors: errors.into_inner().unwrap_or_else(|e| e.into_inner()), stalled: stalls.sent() }
}

/// How many times a storm asks again for what the plugin refused with
/// `OUT_OF_MEMORY` (after 1, 2 and 4 ms), before the refusal counts.
const OOM_TRIES: u32 = 4;

/// Runs a call that makes something (`status` reads its answer) and asks
/// again, a little later, while it answers `OUT_OF_MEMORY`: running out for
/// a moment is not a race's mark (a kernel short of huge pages while other
/// work compacts, a busy machine), and a storm that failed on it would fail
/// correct plugins at random. A plugin whose race shows as a refusal that
/// lasts still fails, and its message says how often it was asked.
fn patiently<T>(mut call: impl FnMut() -> T, status: impl Fn(&T) -> MemplugStatus) -> (T, u32) {
    let mut tries = 1;
    loop {
        let got = call();
        if status(&got) != MEMPLUG_STATUS_OUT_OF_MEMORY || tries == OOM_TRIES {
            return (got, tries);
        }
        std::thread::sleep(std::time::Duration::from_millis(1 << (tries - 1)));
        tries += 1;
    }
}

/// `what: STATUS`, with the number of tries when there were several.
fn refused(what: &str, s: MemplugStatus, tries: u32) -> String {
    if tries > 1 {
        format!("{what}: {} ({tries} tries, {}ms apart at most)", status_name(s), 1 << (tries - 2))
    } else {
        format!("{what}: {}", status_name(s))
    }
}

/// What a failure in a storm usually means.
const RACE_HINT: &str =
    "each call alone works, so concurrent calls corrupted the plugin's state: is every table \
                         guarded by a lock?";

fn verdict(storm: Storm, m: &Mech, live: u64, done: String) -> Checked {
    let Storm { errors, stalled } = storm;
    ensure!(
        errors.is_empty(),
        "{} thread(s) failed ({stalled} calls stalled mid-call): {}; {RACE_HINT}",
        errors.len(),
        errors.join("; ")
    );
    if let Err(super::Verdict::Fail(why)) = expect_live(m, live, "after every thread released what it made") {
        fail!("{why} ({stalled} calls stalled mid-call); {RACE_HINT}");
    }
    Ok(format!("{done}; {stalled} calls stalled mid-call"))
}

/// The handles of the live blocks of an allocator storm, with the thread
/// that holds each: a handle given twice is the plugin's table giving one
/// slot to two objects.
#[derive(Default)]
struct LiveHandles(Mutex<HashMap<u64, usize>>);

impl LiveHandles {
    fn made(&self, handle: u64, thread: usize) -> Result<(), String> {
        let mut live = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match live.insert(handle, thread) {
            Some(other) => Err(format!(
                "handle {handle:#x} was given to a block of thread {thread} while a block of thread {other} still \
                 held it: two live objects share one slot of the plugin's table"
            )),
            None => Ok(()),
        }
    }

    fn gone(&self, handle: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&handle);
    }
}

/// Frees one block of the allocator storm, first checking the tags it
/// wrote are intact; the error, if any.
fn release_block(
    ctx: &Ctx,
    m: &Mech,
    touched: bool,
    (o, size, tag): (MemplugObjectRef, u64, u64),
) -> Option<String> {
    let mut err = None;
    if touched {
        // SAFETY: the block was checked writable when it was allocated and
        // is still live; `size` >= 16.
        let (a, b) = unsafe {
            ((o.addr as *const u64).read_unaligned(), ((o.addr + size - 8) as *const u64).read_unaligned())
        };
        if (a, b) != (tag, tag) {
            err = Some(format!(
                "block {:#x} lost its contents while live: another live block overlaps it",
                o.addr
            ));
        }
    }
    let s = m.deallocate(&ctx.log, &o);
    if s != MEMPLUG_STATUS_OK {
        err = err.or(Some(format!("deallocate of a live block {:#x}: {}", o.addr, status_name(s))));
    }
    err
}

fn allocator(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    let live = m.live();
    let n = ctx.opts.iterations;
    let touch_blocks = st.touch_ok && m.is_cpu();
    let handles = LiveHandles::default();
    let errors = storm(ctx, ctx.opts.storm_stalls.unwrap_or(ENOUGH_ALLOCATOR), |t| {
        let mut ring: VecDeque<(MemplugObjectRef, u64, u64, bool)> = VecDeque::new();
        let mut first: Option<String> = None;
        let mut touching = touch_blocks;
        for i in 0..n {
            if ring.len() == 8 {
                for _ in 0..4 {
                    if let Some((o, size, tag, touched)) = ring.pop_front() {
                        handles.gone(o.handle);
                        if let Some(why) = release_block(ctx, m, touched, (o, size, tag)) {
                            first.get_or_insert(why);
                        }
                    }
                }
            }
            let size = 16 + ((i as u64 * 37) % 512);
            let req = request(m, size, m.props.min_alignment);
            let (made, tries) = patiently(|| m.allocate(&ctx.log, &req), |a| a.status);
            if made.status != MEMPLUG_STATUS_OK {
                first.get_or_insert(refused(&format!("allocate({size})"), made.status, tries));
                continue;
            }
            if let Err(why) = handles.made(made.block.handle, t) {
                first.get_or_insert(why);
            }
            let tag = ((t as u64) << 48) | i as u64;
            if touching && i % 64 == 0 && !crate::os::writable(made.block.addr, size) {
                first.get_or_insert(format!("block {:#x} is not mapped read-write", made.block.addr));
                touching = false;
            }
            if touching {
                // SAFETY: a live allocation of `size` >= 16 bytes, in memory
                // the plugin proved read-write.
                unsafe {
                    (made.block.addr as *mut u64).write_unaligned(tag);
                    ((made.block.addr + size - 8) as *mut u64).write_unaligned(tag);
                }
            }
            ring.push_back((made.obj, size, tag, touching));
        }
        for (o, size, tag, touched) in ring {
            handles.gone(o.handle);
            if let Some(why) = release_block(ctx, m, touched, (o, size, tag)) {
                first.get_or_insert(why);
            }
        }
        first.map_or(Ok(()), Err)
    });
    verdict(
        errors,
        m,
        live,
        format!(
            "{} threads x {n} allocate/free pairs{}",
            ctx.opts.threads,
            if touch_blocks { ", contents checked" } else { "" }
        ),
    )
}

fn virtual_backing(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    if m.vb.is_none() {
        skip!("no virtual_backing capability (flag clear, pointer NULL)");
    }
    let live = m.live();
    let g = m.props.granularity;
    let rounds = (ctx.opts.iterations / 20).max(1);
    let errors = storm(ctx, ctx.opts.storm_stalls.unwrap_or(ENOUGH_OTHERS), |t| {
        for i in 0..rounds {
            let (made, tries) = patiently(|| m.reserve(&ctx.log, 4 * g), |a| a.status);
            if made.status != MEMPLUG_STATUS_OK {
                return Err(refused("reserve", made.status, tries));
            }
            let r = made.obj;
            let step = || -> Result<(), String> {
                let (s, tries) = patiently(|| m.commit(&ctx.log, &r, g, 2 * g), |s| *s);
                if s != MEMPLUG_STATUS_OK {
                    return Err(refused("commit", s, tries));
                }
                if st.touch_ok && m.is_cpu() {
                    touch(r.addr + g, 64, (t + i) as u8).map_err(|v| match v {
                        super::Verdict::Fail(s) | super::Verdict::Skip(s) => s,
                    })?;
                }
                let (s, n) = m.committed(&ctx.log, &r);
                if s != MEMPLUG_STATUS_OK || n != 2 * g {
                    return Err(format!(
                        "committed_bytes: {} ({n} bytes, expected {})",
                        status_name(s),
                        2 * g
                    ));
                }
                let s = m.decommit(&ctx.log, &r, g, 2 * g);
                if s != MEMPLUG_STATUS_OK {
                    return Err(format!("decommit: {}", status_name(s)));
                }
                Ok(())
            };
            let r1 = step();
            let s = m.release_reservation(&ctx.log, &r);
            r1?;
            if s != MEMPLUG_STATUS_OK {
                return Err(format!("release: {}", status_name(s)));
            }
        }
        Ok(())
    });
    verdict(
        errors,
        m,
        live,
        format!("{} threads x {rounds} reserve/commit/decommit/release rounds", ctx.opts.threads),
    )
}

fn sync(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    if m.sync.is_none() {
        skip!("no sync capability (flag clear, pointer NULL)");
    }
    let live = m.live();
    let rounds = if st.fences_stuck { 1 } else { 10 };
    let timeout = super::sync::completion_timeout(ctx, st);
    let errors = storm(ctx, ctx.opts.storm_stalls.unwrap_or(ENOUGH_OTHERS), |t| {
        for i in 0..rounds {
            let ((s, h), tries) = patiently(|| m.stream_create(&ctx.log), |a| a.0);
            if s != MEMPLUG_STATUS_OK {
                return Err(refused("stream_create", s, tries));
            }
            let seen = Arc::new(Mutex::new(Vec::new()));
            let step = || -> Result<(), String> {
                let s = super::enqueue_job(m, &ctx.log, h, Job::Push(seen.clone(), (t * 1000 + i) as u32));
                if s != MEMPLUG_STATUS_OK {
                    return Err(format!("enqueue_host_fn: {}", status_name(s)));
                }
                let (s, f) = m.fence_record(&ctx.log, h);
                if s != MEMPLUG_STATUS_OK {
                    return Err(format!("fence_record: {}", status_name(s)));
                }
                let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
                let w = m.fence_wait(&ctx.log, f, ns);
                let d = m.fence_destroy(&ctx.log, f);
                if w != MEMPLUG_STATUS_OK {
                    return Err(format!("fence_wait({timeout:?}): {}", status_name(w)));
                }
                if seen.lock().unwrap_or_else(|e| e.into_inner()).len() != 1 {
                    return Err("the fence completed before its host function ran".into());
                }
                if d != MEMPLUG_STATUS_OK {
                    return Err(format!("fence_destroy: {}", status_name(d)));
                }
                Ok(())
            };
            let r = step();
            let s = m.stream_destroy(&ctx.log, h);
            r?;
            if s != MEMPLUG_STATUS_OK {
                return Err(format!("stream_destroy: {}", status_name(s)));
            }
        }
        Ok(())
    });
    verdict(
        errors,
        m,
        live,
        format!("{} threads x {rounds} stream/host function/fence rounds", ctx.opts.threads),
    )
}

/// What one round of the shared-mapping storm still holds, so a round that
/// fails half-way gives back what it made.
struct Held<'a> {
    m: &'a Mech,
    ctx: &'a Ctx,
    r: MemplugObjectRef,
    o: MemplugObjectRef,
    refs: u32,
    views: Vec<u64>,
}

impl Held<'_> {
    fn check(&self, what: &str, s: MemplugStatus) -> Result<(), String> {
        if s == MEMPLUG_STATUS_OK {
            Ok(())
        } else {
            Err(format!("{what}: {}", status_name(s)))
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let g = self.m.props.granularity;
        for off in self.views.drain(..) {
            self.m.unmap(&self.ctx.log, &self.r, off, 2 * g);
        }
        for _ in 0..self.refs {
            self.m.release_object(&self.ctx.log, &self.o);
        }
    }
}

/// One round: create, map twice (read-write, then read-only, after a
/// retain), check both views show the same memory (CPU), unmap the first,
/// drop both references, unmap the last view (which frees the object).
fn shared_round(ctx: &Ctx, m: &Mech, r: &MemplugObjectRef, touch: bool, tag: u64) -> Result<(), String> {
    let g = m.props.granularity;
    let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
    let (made, tries) = patiently(|| m.create(&ctx.log, 2 * g), |a| a.status);
    if made.status != MEMPLUG_STATUS_OK {
        return Err(refused("create", made.status, tries));
    }
    let mut h = Held { m, ctx, r: *r, o: made.obj, refs: 1, views: Vec::new() };
    let o = made.obj;
    h.check("map [0, 2g) read-write", m.map(&ctx.log, &o, 0, r, 0, 2 * g, rw))?;
    h.views.push(0);
    h.check("retain", m.retain(&ctx.log, &o))?;
    h.refs += 1;
    h.check("map [2g, 4g) read-only", m.map(&ctx.log, &o, 0, r, 2 * g, 2 * g, MEMPLUG_ACCESS_READ))?;
    h.views.push(2 * g);
    if touch {
        if !crate::os::writable(r.addr, 8) {
            return Err(format!("the read-write view at {:#x} is not mapped read-write", r.addr));
        }
        if !crate::os::protection(r.addr + 2 * g, 8).is_some_and(|p| p.read) {
            return Err(format!("the read-only view at {:#x} is not mapped readable", r.addr + 2 * g));
        }
        // SAFETY: both views lie in this thread's own reservation and were
        // just checked mapped (read-write, and readable).
        let seen = unsafe {
            (r.addr as *mut u64).write_volatile(tag);
            ((r.addr + 2 * g) as *const u64).read_volatile()
        };
        if seen != tag {
            return Err(format!(
                "the two views of one object show different memory ({seen:#x} read back for {tag:#x})"
            ));
        }
    }
    h.check("unmap [0, 2g)", m.unmap(&ctx.log, r, 0, 2 * g))?;
    h.views.retain(|&v| v != 0);
    for which in ["release of the retained reference", "release of the create reference"] {
        h.check(which, m.release_object(&ctx.log, &o))?;
        h.refs -= 1;
    }
    h.check("unmap of the last view [2g, 4g)", m.unmap(&ctx.log, r, 2 * g, 2 * g))?;
    h.views.clear();
    Ok(())
}

fn shared_mapping(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    if m.sm.is_none() {
        skip!("no shared_mapping capability (flag clear, pointer NULL)");
    }
    if m.vb.is_none() {
        skip!("mapping needs reservations, and the mechanism has no virtual_backing capability");
    }
    let live = m.live();
    let g = m.props.granularity;
    let rounds = (ctx.opts.iterations / 20).max(1);
    let touch = st.touch_ok && m.is_cpu();
    let errors = storm(ctx, ctx.opts.storm_stalls.unwrap_or(ENOUGH_OTHERS), |t| {
        let (made, tries) = patiently(|| m.reserve(&ctx.log, 4 * g), |a| a.status);
        if made.status != MEMPLUG_STATUS_OK {
            return Err(refused("reserve", made.status, tries));
        }
        let r = made.obj;
        let mut result = Ok(());
        for i in 0..rounds {
            if let Err(why) = shared_round(ctx, m, &r, touch, (t as u64) << 32 | i as u64) {
                result = Err(format!("round {i}: {why}"));
                break;
            }
        }
        let s = m.release_reservation(&ctx.log, &r);
        result?;
        if s != MEMPLUG_STATUS_OK {
            return Err(format!("release of the reservation: {}", status_name(s)));
        }
        Ok(())
    });
    verdict(
        errors,
        m,
        live,
        format!(
            "{} threads x {rounds} create/map/retain/map/unmap/release/release/unmap rounds, each in its own \
             reservation{}",
            ctx.opts.threads,
            if touch { ", both views checked to show one object" } else { "" }
        ),
    )
}

//! `concurrency.*`: several threads calling the same mechanism at once.

use super::allocator::touch;
use super::{ensure, expect_live, skip, Checked, Ctx, Job, MechState, Results};
use crate::raw::{request, status_name, Mech};
use memplug_sdk::abi::*;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech, st: &MechState) {
    let name = Some(m.name.as_str());
    res.run("concurrency.allocator", name, || allocator(ctx, m, st));
    res.run("concurrency.virtual_backing", name, || virtual_backing(ctx, m, st));
    res.run("concurrency.sync", name, || sync(ctx, m, st));
}

/// Runs `body(thread)` on `ctx.opts.threads` threads; the errors, first
/// per thread.
fn storm(ctx: &Ctx, body: impl Fn(usize) -> Result<(), String> + Sync) -> Vec<String> {
    let errors = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..ctx.opts.threads.max(1) {
            let (body, errors) = (&body, &errors);
            s.spawn(move || {
                if let Err(e) = body(t) {
                    errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("thread {t}: {e}"));
                }
            });
        }
    });
    errors.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn verdict(errors: Vec<String>, m: &Mech, live: u64, done: String) -> Checked {
    ensure!(errors.is_empty(), "{} thread(s) failed: {}", errors.len(), errors.join("; "));
    expect_live(m, live, "after every thread released what it made")?;
    Ok(done)
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
        err = err.or(Some(format!("deallocate: {}", status_name(s))));
    }
    err
}

fn allocator(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    let live = m.live();
    let n = ctx.opts.iterations;
    let touch_blocks = st.touch_ok && m.is_cpu();
    let errors = storm(ctx, |t| {
        let mut ring: VecDeque<(MemplugObjectRef, u64, u64, bool)> = VecDeque::new();
        let mut first: Option<String> = None;
        let mut touching = touch_blocks;
        for i in 0..n {
            if ring.len() == 8 {
                for _ in 0..4 {
                    if let Some((o, size, tag, touched)) = ring.pop_front() {
                        if let Some(e) = release_block(ctx, m, touched, (o, size, tag)) {
                            first.get_or_insert(e);
                        }
                    }
                }
            }
            let size = 16 + ((i as u64 * 37) % 512);
            let made = m.allocate(&ctx.log, &request(m, size, m.props.min_alignment));
            if made.status != MEMPLUG_STATUS_OK {
                first.get_or_insert(format!("allocate({size}): {}", status_name(made.status)));
                continue;
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
            if let Some(e) = release_block(ctx, m, touched, (o, size, tag)) {
                first.get_or_insert(e);
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
    let errors = storm(ctx, |t| {
        for i in 0..rounds {
            let made = m.reserve(&ctx.log, 4 * g);
            if made.status != MEMPLUG_STATUS_OK {
                return Err(format!("reserve: {}", status_name(made.status)));
            }
            let r = made.obj;
            let step = || -> Result<(), String> {
                let s = m.commit(&ctx.log, &r, g, 2 * g);
                if s != MEMPLUG_STATUS_OK {
                    return Err(format!("commit: {}", status_name(s)));
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
    let errors = storm(ctx, |t| {
        for i in 0..rounds {
            let (s, h) = m.stream_create(&ctx.log);
            if s != MEMPLUG_STATUS_OK {
                return Err(format!("stream_create: {}", status_name(s)));
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

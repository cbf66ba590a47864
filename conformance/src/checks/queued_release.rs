//! `ordering.release_waits_for_work`: `decommit_on` and `unmap_on` take
//! memory away only after the work queued before them on the same stream.
//!
//! That is what queue-ordered binding exists for: a kernel (on a CPU
//! stream, a host function) enqueued before the release still reads the
//! range; a plugin that decommits at the call, not when the stream gets
//! there, pulls the memory from under it (on a GPU that kills the
//! context). `ordering.commit_on` only looks after the fence. Here the
//! stream is held by a host function, the release is queued behind it,
//! and the kit checks, while the function still holds the stream, that
//! the range is still mapped read-write and keeps its bytes; then it lets
//! the stream go and checks the range is gone once the fence completes.

use super::host_fns::{enqueue_job, Gate, Job};
use super::ordering::{complete, gone, queued};
use super::{ensure, expect, skip, Checked, Ctx, MechState, Scope, Verdict};
use crate::raw::{FenceOut, Mech};
use memplug_sdk::abi::*;
use std::sync::Arc;

/// The pattern the kit leaves in the range before the release is queued.
const PATTERN: u8 = 0xc3;

/// Whether `[addr, addr + len)` is mapped read-write and holds `PATTERN`.
fn intact(addr: u64, len: u64) -> Result<(), String> {
    if !crate::os::writable(addr, len) {
        return Err("is no longer mapped read-write".into());
    }
    let page = crate::os::page_size();
    for off in (0..len).step_by(page as usize) {
        // SAFETY: mapped read-write (checked above), the kit's range.
        let b = unsafe { ((addr + off) as *const u8).read_volatile() };
        if b != PATTERN {
            return Err(format!("reads {b:#04x} at offset {off:#x} where the kit wrote {PATTERN:#04x}"));
        }
    }
    Ok(())
}

fn fill(addr: u64, len: u64) {
    let page = crate::os::page_size();
    for off in (0..len).step_by(page as usize) {
        // SAFETY: callers checked the range is mapped read-write.
        unsafe { ((addr + off) as *mut u8).write_volatile(PATTERN) };
    }
}

/// Holds `stream` with a gate, queues `release` behind it, judges the
/// range while held, then opens the gate and waits for the fence.
fn held_release(
    ctx: &Ctx,
    m: &Mech,
    st: &MechState,
    stream: u64,
    (addr, len): (u64, u64),
    what: &str,
    release: &dyn Fn() -> (MemplugStatus, u64),
) -> Result<(), Verdict> {
    let gate = Arc::new(Gate::default());
    expect(
        enqueue_job(m, &ctx.log, stream, Job::Gate(gate.clone())),
        &[MEMPLUG_STATUS_OK],
        "enqueue_host_fn of the function holding the stream",
    )?;
    let (c, f) = release();
    if c != MEMPLUG_STATUS_OK {
        gate.open();
        expect(c, &[MEMPLUG_STATUS_OK], &format!("{what} behind a held stream"))?;
    }
    // Give a plugin that releases on a thread of its own a moment.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let early = intact(addr, len);
    gate.open();
    let done = complete(ctx, m, st, f, what);
    if let Err(why) = early {
        return Err(Verdict::Fail(format!(
            "{what} took the memory away before the work queued earlier on the same stream had run: while a host \
             function enqueued before it still held the stream, [{addr:#x}, +{len}) {why}. Queue the release behind \
             the stream's work (release when the stream gets there, as its fence says)"
        )));
    }
    done?;
    ensure!(gone(addr, len), "once {what}'s fence completed, [{addr:#x}, +{len}) is still accessible");
    Ok(())
}

pub(super) fn release_waits(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    queued(m)?;
    if m.vb.and_then(|v| v.decommit_on).is_none() {
        skip!("decommit_on not published (descriptor.vtables says why)");
    }
    if !m.is_cpu() {
        skip!(
            "device {} is not host memory: whether a range is still mapped while work holds the stream cannot be \
             seen from the host",
            super::descriptor::device_string(m.device)
        );
    }
    let g = m.props.granularity.max(1);
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let r = s.reserve_ok(2 * g)?;
    expect(m.commit(&ctx.log, &r, 0, g), &[MEMPLUG_STATUS_OK], "commit [0, g)")?;
    ensure!(crate::os::writable(r.addr, g), "committed [0, g) is not mapped read-write");
    fill(r.addr, g);
    let release = || m.decommit_on(&ctx.log, &r, 0, g, h, FenceOut::Kit);
    held_release(ctx, m, st, h, (r.addr, g), "decommit_on", &release)?;
    let mut did = vec!["decommit_on"];
    if m.sm.is_some_and(|v| v.unmap_on.is_some()) {
        let o = s.create_ok(g)?;
        let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
        expect(s.map(&o, 0, &r, g, g, rw), &[MEMPLUG_STATUS_OK], "map of an object at [g, 2g)")?;
        ensure!(crate::os::writable(r.addr + g, g), "the mapping at [g, 2g) is not read-write");
        fill(r.addr + g, g);
        let release = || m.unmap_on(&ctx.log, &r, g, g, h, FenceOut::Kit);
        held_release(ctx, m, st, h, (r.addr + g, g), "unmap_on", &release)?;
        did.push("unmap_on");
    }
    Ok(format!(
        "{} queued behind a host function holding the stream left the range mapped with its bytes until the \
         function ran, then took it away by the fence",
        did.join(" and ")
    ))
}

//! `ordering.*`: what ABI 1.2 adds to ordering work on a device and to
//! sharing it: queue-ordered binding (`MEMPLUG_CAP_QUEUED_BINDING`:
//! `commit_on`/`decommit_on`, `map_on`/`unmap_on` return fences), the
//! optional sync slots `stream_wait_fence` and `stream_adopt_typed`, and
//! peer access (`MEMPLUG_CAP_PEER_ACCESS`). Each check is skipped, saying
//! why, where the mechanism does not publish what it judges.

use super::sync::{completion_timeout, wait};
use super::{bounded, ensure, expect, expect_live, skip, Checked, Ctx, Gate, Job, MechState, Results, Scope};
use crate::raw::{status_name, FenceOut, Mech, ACCESS_UNWRITTEN};
use memplug_sdk::abi::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long `ordering.stream_wait_fence` leaves stream A held before it
/// looks at stream B's work.
const HELD: Duration = Duration::from_millis(100);
/// How long a queued call refused while its stream is held may take to
/// return (it must not wait for the stream).
const REFUSAL_LIMIT: Duration = Duration::from_secs(5);

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech, st: &MechState) {
    let name = Some(m.name.as_str());
    res.run("ordering.commit_on", name, || {
        queued(m)?;
        commit_on(ctx, m, st)
    });
    res.run("ordering.map_on", name, || {
        queued(m)?;
        if m.sm.is_none() {
            skip!("MEMPLUG_CAP_QUEUED_BINDING without shared mapping: no map_on/unmap_on");
        }
        map_on(ctx, m, st)
    });
    res.run("ordering.release_waits_for_work", name, || super::queued_release::release_waits(ctx, m, st));
    res.run("ordering.queued_refusals", name, || {
        queued(m)?;
        queued_refusals(ctx, m, st)
    });
    res.run("ordering.stream_wait_fence", name, || stream_wait_fence(ctx, m, st));
    res.run("ordering.stream_adopt_typed", name, || stream_adopt_typed(ctx, m));
    res.run("ordering.peer_access", name, || peer_access(ctx, m));
}

fn require_1_2(m: &Mech) -> Result<(), super::Verdict> {
    if m.agreed_minor < 2 {
        skip!("the agreed minor is 1.{}: ABI 1.2 slots are not used", m.agreed_minor);
    }
    Ok(())
}

/// Skips unless the mechanism has queue-ordered binding (whose slots the
/// kit read: `descriptor.vtables` checked them).
pub(super) fn queued(m: &Mech) -> Result<(), super::Verdict> {
    require_1_2(m)?;
    if m.caps & MEMPLUG_CAP_QUEUED_BINDING == 0 {
        skip!("no MEMPLUG_CAP_QUEUED_BINDING (commit_on/decommit_on, map_on/unmap_on not published)");
    }
    if m.vb.and_then(|v| v.commit_on).is_none() || m.sync.is_none() {
        skip!("MEMPLUG_CAP_QUEUED_BINDING without the virtual backing slots or sync (descriptor.* says why)");
    }
    Ok(())
}

/// Waits for a fence a queued call returned (the kit owns it: destroyed
/// here).
pub(super) fn complete(
    ctx: &Ctx,
    m: &Mech,
    st: &MechState,
    fence: u64,
    what: &str,
) -> Result<(), super::Verdict> {
    ensure!(fence != 0, "{what} returned OK with the fence 0");
    let timeout = completion_timeout(ctx, st);
    let w = wait(ctx, m, fence, timeout);
    let d = m.fence_destroy(&ctx.log, fence);
    expect(w?, &[MEMPLUG_STATUS_OK], &format!("fence_wait({timeout:?}) on the fence of {what}"))?;
    expect(d, &[MEMPLUG_STATUS_OK], &format!("fence_destroy of the fence of {what}"))
}

/// Writes and reads back a pattern through `[addr, addr + len)` (memory the
/// kit may touch: host-visible and said usable).
fn touch(addr: u64, len: u64, what: &str) -> Result<(), super::Verdict> {
    ensure!(crate::os::writable(addr, len), "{what}: [{addr:#x}, +{len}) is not mapped read-write");
    let page = crate::os::page_size();
    // SAFETY: mapped read-write (checked above), inside the kit's object.
    let ok = (0..len).step_by(page as usize).all(|i| unsafe {
        let p = (addr + i) as *mut u8;
        p.write_volatile(0x3c);
        p.read_volatile() == 0x3c
    });
    ensure!(ok, "{what}: a byte written through [{addr:#x}, +{len}) did not read back");
    Ok(())
}

pub(super) fn gone(addr: u64, len: u64) -> bool {
    !crate::os::protection(addr, len).is_some_and(|p| p.read || p.write)
}

/// `ordering.commit_on`.
fn commit_on(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    let g = m.props.granularity.max(1);
    let mut s = Scope::new(ctx, m);
    let r = s.reserve_ok(4 * g)?;
    let h = s.stream_ok()?;
    let live = m.live();
    let (c, f) = m.commit_on(&ctx.log, &r, 0, 2 * g, h, FenceOut::Kit);
    expect(c, &[MEMPLUG_STATUS_OK], "commit_on [0, 2g)")?;
    expect_live(m, live + 1, "with the fence commit_on returned")?;
    complete(ctx, m, st, f, "commit_on [0, 2g)")?;
    let (cs, n) = m.committed(&ctx.log, &r);
    expect(cs, &[MEMPLUG_STATUS_OK], "committed_bytes after commit_on")?;
    ensure!(n == 2 * g, "committed_bytes is {n} after commit_on [0, 2g) completed, expected {}", 2 * g);
    let visible = m.is_cpu();
    if visible {
        touch(r.addr, 2 * g, "once commit_on's fence completed")?;
    }
    let (c, f) = m.decommit_on(&ctx.log, &r, 0, g, h, FenceOut::Kit);
    expect(c, &[MEMPLUG_STATUS_OK], "decommit_on [0, g)")?;
    complete(ctx, m, st, f, "decommit_on [0, g)")?;
    let (cs, n) = m.committed(&ctx.log, &r);
    expect(cs, &[MEMPLUG_STATUS_OK], "committed_bytes after decommit_on")?;
    ensure!(n == g, "committed_bytes is {n} after decommit_on [0, g) completed, expected {g}");
    if visible {
        ensure!(gone(r.addr, g), "once decommit_on's fence completed, [0, g) is still accessible");
    }
    expect(m.decommit(&ctx.log, &r, g, g), &[MEMPLUG_STATUS_OK], "decommit [g, 2g)")?;
    Ok(format!(
        "commit_on and decommit_on returned fences that completed, after which committed_bytes was exact{}",
        if visible { " and the range was read-write, then inaccessible" } else { "" }
    ))
}

/// `ordering.map_on`.
fn map_on(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    if m.sm.and_then(|v| v.map_on).is_none() {
        skip!("map_on/unmap_on not published (descriptor.vtables says why)");
    }
    let g = m.props.granularity.max(1);
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(g)?;
    let r = s.reserve_ok(2 * g)?;
    let h = s.stream_ok()?;
    let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
    let (c, f) = m.map_on(&ctx.log, &o, 0, &r, (0, g), rw, h, FenceOut::Kit);
    expect(c, &[MEMPLUG_STATUS_OK], "map_on of the object at [0, g)")?;
    let done = complete(ctx, m, st, f, "map_on");
    if done.is_err() {
        // Leave nothing mapped behind (the scope does not know of it).
        m.unmap(&ctx.log, &r, 0, g);
    }
    done?;
    let visible = m.is_cpu();
    let touched = if visible { touch(r.addr, g, "once map_on's fence completed") } else { Ok(()) };
    let (c, f) = m.unmap_on(&ctx.log, &r, 0, g, h, FenceOut::Kit);
    if c != MEMPLUG_STATUS_OK {
        m.unmap(&ctx.log, &r, 0, g);
    }
    touched?;
    expect(c, &[MEMPLUG_STATUS_OK], "unmap_on [0, g)")?;
    complete(ctx, m, st, f, "unmap_on")?;
    if visible {
        ensure!(gone(r.addr, g), "once unmap_on's fence completed, [0, g) is still accessible");
    }
    Ok(format!(
        "map_on and unmap_on returned fences that completed{}",
        if visible { ", after which the mapping was read-write, then gone" } else { "" }
    ))
}

/// `ordering.queued_refusals`.
fn queued_refusals(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    let g = m.props.granularity.max(1);
    let mut s = Scope::new(ctx, m);
    let r = s.reserve_ok(4 * g)?;
    let size = r.size;
    let h = s.stream_ok()?;
    // The stream is held: a call that enqueued anything before refusing
    // would be seen (a fence, committed bytes) once it drains.
    let gate = Arc::new(Gate::default());
    s.enqueue_ok(h, Job::Gate(gate.clone()))?;
    // The object the map_on refusals name exists before the count is taken.
    let object = match m.sm.and_then(|v| v.map_on) {
        Some(_) => Some(s.create_ok(g)?),
        None => None,
    };
    let live = m.live();
    let range = [MEMPLUG_STATUS_OUT_OF_RANGE];
    let cases: [(&str, u64, u64); 3] = [
        ("past the end", size, g),
        ("straddling the end", size - g, 2 * g),
        ("overflowing", g, u64::MAX - g + 1),
    ];
    let mut calls = 0;
    for (what, off, len) in cases {
        let (mm, log, rr) = (m.clone(), ctx.log.clone(), r);
        let Some((c, _)) =
            bounded(REFUSAL_LIMIT, move || mm.commit_on(&log, &rr, off, len, h, FenceOut::Kit))
        else {
            gate.open();
            super::fail!(
                "commit_on {what} had not returned after {REFUSAL_LIMIT:?} while its stream was held"
            );
        };
        expect(c, &range, &format!("commit_on {what}"))?;
        let (mm, log, rr) = (m.clone(), ctx.log.clone(), r);
        if let Some((c, _)) =
            bounded(REFUSAL_LIMIT, move || mm.decommit_on(&log, &rr, off, len, h, FenceOut::Kit))
        {
            expect(c, &range, &format!("decommit_on {what}"))?;
        } else {
            gate.open();
            super::fail!(
                "decommit_on {what} had not returned after {REFUSAL_LIMIT:?} while its stream was held"
            );
        }
        calls += 2;
    }
    let (c, _) = m.commit_on(&ctx.log, &r, 0, g, h, FenceOut::Null);
    expect(c, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "commit_on with a NULL out_fence")?;
    let (c, _) = m.decommit_on(&ctx.log, &r, 0, g, h, FenceOut::Null);
    expect(
        c,
        &[MEMPLUG_STATUS_INVALID_ARGUMENT, MEMPLUG_STATUS_INVALID_STATE],
        "decommit_on with a NULL out_fence",
    )?;
    calls += 2;
    let mut mapped = String::new();
    if let Some(o) = object {
        let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
        let (c, _) = m.map_on(&ctx.log, &o, 0, &r, (size, g), rw, h, FenceOut::Kit);
        expect(c, &range, "map_on past the reservation's end")?;
        let (c, _) = m.map_on(&ctx.log, &o, 0, &r, (0, g), rw, h, FenceOut::Null);
        expect(c, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "map_on with a NULL out_fence")?;
        let (c, _) = m.unmap_on(&ctx.log, &r, size, g, h, FenceOut::Kit);
        expect(c, &range, "unmap_on past the reservation's end")?;
        calls += 3;
        mapped = ", map_on and unmap_on".into();
    }
    expect_live(m, live, "after the refused queued calls (no fence may be made)")?;
    gate.open();
    let f = s.fence_ok(h)?;
    let timeout = completion_timeout(ctx, st);
    expect(wait(ctx, m, f, timeout)?, &[MEMPLUG_STATUS_OK], "fence_wait once the stream was released")?;
    let (cs, n) = m.committed(&ctx.log, &r);
    expect(cs, &[MEMPLUG_STATUS_OK], "committed_bytes once the stream drained")?;
    ensure!(n == 0, "{n} bytes are committed after only refused commit_on calls");
    if m.is_cpu() {
        ensure!(gone(r.addr, size), "a refused commit_on or map_on made part of the reservation accessible");
    }
    Ok(format!(
        "{calls} refused calls (commit_on, decommit_on{mapped}: out of range, NULL out_fence) answered while the \
         stream was held, made no fence and, once it drained, nothing committed"
    ))
}

/// `ordering.stream_wait_fence`.
fn stream_wait_fence(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    require_1_2(m)?;
    if m.sync.is_none() {
        skip!("no sync capability (flag clear, pointer NULL)");
    }
    if m.sync.and_then(|s| s.stream_wait_fence).is_none() {
        skip!("stream_wait_fence is not published (optional)");
    }
    let mut s = Scope::new(ctx, m);
    let a = s.stream_ok()?;
    let b = s.stream_ok()?;
    let gate = Arc::new(Gate::default());
    s.enqueue_ok(a, Job::Gate(gate.clone()))?;
    let fa = s.fence_ok(a)?;
    expect(m.stream_wait_fence(&ctx.log, b, fa), &[MEMPLUG_STATUS_OK], "stream_wait_fence(B, A's fence)")?;
    let ran = Arc::new(AtomicBool::new(false));
    s.enqueue_ok(b, Job::SleepThenSet(Duration::ZERO, ran.clone()))?;
    let fb = s.fence_ok(b)?;
    std::thread::sleep(HELD);
    let early = ran.load(Ordering::SeqCst);
    let q = m.fence_query(&ctx.log, fb);
    gate.open();
    ensure!(!early, "work enqueued on stream B after stream_wait_fence(B, A's fence) ran while A was held");
    expect(q, &[MEMPLUG_STATUS_NOT_READY], "fence_query of B's fence while A is held")?;
    let timeout = completion_timeout(ctx, st);
    expect(wait(ctx, m, fb, timeout)?, &[MEMPLUG_STATUS_OK], "fence_wait on B's fence once A was released")?;
    ensure!(ran.load(Ordering::SeqCst), "B's fence completed before the work enqueued before it ran");
    let forged = m.stream_wait_fence(&ctx.log, b, 0x7ead_beef_0003);
    ensure!(forged != MEMPLUG_STATUS_OK, "stream_wait_fence with a fence never recorded answered OK");
    Ok(format!(
        "work on stream B behind A's fence waited while A was held, then ran; a forged fence was refused ({})",
        status_name(forged)
    ))
}

/// A device kind no minor defines: neither a DLPack number nor the
/// vendors' range.
const UNKNOWN_KIND: u32 = 0x00ff_0000;

/// `ordering.stream_adopt_typed`.
fn stream_adopt_typed(ctx: &Ctx, m: &Mech) -> Checked {
    require_1_2(m)?;
    if m.sync.is_none() {
        skip!("no sync capability (flag clear, pointer NULL)");
    }
    debug_assert!(
        crate::raw::device_kind_name(UNKNOWN_KIND).is_none() && !crate::raw::is_vendor_kind(UNKNOWN_KIND)
    );
    // Something readable to point at, should the plugin look before it
    // judges the kind.
    let mut native = [0u64; 16];
    let live = m.live();
    let Some((c, h)) = m.stream_adopt_typed(&ctx.log, UNKNOWN_KIND, native.as_mut_ptr().cast()) else {
        skip!("stream_adopt_typed is not published (optional)");
    };
    if c == MEMPLUG_STATUS_OK {
        m.stream_destroy(&ctx.log, h);
    }
    expect(
        c,
        &[MEMPLUG_STATUS_UNSUPPORTED],
        &format!("stream_adopt_typed of the unknown kind {UNKNOWN_KIND:#x}"),
    )?;
    expect_live(m, live, "after the refused stream_adopt_typed")?;
    Ok(format!("an unknown native kind ({UNKNOWN_KIND:#x}) is UNSUPPORTED and makes nothing"))
}

/// `ordering.peer_access`.
fn peer_access(ctx: &Ctx, m: &Mech) -> Checked {
    require_1_2(m)?;
    if m.caps & MEMPLUG_CAP_PEER_ACCESS == 0 {
        skip!("no MEMPLUG_CAP_PEER_ACCESS (peer access not published)");
    }
    if m.peer.is_none() {
        skip!("MEMPLUG_CAP_PEER_ACCESS without a readable peer_access table (descriptor.* says why)");
    }
    let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
    let peers = [
        m.device,
        MemplugDevice { kind: m.device.kind, ordinal: m.device.ordinal.wrapping_add(1) },
        MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 },
        MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 },
    ];
    let mut granted = None;
    let mut answers = Vec::new();
    for p in peers {
        let (c, bits) = m.can_access_peer(&ctx.log, &p);
        let dev = super::descriptor::device_string(p);
        expect(c, &[MEMPLUG_STATUS_OK, MEMPLUG_STATUS_WRONG_DEVICE], &format!("can_access_peer({dev})"))?;
        if c == MEMPLUG_STATUS_OK {
            ensure!(
                bits != ACCESS_UNWRITTEN,
                "can_access_peer({dev}) answered OK without writing out_access"
            );
            ensure!(
                bits & !rw == 0,
                "can_access_peer({dev}) answered access bits {bits:#x}: only MEMPLUG_ACCESS_READ and \
                 MEMPLUG_ACCESS_WRITE are defined"
            );
            ensure!(
                bits & MEMPLUG_ACCESS_WRITE == 0 || bits & MEMPLUG_ACCESS_READ != 0,
                "can_access_peer({dev}) answered WRITE without READ ({bits:#x}): access is READ or READ|WRITE, as \
                 for mappings (a peer that may write may read)"
            );
            if bits != 0 && granted.is_none() {
                granted = Some((p, bits));
            }
            answers.push(format!("{dev}: {bits:#x}"));
        } else {
            answers.push(format!("{dev}: WRONG_DEVICE"));
        }
    }
    if m.vb.is_none() {
        return Ok(format!(
            "can_access_peer answered only READ/WRITE bits ({}); set_peer_access not tried: no virtual backing, \
             so no reservation to name",
            answers.join(", ")
        ));
    }
    let g = m.props.granularity.max(1);
    let mut s = Scope::new(ctx, m);
    let r = s.reserve_ok(2 * g)?;
    expect(m.commit(&ctx.log, &r, 0, g), &[MEMPLUG_STATUS_OK], "commit [0, g)")?;
    let (peer, bits) = granted.unwrap_or((m.device, MEMPLUG_ACCESS_READ));
    let dev = super::descriptor::device_string(peer);
    // Without a peer that can be given access, the range need not be
    // judged first.
    let range: &[MemplugStatus] = if granted.is_some() {
        &[MEMPLUG_STATUS_OUT_OF_RANGE]
    } else {
        &[MEMPLUG_STATUS_OUT_OF_RANGE, MEMPLUG_STATUS_UNSUPPORTED, MEMPLUG_STATUS_WRONG_DEVICE]
    };
    let size = r.size;
    for (what, off, len) in
        [("past the end", size, g), ("straddling the end", size - g, 2 * g), ("overflowing", g, u64::MAX)]
    {
        let c = m.set_peer_access(&ctx.log, &r, off, len, &peer, bits);
        expect(c, range, &format!("set_peer_access({dev}) {what}"))?;
    }
    for unknown in [1u32 << 2, 1 << 31] {
        let c = m.set_peer_access(&ctx.log, &r, 0, g, &peer, bits | unknown);
        expect(
            c,
            &[MEMPLUG_STATUS_INVALID_ARGUMENT, MEMPLUG_STATUS_UNSUPPORTED],
            &format!("set_peer_access({dev}) with the unknown access bit {unknown:#x}"),
        )?;
    }
    expect(m.decommit(&ctx.log, &r, 0, g), &[MEMPLUG_STATUS_OK], "decommit [0, g)")?;
    Ok(format!(
        "can_access_peer answered only READ/WRITE bits ({}); set_peer_access({dev}) refused ranges out of the \
         reservation and unknown access bits",
        answers.join(", ")
    ))
}

//! `loss.*`: ABI 1.2 device loss, as a host sees it through its services.
//!
//! A plugin cannot be made to lose a device from outside, so the checks
//! that need a loss are conditional: they run when the plugin exports one
//! of the kit's test triggers (`LOSS_TRIGGERS`), and are skipped, saying
//! so, when it exports none.
//!
//! Every `loss.*` check works on a fresh instance of the plugin of its
//! own, negotiated once with the kit's 1.2 host (`checks/fresh.rs`).
//!
//! What the kit requires of a loss (`include/memplug.h`, ABI 1.2): the
//! report arrives through `report_device_lost` naming the mechanism (from
//! any thread, before or after the trigger returns), its reason is a valid
//! (pointer, length) pair of UTF-8, it names only mechanisms the plugin
//! publishes, and from then on every published slot of the mechanism
//! answers `MEMPLUG_STATUS_DEVICE_LOST`, with arguments that would have
//! succeeded before, without crashing or hanging (a hang is the check's
//! timeout; the kit writes which slot it is calling to the process's
//! stderr, so a crash's or timeout's detail names it).

use super::descriptor_claims::{FD_HANDLES, KNOWN_HANDLES};
use super::fresh::{fresh, mark, not_enabled, pull};
use super::{ensure, expect, skip, Checked, Ctx, Results, Verdict};
use crate::raw::{object_ref, request, status_name, FenceOut, Mech};
use crate::services::{Phase, Reason, Seen};
use crate::sink::Log;
use core::ffi::c_void;
use memplug_sdk::abi::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// ---------------------------------------------------------------------------
// Judgements (over what was recorded)
// ---------------------------------------------------------------------------

/// What is wrong with the reports a plugin made through the kit's
/// services, given the mechanisms it publishes and the agreed minor: one
/// sentence per problem, empty when nothing is.
pub(crate) fn judge_reports(seen: &[Seen], published: &[(u64, String)], agreed: u32) -> Vec<String> {
    let mut problems = Vec::new();
    let ids: Vec<String> =
        published.iter().map(|(id, n)| format!("'{}' (id {id})", crate::printable(n))).collect();
    if agreed < 2 && !seen.is_empty() {
        problems.push(format!(
            "called report_device_lost {} time(s) although it agreed on ABI 1.{agreed}: services are ABI 1.2, \
             used only at an agreed minor of 2 or more (the kit answered INVALID_STATE)",
            seen.len()
        ));
    }
    for r in seen {
        if !published.iter().any(|(id, _)| *id == r.mechanism_id) {
            problems.push(format!(
                "reports loss of a mechanism it does not own: mechanism id {} (it publishes {}; the kit answered \
                 {})",
                r.mechanism_id,
                ids.join(", "),
                status_name(r.answer)
            ));
        }
        match &r.reason {
            Reason::NullWithLength(n) => problems.push(format!(
                "reported the loss of mechanism id {} with reason NULL and reason_len {n}: a NULL reason has \
                 reason_len 0 (the kit answered {})",
                r.mechanism_id,
                status_name(r.answer)
            )),
            reason if !reason.is_utf8() => problems.push(format!(
                "reported the loss of mechanism id {} with a reason that is not UTF-8: {}",
                r.mechanism_id,
                reason.describe()
            )),
            _ => {}
        }
    }
    problems
}

/// The verdict on the answers of a mechanism's slots after its loss was
/// reported: `answers` as `(slot, status)`; `host_fn_ran` whether a host
/// function whose enqueue was answered then ran; `wrote` the slots that
/// changed their output although they failed.
pub(crate) fn judge_after_loss(
    answers: &[(&'static str, MemplugStatus)],
    host_fn_ran: bool,
    wrote: &[&'static str],
) -> Checked {
    let with = |f: &dyn Fn(MemplugStatus) -> bool| -> Vec<String> {
        answers
            .iter()
            .filter(|(_, s)| f(*s))
            .map(|(slot, s)| format!("{slot} ({})", status_name(*s)))
            .collect()
    };
    let mut problems = Vec::new();
    let ok: Vec<&str> =
        answers.iter().filter(|(_, s)| *s == MEMPLUG_STATUS_OK).map(|(slot, _)| *slot).collect();
    if !ok.is_empty() {
        problems.push(format!(
            "keeps succeeding after reporting loss: {} answered OK (after a reported loss every slot of the \
             mechanism answers DEVICE_LOST)",
            ok.join(", ")
        ));
    }
    let other = with(&|s| s != MEMPLUG_STATUS_OK && s != MEMPLUG_STATUS_DEVICE_LOST);
    if !other.is_empty() {
        problems.push(format!(
            "after reporting the loss, {} answered other than DEVICE_LOST (every later call of every slot fails \
             the same way)",
            other.join(", ")
        ));
    }
    if host_fn_ran {
        problems.push(
            "a host function enqueued after the loss ran (enqueue_host_fn failed, so it must never run)"
                .into(),
        );
    }
    if !wrote.is_empty() {
        problems.push(format!("{} changed its output although it failed", wrote.join(", ")));
    }
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    ensure!(!answers.is_empty(), "no slot was called after the loss");
    let slots: Vec<&str> = answers.iter().map(|(s, _)| *s).collect();
    Ok(format!(
        "after the reported loss all {} slots called answered DEVICE_LOST: {}",
        slots.len(),
        slots.join(", ")
    ))
}

// ---------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------

/// The per-mechanism `loss.*` checks.
pub(crate) fn run_mech(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let name = Some(m.name.as_str());
    res.run("loss.reported_through_services", name, || reported(ctx, m));
    res.run("loss.every_slot_device_lost", name, || every_slot(ctx, m));
    res.run("loss.host_fns_run_once", name, || super::loss_host_fns::host_fns_run_once(ctx, m));
    res.run("loss.none_below_1_2", name, || super::loss_minor::none_below_1_2(ctx, m));
}

/// The plugin-wide `loss.*` checks; `mechs` are the mechanisms checked.
pub(crate) fn run_plugin(res: &mut Results, ctx: &Ctx, mechs: &[Mech]) {
    res.run("loss.negotiation_reports", None, || negotiation_reports(ctx));
    res.run("loss.unknown_mechanism", None, || unknown_mechanism(ctx, mechs));
}

/// A short wait for reports a plugin makes from another thread.
const GRACE: Duration = Duration::from_millis(50);

/// `loss.reported_through_services`.
fn reported(ctx: &Ctx, m: &Mech) -> Checked {
    let f = fresh(ctx)?;
    f.require_1_2()?;
    let (t, trig) = f.trigger()?;
    let st = pull(t, trig, m.id);
    let synchronous = f.services.count();
    let arrived = st == MEMPLUG_STATUS_OK
        && f.services.wait_for(ctx.opts.fence_timeout, |r| r.mechanism_id == m.id && r.phase == Phase::Open);
    std::thread::sleep(GRACE);
    let seen = f.services.seen();
    let problems = judge_reports(&seen, &f.published(), f.agreed);
    ensure!(problems.is_empty(), "after {}({}): {}", t.symbol, m.id, problems.join("; "));
    if st != MEMPLUG_STATUS_OK {
        return Err(not_enabled(t, st, m.id, &m.name));
    }
    ensure!(
        arrived,
        "{}({}) answered OK, but no loss of mechanism '{}' (id {}) was reported through the kit's services \
         (report_device_lost) within {} s: a host is never told",
        t.symbol,
        m.id,
        m.name,
        m.id,
        ctx.opts.fence_timeout.as_secs_f64()
    );
    let (at, r) =
        seen.iter().enumerate().find(|(_, r)| r.mechanism_id == m.id && r.phase == Phase::Open).unwrap();
    let when = if at < synchronous { "before the trigger returned" } else { "after the trigger returned" };
    let others: Vec<String> =
        seen.iter().filter(|o| o.mechanism_id != m.id).map(|o| format!("id {}", o.mechanism_id)).collect();
    let others = if others.is_empty() {
        String::new()
    } else {
        format!("; it also reported {} (one device, several mechanisms)", others.join(", "))
    };
    Ok(format!(
        "{}({}) answered OK; the loss of '{}' (id {}) came through report_device_lost {}, {when}, with {}; the \
         kit answered {}{others}",
        t.symbol,
        m.id,
        m.name,
        m.id,
        r.thread(),
        r.reason.describe(),
        status_name(r.answer)
    ))
}

/// Objects made before the loss, so every slot after it gets arguments
/// that would have been good.
pub(super) struct Before {
    alloc: MemplugObjectRef,
    /// Three granules: the first committed, the third mapped from `object`
    /// (when the mechanism has shared mapping).
    reservation: Option<MemplugObjectRef>,
    object: Option<MemplugObjectRef>,
    /// An exported descriptor of `object` (ABI 1.1 export).
    fd: Option<i32>,
    stream: Option<(u64, u64)>,
}

pub(super) fn before(m: &Mech, log: &Log, gran: u64) -> Result<Before, Verdict> {
    let what = |s: &str| format!("before the loss, {s} (the check needs one object of each kind)");
    let align = m.props.min_alignment.max(1);
    let a = m.allocate(log, &request(m, 4096, align));
    expect(a.status, &[MEMPLUG_STATUS_OK], &what("allocate(4096)"))?;
    let mut b = Before { alloc: a.obj, reservation: None, object: None, fd: None, stream: None };
    if m.vb.is_some() {
        let r = m.reserve(log, 3 * gran);
        expect(r.status, &[MEMPLUG_STATUS_OK], &what(&format!("reserve({})", 3 * gran)))?;
        expect(m.commit(log, &r.obj, 0, gran), &[MEMPLUG_STATUS_OK], &what("commit of the first granule"))?;
        b.reservation = Some(r.obj);
    }
    if m.sm.is_some() {
        let o = m.create(log, gran);
        expect(o.status, &[MEMPLUG_STATUS_OK], &what(&format!("create({gran})")))?;
        if let Some(r) = &b.reservation {
            let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
            expect(m.map(log, &o.obj, 0, r, 2 * gran, gran, rw), &[MEMPLUG_STATUS_OK], &what("map"))?;
        }
        if m.sm.and_then(|s| s.export_fd).is_some() {
            let (st, fd) = m.export_fd(log, &o.obj);
            expect(st, &[MEMPLUG_STATUS_OK], &what("export_fd"))?;
            b.fd = Some(fd);
        }
        if let (Some(kind), None) = (fd_kind(m), b.fd) {
            // Typed export only: a descriptor for import_handle to get.
            let (st, out) = m.export_handle(log, &o.obj, kind, MEMPLUG_HANDLE_SIZE_1_2);
            expect(st, &[MEMPLUG_STATUS_OK], &what("export_handle"))?;
            b.fd = Some(out.read::<MemplugHandle>().fd);
        }
        b.object = Some(o.obj);
    }
    if m.sync.is_some() {
        let (st, s) = m.stream_create(log);
        expect(st, &[MEMPLUG_STATUS_OK], &what("stream_create"))?;
        let (st, fence) = m.fence_record(log, s);
        expect(st, &[MEMPLUG_STATUS_OK], &what("fence_record"))?;
        b.stream = Some((s, fence));
    }
    Ok(b)
}

/// The first descriptor kind of handle the mechanism offers, when it has
/// typed export.
fn fd_kind(m: &Mech) -> Option<u32> {
    m.sm.and_then(|s| s.export_handle)?;
    let kinds = m.props.export_types & FD_HANDLES;
    (kinds != 0).then(|| 1 << kinds.trailing_zeros())
}

/// The first kind of handle the mechanism offers (MEMFD when it says none).
fn first_kind(m: &Mech) -> u32 {
    let kinds = m.props.export_types & KNOWN_HANDLES;
    if kinds == 0 {
        MEMPLUG_HANDLE_MEMFD
    } else {
        1 << kinds.trailing_zeros()
    }
}

/// Set by [`host_fn`]: a host function the plugin should never run did.
static HOST_FN_RAN: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn host_fn(_: *mut c_void) {
    HOST_FN_RAN.store(true, Ordering::SeqCst);
}

/// Calls every published slot of `m` with the objects of `b`.
pub(super) fn sweep(m: &Mech, log: &Log, b: &Before, gran: u64) -> Vec<(&'static str, MemplugStatus)> {
    let mut out = Vec::new();
    let mut at = |slot: &'static str, f: &dyn Fn() -> MemplugStatus| {
        mark(&format!("calling {slot} after the reported loss"));
        out.push((slot, f()));
    };
    let align = m.props.min_alignment.max(1);
    at("allocator.properties", &|| m.properties(log, MEMPLUG_PROPERTIES_SIZE_1_0).0);
    if m.alloc.memory_info.is_some() {
        at("allocator.memory_info", &|| m.memory_info(log).map_or(MEMPLUG_STATUS_UNSUPPORTED, |r| r.0));
    }
    at("allocator.allocate", &|| m.allocate(log, &request(m, 4096, align)).status);
    at("allocator.deallocate", &|| m.deallocate(log, &b.alloc));
    // Without virtual backing no reservation can exist: map and unmap get
    // a reference shaped like one.
    let res = b.reservation.unwrap_or_else(|| {
        let fake = MemplugBlock {
            struct_size: MEMPLUG_BLOCK_SIZE_1_0,
            addr: 1 << 40,
            size: 3 * gran,
            handle: 1,
            ..Default::default()
        };
        object_ref(m, crate::raw::next_object_id(), &fake)
    });
    if m.vb.is_some() {
        at("virtual_backing.reserve", &|| m.reserve(log, 3 * gran).status);
        at("virtual_backing.commit", &|| m.commit(log, &res, gran, gran));
        at("virtual_backing.committed_bytes", &|| m.committed(log, &res).0);
        at("virtual_backing.decommit", &|| m.decommit(log, &res, 0, gran));
        // ABI 1.2 queue-ordered binding, on the stream made before.
        if let (Some(vb), Some((s, _))) = (m.vb, b.stream) {
            if vb.commit_on.is_some() {
                at("virtual_backing.commit_on", &|| m.commit_on(log, &res, gran, gran, s, FenceOut::Kit).0);
            }
            if vb.decommit_on.is_some() {
                at("virtual_backing.decommit_on", &|| m.decommit_on(log, &res, 0, gran, s, FenceOut::Kit).0);
            }
        }
    }
    if let (Some(sm), Some(obj)) = (m.sm, b.object) {
        let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
        at("shared_mapping.create", &|| m.create(log, gran).status);
        at("shared_mapping.retain", &|| m.retain(log, &obj));
        at("shared_mapping.map", &|| m.map(log, &obj, 0, &res, gran, gran, rw));
        at("shared_mapping.unmap", &|| m.unmap(log, &res, 2 * gran, gran));
        if let Some((s, _)) = b.stream {
            if sm.map_on.is_some() {
                at("shared_mapping.map_on", &|| {
                    m.map_on(log, &obj, 0, &res, (gran, gran), rw, s, FenceOut::Kit).0
                });
            }
            if sm.unmap_on.is_some() {
                at("shared_mapping.unmap_on", &|| m.unmap_on(log, &res, 2 * gran, gran, s, FenceOut::Kit).0);
            }
        }
        if sm.export_fd.is_some() {
            at("shared_mapping.export_fd", &|| {
                let (st, fd) = m.export_fd(log, &obj);
                if st == MEMPLUG_STATUS_OK && fd > 2 {
                    // SAFETY: a descriptor the plugin made for this call.
                    unsafe { libc::close(fd) };
                }
                st
            });
        }
        if let (Some(_), Some(fd)) = (sm.import_fd, b.fd) {
            at("shared_mapping.import_fd", &|| m.import_fd(log, fd, gran).status);
        }
        if sm.export_handle.is_some() {
            // The first kind offered (any kind: a lost mechanism answers
            // before looking at it).
            let kind = first_kind(m);
            at("shared_mapping.export_handle", &|| {
                let (st, out) = m.export_handle(log, &obj, kind, MEMPLUG_HANDLE_SIZE_1_2);
                let fd = out.read::<MemplugHandle>().fd;
                if st == MEMPLUG_STATUS_OK && kind & FD_HANDLES != 0 && fd > 2 {
                    // SAFETY: a descriptor the plugin made for this call.
                    unsafe { libc::close(fd) };
                }
                st
            });
        }
        if sm.import_handle.is_some() {
            let kind = fd_kind(m).filter(|_| b.fd.is_some()).unwrap_or_else(|| first_kind(m));
            let h = MemplugHandle {
                struct_size: MEMPLUG_HANDLE_SIZE_1_2,
                handle_type: kind,
                fd: b.fd.unwrap_or(-1),
                ..Default::default()
            };
            let req = crate::raw::request_1_2(m, gran, gran);
            at("shared_mapping.import_handle", &|| m.import_handle(log, &h, &req).status);
        }
        at("shared_mapping.release", &|| m.release_object(log, &obj));
    }
    if m.peer.is_some() {
        // ABI 1.2 peer access: the mechanism's own device, its first
        // granule (committed before the loss).
        at("peer_access.can_access_peer", &|| m.can_access_peer(log, &m.device).0);
        at("peer_access.set_peer_access", &|| {
            m.set_peer_access(log, &res, 0, gran, &m.device, MEMPLUG_ACCESS_READ)
        });
    }
    if m.vb.is_some() {
        at("virtual_backing.release", &|| m.release_reservation(log, &res));
    }
    if let (Some(sync), Some((s, fence))) = (m.sync, b.stream) {
        at("sync.stream_create", &|| m.stream_create(log).0);
        if sync.stream_adopt.is_some() {
            // No native stream the kit could make is valid-looking for
            // every device: NULL, which a lost mechanism never looks at.
            at("sync.stream_adopt", &|| {
                m.stream_adopt(log, core::ptr::null_mut()).map_or(MEMPLUG_STATUS_UNSUPPORTED, |r| r.0)
            });
        }
        at("sync.enqueue_host_fn", &|| m.enqueue(log, s, Some(host_fn), core::ptr::null_mut()));
        at("sync.fence_record", &|| m.fence_record(log, s).0);
        at("sync.fence_query", &|| m.fence_query(log, fence));
        at("sync.fence_wait", &|| m.fence_wait(log, fence, 0));
        if sync.stream_wait_fence.is_some() {
            at("sync.stream_wait_fence", &|| m.stream_wait_fence(log, s, fence));
        }
        if sync.stream_adopt_typed.is_some() {
            // The mechanism's own kind, with something readable to point
            // at (a lost mechanism answers before looking at it).
            let mut native = [0u64; 16];
            let p = native.as_mut_ptr().cast::<c_void>();
            at("sync.stream_adopt_typed", &|| {
                m.stream_adopt_typed(log, m.device.kind, p).map_or(MEMPLUG_STATUS_UNSUPPORTED, |r| r.0)
            });
        }
        if sync.copy.is_some() {
            // Between two buffers of the kit's (a lost mechanism answers
            // before it copies).
            let (dst, src) = ([0u8; 64], [0u8; 64]);
            let (d, sr) = (dst.as_ptr() as u64, src.as_ptr() as u64);
            at("sync.copy", &|| super::copy::raw_copy(log, m, s, d, sr, 64));
        }
        at("sync.fence_destroy", &|| m.fence_destroy(log, fence));
        at("sync.stream_destroy", &|| m.stream_destroy(log, s));
    }
    out
}

/// `loss.every_slot_device_lost`.
fn every_slot(ctx: &Ctx, m: &Mech) -> Checked {
    let f = fresh(ctx)?;
    f.require_1_2()?;
    let (t, trig) = f.trigger()?;
    let fm = f.mech(m.id, m.props)?;
    let gran = m.props.granularity.max(crate::os::page_size());
    let b = before(&fm, &f.log, gran)?;
    let st = pull(t, trig, m.id);
    if st != MEMPLUG_STATUS_OK {
        return Err(not_enabled(t, st, m.id, &m.name));
    }
    // Judged by loss.reported_through_services; waited for so a plugin
    // that latches when its report is through is judged after it.
    f.services.wait_for(ctx.opts.fence_timeout, |r| r.mechanism_id == m.id);
    let answers = sweep(&fm, &f.log, &b, gran);
    std::thread::sleep(GRACE);
    let ran = HOST_FN_RAN.load(Ordering::SeqCst);
    let wrote: Vec<&'static str> =
        f.log.written_on_failure.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(s, _)| *s).collect();
    judge_after_loss(&answers, ran, &wrote)
}

/// `loss.negotiation_reports`.
fn negotiation_reports(ctx: &Ctx) -> Checked {
    let f = fresh(ctx)?;
    let seen = f.services.seen();
    let published = f.published();
    let problems = judge_reports(&seen, &published, f.agreed);
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    let early: Vec<&Seen> = seen.iter().filter(|r| r.phase != Phase::Open).collect();
    if early.is_empty() {
        return Ok(format!(
            "agreed on 1.{} with the kit's 1.2 host; the entry called no service during negotiation",
            f.agreed
        ));
    }
    // Reported before any mechanism existed for the host: refused. Fine
    // if the plugin tells the host again once negotiation is over, or if
    // the mechanism goes on working; not if it answers DEVICE_LOST to a
    // host that was never told.
    let mut notes = Vec::new();
    for r in &early {
        let id = r.mechanism_id;
        let again = f
            .services
            .wait_for(Duration::from_millis(200), |x| x.mechanism_id == id && x.answer == MEMPLUG_STATUS_OK);
        let name = published.iter().find(|p| p.0 == id).map(|p| p.1.clone()).unwrap_or_default();
        if again {
            notes.push(format!("'{name}' (id {id}) reported again after negotiation"));
            continue;
        }
        let fm = f.mech(id, MemplugProperties::default())?;
        let (st, _) = fm.properties(&f.log, MEMPLUG_PROPERTIES_SIZE_1_0);
        ensure!(
            st != MEMPLUG_STATUS_DEVICE_LOST,
            "reported the loss of '{name}' (id {id}) during negotiation, when the kit's services answer \
             INVALID_STATE (no mechanism exists yet), and never again: its properties answer DEVICE_LOST, but a \
             host was never told the mechanism is lost (report again once the entry returned)"
        );
        notes.push(format!("'{name}' (id {id}) goes on working (properties answered {})", status_name(st)));
    }
    Ok(format!(
        "the entry reported {} loss(es) during negotiation and was answered INVALID_STATE; {}. Advice: report only \
         after the entry returned",
        early.len(),
        notes.join("; ")
    ))
}

/// `loss.unknown_mechanism`.
fn unknown_mechanism(ctx: &Ctx, mechs: &[Mech]) -> Checked {
    let Some(control) = mechs.first() else {
        skip!("no mechanism could be checked, so the trigger has nothing to be compared with");
    };
    let f = fresh(ctx)?;
    f.require_1_2()?;
    let (t, trig) = f.trigger()?;
    let ids: Vec<u64> = f.mechanisms.iter().map(|m| m.0).collect();
    let top = ids.iter().copied().max().unwrap_or(0);
    let bogus = (1..=ids.len() as u64 + 1)
        .map(|k| top.wrapping_add(k))
        .find(|c| *c != 0 && !ids.contains(c))
        .unwrap_or(u64::MAX);
    let st_bogus = pull(t, trig, bogus);
    std::thread::sleep(GRACE);
    let before_control = f.services.seen();
    // Nothing was lost: every mechanism still answers.
    let mut latched = Vec::new();
    for (id, name, _) in &f.mechanisms {
        let Ok(fm) = f.mech(*id, MemplugProperties::default()) else {
            continue;
        };
        if fm.properties(&f.log, MEMPLUG_PROPERTIES_SIZE_1_0).0 == MEMPLUG_STATUS_DEVICE_LOST {
            latched.push(format!("'{name}' (id {id})"));
        }
    }
    let st_ctl = pull(t, trig, control.id);
    if st_ctl == MEMPLUG_STATUS_OK {
        f.services.wait_for(ctx.opts.fence_timeout, |r| r.mechanism_id == control.id);
    }
    std::thread::sleep(GRACE);
    let problems = judge_reports(&f.services.seen(), &f.published(), f.agreed);
    ensure!(
        problems.is_empty(),
        "{}({bogus}), for an id it does not publish: {}",
        t.symbol,
        problems.join("; ")
    );
    let early: Vec<String> = before_control
        .iter()
        .filter(|r| r.phase == Phase::Open)
        .map(|r| format!("id {}", r.mechanism_id))
        .collect();
    ensure!(
        early.is_empty(),
        "{}({bogus}), for an id the plugin does not publish, reported the loss of {} through the kit's services",
        t.symbol,
        early.join(", ")
    );
    ensure!(
        latched.is_empty(),
        "after {}({bogus}), for an id the plugin does not publish, {} answer(s) DEVICE_LOST: the trigger latched a \
         mechanism it was not asked about",
        t.symbol,
        latched.join(", ")
    );
    if st_ctl != MEMPLUG_STATUS_OK {
        return Err(Verdict::Skip(format!(
            "{}({bogus}) answered {}, but so did {}({}) for published mechanism '{}' ({}): the trigger is not \
             enabled here, so its refusal proves nothing",
            t.symbol,
            status_name(st_bogus),
            t.symbol,
            control.id,
            control.name,
            status_name(st_ctl)
        )));
    }
    ensure!(
        st_bogus != MEMPLUG_STATUS_OK,
        "{}({bogus}) answered OK for an id the plugin does not publish (the kit's convention: another status, such \
         as WRONG_MECHANISM, and nothing reported)",
        t.symbol
    );
    Ok(format!(
        "{}({bogus}), an id it does not publish, answered {} and reported and latched nothing; {}({}) then \
         answered OK for '{}'",
        t.symbol,
        status_name(st_bogus),
        t.symbol,
        control.id,
        control.name
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(id: u64, reason: Reason, phase: Phase, answer: MemplugStatus) -> Seen {
        Seen { mechanism_id: id, reason, on_kit_thread: true, thread_name: None, phase, answer }
    }

    fn text(s: &str) -> Reason {
        Reason::Text { len: s.len(), bytes: s.as_bytes().to_vec() }
    }

    #[test]
    fn reports_are_judged() {
        let published = [(1, "vram".to_string()), (2, "host".to_string())];
        let good = [
            seen(1, text("ECC error"), Phase::Open, MEMPLUG_STATUS_OK),
            seen(2, Reason::Absent, Phase::Open, 0),
        ];
        assert!(judge_reports(&good, &published, 2).is_empty());

        let foreign = [seen(9, text("x"), Phase::Open, MEMPLUG_STATUS_WRONG_MECHANISM)];
        let p = judge_reports(&foreign, &published, 2);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("reports loss of a mechanism it does not own: mechanism id 9"), "{}", p[0]);
        assert!(
            p[0].contains("'vram' (id 1), 'host' (id 2)") && p[0].contains("WRONG_MECHANISM"),
            "{}",
            p[0]
        );

        let null = [seen(1, Reason::NullWithLength(12), Phase::Open, MEMPLUG_STATUS_INVALID_ARGUMENT)];
        let p = judge_reports(&null, &published, 2);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("reason NULL and reason_len 12"), "{}", p[0]);

        let bad_utf8 = [seen(1, Reason::Text { len: 2, bytes: vec![0xff, 0xfe] }, Phase::Open, 0)];
        assert!(judge_reports(&bad_utf8, &published, 2)[0].contains("not UTF-8"));

        let at_1_1 = [seen(1, text("gone"), Phase::Open, MEMPLUG_STATUS_INVALID_STATE)];
        let p = judge_reports(&at_1_1, &published, 1);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("agreed on ABI 1.1"), "{}", p[0]);
        // Several problems are all named.
        let both = [foreign[0].clone(), null[0].clone()];
        assert_eq!(judge_reports(&both, &published, 2).len(), 2);
    }

    #[test]
    fn answers_after_a_loss_are_judged() {
        let lost = MEMPLUG_STATUS_DEVICE_LOST;
        let good = [("allocator.allocate", lost), ("allocator.deallocate", lost)];
        let d = judge_after_loss(&good, false, &[]).unwrap();
        assert!(d.contains("all 2 slots") && d.contains("allocator.deallocate"), "{d}");

        let still = [("allocator.allocate", MEMPLUG_STATUS_OK), ("allocator.deallocate", lost)];
        let Err(Verdict::Fail(why)) = judge_after_loss(&still, false, &[]) else { panic!("passed") };
        assert!(
            why.starts_with("keeps succeeding after reporting loss: allocator.allocate answered OK"),
            "{why}"
        );
        assert!(!why.contains("deallocate"), "{why}");

        let other = [("sync.fence_query", MEMPLUG_STATUS_UNKNOWN_ALLOCATION)];
        let Err(Verdict::Fail(why)) = judge_after_loss(&other, false, &[]) else { panic!("passed") };
        assert!(
            why.contains("sync.fence_query (UNKNOWN_ALLOCATION) answered other than DEVICE_LOST"),
            "{why}"
        );

        let Err(Verdict::Fail(why)) = judge_after_loss(&good, true, &["allocator.allocate"]) else {
            panic!("passed")
        };
        assert!(why.contains("host function enqueued after the loss ran"), "{why}");
        assert!(why.contains("allocator.allocate changed its output although it failed"), "{why}");

        assert!(matches!(judge_after_loss(&[], false, &[]), Err(Verdict::Fail(_))));
    }
}

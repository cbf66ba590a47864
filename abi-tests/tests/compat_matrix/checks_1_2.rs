//! The matrix's look at ABI 1.2 in a Rust host cell: the memory
//! descriptor, identity and typed export of each mechanism (`abi_1_2_checks`)
//! and device ordering (`ordering_checks`), each against what the subject
//! publishes at the agreed minor.

use super::Subject;
use memplug_host::governor::AllocationClass;
use memplug_host::{Access, Descriptor, DeviceIdentity, Handle, HandleRef, Mechanism, Placement, Status};
use memplug_sdk::abi::*;
use std::os::fd::AsFd;

/// What the host sees of ABI 1.2's additions to a mechanism: its memory
/// descriptor and device identity exactly as the plugin publishes them when
/// 1.2 was agreed, none of them below (whatever the plugin put there), and
/// typed export: a round trip of memory through each descriptor kind the
/// mechanism offers, a kind it does not offer refused as `Unsupported`, and
/// below 1.2 every typed call answered `Unsupported` by the host itself.
pub(super) fn abi_1_2_checks(
    s: &Subject,
    m: &Mechanism,
    agreed: u32,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let mut notes = Vec::new();
    let mut fail = |what: String| problems.push(format!("mechanism '{}': {what}", m.name()));
    let d = m.properties().descriptor;
    let identity = m.identity().map(|i| DeviceIdentity { struct_size: 0, ..i });
    let caps = m.capabilities();
    let sm = unsafe { m.ungoverned() }.shared_mapping();
    if agreed < 2 {
        if d != Descriptor::default() || identity.is_some() || caps.typed_export() {
            fail(format!(
                "at 1.{agreed} the host read 1.2 fields: descriptor {d:?}, identity {identity:?}, typed export {}",
                caps.typed_export()
            ));
        }
        if let Some(sm) = &sm {
            match sm.create(m.properties().granularity) {
                Ok(o) => {
                    match sm.export_handle(&o, MEMPLUG_HANDLE_MEMFD) {
                        Err(e) if e.status == Status::Unsupported && e.message.contains("need 1.2") => {}
                        other => fail(format!("export_handle at 1.{agreed}: {other:?}")),
                    }
                    let _ = sm.release(o);
                }
                Err(e) => fail(format!("create: {e}")),
            }
        }
        notes.push(format!("descriptor, identity, typed export: none at 1.{agreed}"));
        return notes;
    }
    let Some(want) = &s.at_1_2 else {
        if d != Descriptor::default() || identity.is_some() {
            fail(format!(
                "publishes a descriptor {d:?} or an identity {identity:?} the matrix does not expect"
            ));
        }
        notes.push("descriptor, identity: not published".into());
        return notes;
    };
    let want_d = (want.descriptor)(m.name(), m.properties().granularity);
    if d != want_d {
        fail(format!("descriptor {d:?}, published {want_d:?}"));
    }
    let want_identity = (want.identity)(m.name());
    if identity != want_identity {
        fail(format!("identity {identity:?}, published {want_identity:?}"));
    }
    notes.push(format!(
        "descriptor: attributes {:#x}, page sizes {:#x}, location {}:{}{}",
        d.attributes,
        d.page_sizes,
        d.location.kind,
        d.location.id,
        if d.maps_at_offsets { ", maps at offsets" } else { "" }
    ));
    notes.push(match identity {
        Some(i) => format!("identity: valid {:#x}, numa node {}", i.valid, i.numa_node),
        None => "identity: none".into(),
    });
    use memplug_sdk::descriptor::FD_KINDS;
    if want_d.export_types == 0 {
        if caps.typed_export() {
            fail("claims typed export with no export kinds".into());
        }
        notes.push("typed export: none offered".into());
        return notes;
    }
    if !caps.typed_export() {
        fail(format!("offers export kinds {:#x} without MEMPLUG_CAP_TYPED_EXPORT", want_d.export_types));
        return notes;
    }
    for kind in (0..32).map(|b| 1u32 << b).filter(|k| want_d.export_types & k & FD_KINDS != 0) {
        match typed_round_trip(m, kind) {
            Ok(()) => notes.push(format!("typed export: kind {kind:#x} round trip")),
            Err(e) => fail(format!("typed export of kind {kind:#x}: {e}")),
        }
    }
    notes
}

/// Create (exportable as `kind`) → map → write → `export_handle` →
/// `import_handle` → map → read, through the host; and a kind the
/// mechanism does not offer, asked at create and at export, refused as
/// `Unsupported`.
fn typed_round_trip(m: &Mechanism, kind: u32) -> Result<(), String> {
    let sm = unsafe { m.ungoverned() }.shared_mapping().ok_or("no shared mapping")?;
    let vb = unsafe { m.ungoverned() }.virtual_backing().ok_or("no virtual backing to map into")?;
    let g = m.properties().granularity;
    let offered = m.properties().descriptor.export_types;
    let other = (0..5).map(|b| 1u32 << b).find(|k| offered & k == 0);
    if let Some(other) = other {
        let placed = Placement { export_types: other, ..Default::default() };
        match sm.create_placed(g, AllocationClass::Other, &placed) {
            Err(e) if e.status == Status::Unsupported => {}
            Err(e) => return Err(format!("create exportable as unoffered kind {other:#x}: {e}")),
            Ok(o) => {
                let _ = sm.release(o);
                return Err(format!(
                    "created an object exportable as kind {other:#x}, which it does not offer"
                ));
            }
        }
    }
    let placed = Placement { export_types: kind, ..Default::default() };
    let a = sm.create_placed(g, AllocationClass::Weights, &placed).map_err(|e| e.to_string())?;
    if let Some(other) = other {
        match sm.export_handle(&a, other) {
            Err(e) if e.status == Status::Unsupported => {}
            r => return Err(format!("export_handle as unoffered kind {other:#x}: {r:?}")),
        }
    }
    let ra = vb.reserve(g).map_err(|e| e.to_string())?;
    sm.map(&a, 0, &ra, 0, g, Access::ReadWrite).map_err(|e| e.to_string())?;
    // SAFETY: `ra` maps `a` read-write over `g` bytes.
    unsafe { std::ptr::copy_nonoverlapping(b"typed!".as_ptr(), ra.addr() as *mut u8, 6) };
    let h = sm.export_handle(&a, kind).map_err(|e| e.to_string())?;
    let Handle::Fd { kind: got, fd } = &h else {
        return Err(format!("a descriptor kind came back as {h:?}"));
    };
    if *got != kind {
        return Err(format!("asked for kind {kind:#x}, got {got:#x}"));
    }
    let b = sm.import_handle(HandleRef::Fd { kind, fd: fd.as_fd() }, g).map_err(|e| e.to_string())?;
    drop(h);
    let rb = vb.reserve(g).map_err(|e| e.to_string())?;
    sm.map(&b, 0, &rb, 0, g, Access::ReadOnly).map_err(|e| e.to_string())?;
    // SAFETY: `rb` maps `b` readable over `g` bytes.
    let seen = unsafe { std::slice::from_raw_parts(rb.addr() as *const u8, 6) }.to_vec();
    sm.unmap(&rb, 0, g).map_err(|e| e.to_string())?;
    sm.unmap(&ra, 0, g).map_err(|e| e.to_string())?;
    vb.release(rb).map_err(|e| e.error.to_string())?;
    vb.release(ra).map_err(|e| e.error.to_string())?;
    sm.release(a).map_err(|e| e.error.to_string())?;
    sm.release(b).map_err(|e| e.error.to_string())?;
    if seen != b"typed!" {
        return Err(format!("the imported object reads {seen:?}"));
    }
    Ok(())
}

/// What the host sees of ABI 1.2's device ordering: `stream_wait_fence` is
/// answered `Unsupported` by the host itself below 1.2 and, at 1.2, for a
/// plugin that does not publish it; no plugin of the matrix claims peer
/// access, and the host shows none; queued binding is shown exactly where
/// the plugin claims it at 1.2 (the CPU plugin), never below.
///
/// Where a plugin publishes it at 1.2 (the CPU plugin), the cross-stream
/// wait is run in process by
/// `stream_wait_fence_reaches_the_cpu_plugin_only_at_1_2`, not here: after
/// a `stream_wait_fence` the dlopen'd CPU library stays resident past
/// unload, and the host's `dlopen("/proc/self/fd/N")` then hands that
/// library back for every later load whose descriptor gets the same number
/// (the other cells would test the CPU plugin under other names).
pub(super) fn ordering_checks(
    s: &Subject,
    m: &Mechanism,
    agreed: u32,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let mut notes = Vec::new();
    let mut fail = |what: String| problems.push(format!("mechanism '{}': {what}", m.name()));
    let caps = m.capabilities();
    if caps.peer_access() || m.peer_access().is_some() {
        fail(format!("peer access the plugin does not claim: {caps:?}"));
    }
    let queues = agreed >= 2 && s.at_1_2.as_ref().is_some_and(|p| p.queued_binding);
    if caps.queued_binding() != queues {
        fail(format!("queued binding {} at 1.{agreed}, expected {queues}: {caps:?}", caps.queued_binding()));
    }
    if queues {
        notes.push("queued binding: claimed (checked by the kit's ordering.* checks)".into());
    }
    let Some(sync) = m.sync() else {
        notes.push("stream_wait_fence: no sync capability".into());
        return notes;
    };
    let publishes = agreed >= 2 && s.at_1_2.as_ref().is_some_and(|p| p.wait_fence);
    if publishes {
        notes.push("stream_wait_fence: published (the wait is checked in process)".into());
        return notes;
    }
    match refused_wait(&sync) {
        Ok(()) if agreed >= 2 => notes.push("stream_wait_fence: not published, Unsupported".into()),
        Ok(()) => notes.push(format!("stream_wait_fence: none at 1.{agreed}, Unsupported")),
        Err(e) => fail(format!("stream_wait_fence at 1.{agreed}: {e}")),
    }
    notes
}

/// Stream B waits for a fence of stream A, which is behind a gate: B's work
/// runs only once the gate opens.
pub(super) fn cross_stream_wait(sync: &memplug_host::SyncApi<'_>) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;
    let e = |e: memplug_host::CallError| e.to_string();
    let (a, b) = (sync.stream_create().map_err(e)?, sync.stream_create().map_err(e)?);
    let (open, gate) = mpsc::channel::<()>();
    sync.enqueue(&a, move || {
        let _ = gate.recv_timeout(Duration::from_secs(20));
    })
    .map_err(e)?;
    let fa = sync.fence_record(&a).map_err(e)?;
    sync.stream_wait_fence(&b, &fa).map_err(e)?;
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    sync.enqueue(&b, move || r.store(true, SeqCst)).map_err(e)?;
    let fb = sync.fence_record(&b).map_err(e)?;
    let early = sync.fence_wait(&fb, Duration::from_millis(50)).map_err(e)? || ran.load(SeqCst);
    open.send(()).map_err(|x| x.to_string())?;
    let done = sync.fence_wait(&fb, Duration::from_secs(20)).map_err(e)? && ran.load(SeqCst);
    for f in [fa, fb] {
        sync.fence_destroy(f).map_err(|x| x.error.to_string())?;
    }
    sync.stream_destroy(a).map_err(|x| x.error.to_string())?;
    sync.stream_destroy(b).map_err(|x| x.error.to_string())?;
    match (early, done) {
        (false, true) => Ok(()),
        (true, _) => Err("the waiting stream ran before the fence it waits for".into()),
        (false, false) => Err("the waiting stream never ran".into()),
    }
}

/// `stream_wait_fence` where the plugin does not publish it (or 1.2 was not
/// agreed): `Unsupported`, from the host.
pub(super) fn refused_wait(sync: &memplug_host::SyncApi<'_>) -> Result<(), String> {
    let e = |e: memplug_host::CallError| e.to_string();
    let a = sync.stream_create().map_err(e)?;
    let f = sync.fence_record(&a).map_err(e)?;
    let r = sync.stream_wait_fence(&a, &f);
    sync.fence_destroy(f).map_err(|x| x.error.to_string())?;
    sync.stream_destroy(a).map_err(|x| x.error.to_string())?;
    match r {
        Err(x) if x.status == Status::Unsupported && x.message.contains("stream_wait_fence") => Ok(()),
        other => Err(format!("expected Unsupported from the host, got {other:?}")),
    }
}

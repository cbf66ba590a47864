//! `shared_mapping.*`.

use super::allocator::touch;
use super::{ensure, expect, expect_live, fail, skip, CheckFn, Checked, Ctx, Results, Scope};
use crate::os::{in_child, protection, writable, ChildEnd};
use crate::raw::{fd_file_size, fd_identity, status_name, FdView, Mech, OwnedFds};
use memplug_sdk::abi::*;
use std::time::Duration;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
const RO: u32 = MEMPLUG_ACCESS_READ;

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let name = Some(m.name.as_str());
    let checks: [(&'static str, bool, bool, CheckFn); 11] = [
        ("shared_mapping.create", false, false, create),
        ("shared_mapping.coherence", true, true, coherence),
        ("shared_mapping.read_only", true, true, read_only),
        ("shared_mapping.invalid_state", true, false, invalid_state),
        ("shared_mapping.mapped_not_committed", true, false, mapped_not_committed),
        ("shared_mapping.out_of_range", true, false, out_of_range),
        ("shared_mapping.unknown_access", true, false, unknown_access),
        ("shared_mapping.references", true, false, references),
        ("shared_mapping.export_import", false, false, export_import),
        ("shared_mapping.export_is_fresh_fd", false, false, export_is_fresh_fd),
        ("shared_mapping.physical_identity", false, false, physical_identity),
    ];
    for (check, maps, cpu_only, f) in checks {
        res.run(check, name, || {
            if m.sm.is_none() {
                skip!("no shared_mapping capability (flag clear, pointer NULL)");
            }
            if maps && m.vb.is_none() {
                skip!("mapping needs reservations, and the mechanism has no virtual_backing capability");
            }
            if cpu_only && !m.is_cpu() {
                skip!(
                    "device {}: memory contents and protections are not visible to the host",
                    super::descriptor::device_string(m.device)
                );
            }
            f(ctx, m)
        });
    }
}

fn create(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let want = 4 * g + 1;
    let made = s.create(want);
    expect(made.status, &[MEMPLUG_STATUS_OK], &format!("create({want})"))?;
    let b = made.block;
    ensure!(b.addr == 0, "a physical object has address {:#x}, expected 0 until mapped", b.addr);
    ensure!(
        b.size >= want && b.size % g == 0,
        "size {} for {want} bytes is not rounded up to the granularity {g}",
        b.size
    );
    expect_live(m, live + 1, "with the object")?;
    expect(s.release_object(&made.obj), &[MEMPLUG_STATUS_OK], "release")?;
    expect_live(m, live, "after its release")?;
    expect(m.release_object(&ctx.log, &made.obj), &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION], "a second release")?;
    for size in [0, u64::MAX] {
        let made = s.create(size);
        let want: &[MemplugStatus] = if size == 0 {
            &[MEMPLUG_STATUS_INVALID_ARGUMENT]
        } else {
            &[MEMPLUG_STATUS_OUT_OF_MEMORY, MEMPLUG_STATUS_INVALID_ARGUMENT]
        };
        expect(made.status, want, &format!("create({size})"))?;
        expect_live(m, live, &format!("after the refused create({size})"))?;
    }
    Ok(format!("{want} bytes made as {}; sizes 0 and 2^64-1 refused; release frees", b.size))
}

fn byte(addr: u64) -> u8 {
    // SAFETY: callers check the range is mapped readable first.
    unsafe { (addr as *const u8).read_volatile() }
}

fn coherence(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(4 * g)?;
    let r1 = s.reserve_ok(4 * g)?;
    let r2 = s.reserve_ok(8 * g)?;
    expect(s.map(&o, 0, &r1, 0, 4 * g, RW), &[MEMPLUG_STATUS_OK], "map into view 1")?;
    expect(s.map(&o, 0, &r2, 4 * g, 4 * g, RW), &[MEMPLUG_STATUS_OK], "map into view 2 at +4g")?;
    let (v1, v2) = (r1.addr, r2.addr + 4 * g);
    ensure!(writable(v1, 4 * g) && writable(v2, 4 * g), "a read-write mapping is not mapped read-write");
    // At 1.2 a mechanism without MEMPLUG_PROP_MAPS_AT_OFFSETS maps objects
    // only whole: the view from an offset is not asked of it.
    let v3 = if m.maps_at_offsets() {
        let r3 = s.reserve_ok(2 * g)?;
        expect(s.map(&o, 2 * g, &r3, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map [2g, 4g) into view 3")?;
        ensure!(writable(r3.addr, 2 * g), "a read-write mapping is not mapped read-write");
        Some(r3.addr)
    } else {
        None
    };
    ensure!(byte(v1) == 0 && byte(v2 + 3 * g) == 0, "a new physical object does not read as zeros");
    touch(v1, 64, 0x21)?;
    for i in 0..64u64 {
        ensure!(
            byte(v2 + i) == 0x21u8.wrapping_add(i as u8),
            "byte {i} written through view 1 reads {:#x} through view 2",
            byte(v2 + i)
        );
    }
    touch(v2 + 2 * g, 64, 0x42)?;
    ensure!(
        byte(v1 + 2 * g) == 0x42,
        "a write through view 2 at +2g is not seen through view 1 ({:#x})",
        byte(v1 + 2 * g)
    );
    let Some(v3) = v3 else {
        return Ok(
            "writes through each view are read through the other (objects mapped whole: the mechanism does not \
             claim MEMPLUG_PROP_MAPS_AT_OFFSETS)"
                .into(),
        );
    };
    ensure!(
        byte(v3) == 0x42,
        "a write through view 2 at +2g is not seen through view 3 mapping the object from offset 2g ({:#x})",
        byte(v3)
    );
    Ok("writes through each view are read through the others, at object offsets 0 and 2g".into())
}

fn read_only(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(2 * g)?;
    let rw = s.reserve_ok(2 * g)?;
    let ro = s.reserve_ok(2 * g)?;
    expect(s.map(&o, 0, &rw, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map read-write")?;
    expect(s.map(&o, 0, &ro, 0, 2 * g, RO), &[MEMPLUG_STATUS_OK], "map read-only")?;
    touch(rw.addr + g, 16, 0x33)?;
    let p = protection(ro.addr, 2 * g);
    ensure!(p.is_some_and(|p| p.read), "the read-only view is not mapped readable ({p:?})");
    ensure!(byte(ro.addr + g) == 0x33, "the read-only view does not show the object's bytes");
    let target = ro.addr + g;
    let end = in_child(Duration::from_secs(5), move || {
        // SAFETY: deliberately a write to a read-only view, in a child that
        // is expected to die of it.
        unsafe { (target as *mut u8).write_volatile(0x77) };
        0
    });
    match end {
        ChildEnd::Signaled(sig) if sig == libc::SIGSEGV || sig == libc::SIGBUS => Ok(format!(
            "reads the object; a write through it killed the child with {}",
            crate::os::signal_name(sig)
        )),
        ChildEnd::Exited(0) => fail!("a write through the read-only view succeeded (the child lived on)"),
        other => fail!("the child writing through the read-only view {}", other.describe()),
    }
}

/// `committed_bytes` counts what `commit` committed, never what a mapping
/// brings: a mapped range is the physical object's memory.
fn mapped_not_committed(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(2 * g)?;
    let r = s.reserve_ok(8 * g)?;
    let committed = |what: &str, want: u64| -> Checked {
        let (st, n) = m.committed(&ctx.log, &r);
        expect(st, &[MEMPLUG_STATUS_OK], &format!("committed_bytes {what}"))?;
        ensure!(n == want, "committed_bytes {what} is {n}, expected {want}");
        Ok(String::new())
    };
    expect(s.map(&o, 0, &r, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map at [0, 2g)")?;
    committed("with [0, 2g) mapped and nothing committed", 0)?;
    expect(m.commit(&ctx.log, &r, 4 * g, g), &[MEMPLUG_STATUS_OK], "commit [4g, 5g)")?;
    committed("with [0, 2g) mapped and [4g, 5g) committed", g)?;
    expect(s.unmap(&r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "unmap [0, 2g)")?;
    committed("after the unmap", g)?;
    expect(m.decommit(&ctx.log, &r, 4 * g, g), &[MEMPLUG_STATUS_OK], "decommit [4g, 5g)")?;
    committed("after the decommit", 0)?;
    Ok("mapped ranges are never counted as committed bytes".into())
}

fn invalid_state(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(2 * g)?;
    let r = s.reserve_ok(8 * g)?;
    let state = [MEMPLUG_STATUS_INVALID_STATE];
    expect(m.commit(&ctx.log, &r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "commit [0, 2g)")?;
    expect(s.map(&o, 0, &r, 0, 2 * g, RW), &state, "map over committed [0, 2g)")?;
    expect(s.map(&o, 0, &r, 4 * g, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map at [4g, 6g)")?;
    expect(s.map(&o, 0, &r, 4 * g, 2 * g, RW), &state, "map over the mapping at [4g, 6g)")?;
    expect(s.map(&o, 0, &r, 5 * g, 2 * g, RW), &state, "map over half of the mapping, [5g, 7g)")?;
    for (what, off, len) in [("an unmapped range", 2 * g, g), ("part of a mapping", 4 * g, g)] {
        let st = m.unmap(&ctx.log, &r, off, len);
        ensure!(st != MEMPLUG_STATUS_OK, "unmap of {what} returned OK");
    }
    expect(s.unmap(&r, 4 * g, 2 * g), &[MEMPLUG_STATUS_OK], "unmap of the mapping")?;
    Ok("maps over committed or mapped pages and unmaps of non-mappings refused".into())
}

fn out_of_range(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(2 * g)?;
    let r = s.reserve_ok(4 * g)?;
    let osz = o.size;
    let rsz = r.size;
    let mut cases = vec![
        ("the object range past its end", osz - g, 0, 2 * g),
        ("the reservation range past its end", 0, rsz - g, 2 * g),
        ("an overflowing object offset", u64::MAX - g + 1, 0, 2 * g),
        ("an overflowing reservation offset", 0, u64::MAX - g + 1, 2 * g),
    ];
    if g >= 2 {
        cases.push(("an unaligned object offset", g / 2, 0, g));
    }
    for (what, obj_off, off, len) in &cases {
        let st = s.map(&o, *obj_off, &r, *off, *len, RW);
        expect(st, &[MEMPLUG_STATUS_OUT_OF_RANGE], &format!("map with {what}"))?;
    }
    Ok(format!("{} kinds of bad range refused", cases.len()))
}

fn unknown_access(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(g)?;
    let r = s.reserve_ok(g)?;
    for access in [0, MEMPLUG_ACCESS_WRITE, RO | 0x80, RW | 0x100] {
        let st = s.map(&o, 0, &r, 0, g, access);
        if st == MEMPLUG_STATUS_OK {
            s.unmap(&r, 0, g);
        }
        expect(st, &[MEMPLUG_STATUS_INVALID_ARGUMENT], &format!("map with access {access:#x}"))?;
    }
    Ok("access 0x0, 0x2 (write-only), 0x81 and 0x103 refused".into())
}

fn references(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let o = s.create_ok(2 * g)?;
    let r = s.reserve_ok(2 * g)?;
    expect(s.retain(&o), &[MEMPLUG_STATUS_OK], "retain")?;
    expect(s.map(&o, 0, &r, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map")?;
    expect(s.release_object(&o), &[MEMPLUG_STATUS_OK], "release of the create reference")?;
    expect(s.release_object(&o), &[MEMPLUG_STATUS_OK], "release of the retain reference")?;
    expect_live(m, live + 2, "with only the mapping holding the object (object + reservation)")?;
    if m.is_cpu() {
        touch(r.addr, 64, 0x44)?;
    }
    let st = m.release_object(&ctx.log, &o);
    expect(
        st,
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION, MEMPLUG_STATUS_INVALID_STATE],
        "a third release (no create or retain reference left)",
    )?;
    expect(s.unmap(&r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "unmap of the last view")?;
    expect_live(m, live + 1, "after the last view went (the object with it)")?;
    expect(
        m.release_object(&ctx.log, &o),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "release of the gone object",
    )?;
    Ok(format!(
        "the mapping kept the object usable after its references went; a release too many gave {}",
        status_name(st)
    ))
}

fn export_import(ctx: &Ctx, m: &Mech) -> Checked {
    needs_export(m)?;
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let o = s.create_ok(2 * g)?;
    let (st, raw) = m.export_fd(&ctx.log, &o);
    expect(st, &[MEMPLUG_STATUS_OK], "export_fd")?;
    ensure!(raw >= 0, "export_fd returned OK with the descriptor {raw}");
    // SAFETY: a new descriptor the caller owns (ABI 1.1): closed on drop.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let made = s.import(raw, 2 * g);
    expect(made.status, &[MEMPLUG_STATUS_OK], "import_fd of the exported descriptor")?;
    ensure!(
        made.block.addr == 0 && made.block.size >= 2 * g,
        "import_fd returned address {:#x}, size {}",
        made.block.addr,
        made.block.size
    );
    let imported = made.obj;
    expect_live(m, live + 2, "with the object and its import")?;
    let mut shown = "";
    if m.vb.is_some() && m.is_cpu() {
        let r1 = s.reserve_ok(2 * g)?;
        let r2 = s.reserve_ok(2 * g)?;
        expect(s.map(&o, 0, &r1, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map the object")?;
        expect(s.map(&imported, 0, &r2, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map the import")?;
        touch(r1.addr + g, 32, 0x55)?;
        ensure!(
            writable(r2.addr, 2 * g) && byte(r2.addr + g) == 0x55,
            "a write through the object is not read through its import"
        );
        touch(r2.addr, 32, 0x66)?;
        ensure!(byte(r1.addr) == 0x66, "a write through the import is not read through the object");
        shown = "; the same memory through both";
    }
    expect(s.import(-1, g).status, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "import_fd of descriptor -1")?;
    let st = s.import(raw, 64 * g).status;
    ensure!(st != MEMPLUG_STATUS_OK, "import_fd of more bytes than the descriptor holds returned OK");
    let mut forged = o;
    forged.handle ^= 0xffff_0000_0000_0000;
    let (st, _) = m.export_fd(&ctx.log, &forged);
    expect(st, &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION], "export_fd of a forged object")?;
    drop(fd);
    Ok(format!(
        "exported and imported{shown}; a bad descriptor, an oversized import and a forged export refused"
    ))
}

/// Skips unless the mechanism publishes `export_fd` and `import_fd`.
fn needs_export(m: &Mech) -> Result<(), super::Verdict> {
    if m.caps & MEMPLUG_CAP_SHARED_EXPORT == 0 {
        skip!(
            "no MEMPLUG_CAP_SHARED_EXPORT: the mechanism shares no physical object across processes (flag \
             clear, export_fd and import_fd NULL)"
        );
    }
    Ok(())
}

/// One `export_fd`: a descriptor that is open, above the standard streams,
/// with the identity of the file it names. Nothing here closes it: whose it
/// is has not been shown yet.
fn export_once(
    ctx: &Ctx,
    m: &Mech,
    o: &MemplugObjectRef,
    what: &str,
) -> Result<(i32, (u64, u64)), super::Verdict> {
    let (st, fd) = m.export_fd(&ctx.log, o);
    expect(st, &[MEMPLUG_STATUS_OK], &format!("export_fd ({what})"))?;
    ensure!(
        fd > 2,
        "export_fd ({what}) returned the descriptor {fd}: 0, 1 and 2 are the process's standard streams (and a \
         negative number is no descriptor)"
    );
    let Some(id) = fd_identity(fd) else {
        fail!("export_fd ({what}) returned the descriptor {fd}, which is not open");
    };
    Ok((fd, id))
}

/// The `2g` bytes of pattern `seed` the kit writes through an exported
/// descriptor and looks for later.
fn pattern(i: u64, seed: u8) -> u8 {
    seed.wrapping_add((i / 509) as u8)
}

/// `shared_mapping.export_is_fresh_fd`.
fn export_is_fresh_fd(ctx: &Ctx, m: &Mech) -> Checked {
    needs_export(m)?;
    let g = m.props.granularity;
    let len = 2 * g;
    let mut s = Scope::new(ctx, m);
    let mut owned = OwnedFds::default();
    let o = s.create_ok(len)?;
    let (e1, id1) = export_once(ctx, m, &o, "the first")?;
    let (e2, id2) = export_once(ctx, m, &o, "the second")?;
    // Until the two are shown to differ neither is closed: a plugin that
    // hands out its own descriptor keeps using it.
    ensure!(
        e1 != e2,
        "two export_fd calls returned the same descriptor {e1}: the plugin hands out a descriptor of its own \
         (one it keeps, and may close or share), not one made for the call"
    );
    owned.adopt(e1, id1);
    owned.adopt(e2, id2);
    owned.close(e1);
    ensure!(
        fd_identity(e2) == Some(id2),
        "closing the first exported descriptor {e1} closed or changed the second, {e2}"
    );
    // On a CPU device a memfd-like export is mapped here to recognise the
    // memory later; other descriptors are judged by being open and
    // importable.
    let mappable = m.is_cpu() && fd_file_size(e2).is_some_and(|n| n >= len);
    if mappable {
        let Some(v) = FdView::map(e2, len, true) else {
            fail!(
                "the exported descriptor {e2} is a file of at least {len} bytes but cannot be mapped shared"
            );
        };
        // SAFETY: a fresh shared mapping of `len` bytes of the kit's own
        // descriptor (shown above to be distinct and open).
        unsafe {
            for i in (0..len).step_by(509) {
                v.addr.add(i as usize).write_volatile(pattern(i, 0x5c));
            }
        }
    }
    expect(s.release_object(&o), &[MEMPLUG_STATUS_OK], "release of the exported object")?;
    // Further work, which a plugin that closes descriptors it handed out
    // (late, or when a slot is reused) would do now.
    let o2 = s.create_ok(len)?;
    let (e3, id3) = export_once(ctx, m, &o2, "an export of another object")?;
    ensure!(
        e3 != e2,
        "export_fd of another object returned {e3}, the descriptor already handed out for the first"
    );
    owned.adopt(e3, id3);
    expect(s.release_object(&o2), &[MEMPLUG_STATUS_OK], "release of the other object")?;
    owned.close(e3);
    let a = s.alloc_ok(64, m.props.min_alignment)?;
    expect(s.free(&a), &[MEMPLUG_STATUS_OK], "deallocate")?;
    let o3 = s.create_ok(g)?;
    expect(s.release_object(&o3), &[MEMPLUG_STATUS_OK], "release of a third object")?;
    match fd_identity(e2) {
        Some(id) if id == id2 => {}
        Some(_) => fail!(
            "after the object's release and further calls, the exported descriptor {e2} names another file: the \
             plugin closed it and the number was reused"
        ),
        None => fail!(
            "after the object's release and further calls, the exported descriptor {e2} is closed: the plugin \
             closed a descriptor it had handed out (the caller owns it)"
        ),
    }
    let mut shown = String::new();
    if mappable {
        let Some(v) = FdView::map(e2, len, false) else {
            fail!("after the object's release the exported descriptor {e2} can no longer be mapped");
        };
        for i in (0..len).step_by(509) {
            // SAFETY: a fresh read-only mapping of `len` bytes of a regular
            // file at least that long.
            let got = unsafe { v.addr.add(i as usize).read_volatile() };
            ensure!(
                got == pattern(i, 0x5c),
                "after the object's release, byte {i} of the exported memory reads {got:#x}: the descriptor no \
                 longer holds the object's memory"
            );
        }
        shown = ", still holding what was written through it".into();
    }
    let made = s.import(e2, len);
    expect(made.status, &[MEMPLUG_STATUS_OK], "import_fd of the export after the object's release")?;
    if mappable && m.vb.is_some() {
        let r = s.reserve_ok(len)?;
        expect(s.map(&made.obj, 0, &r, 0, len, RO), &[MEMPLUG_STATUS_OK], "map the import")?;
        ensure!(
            protection(r.addr, len).is_some_and(|p| p.read) && byte(r.addr + 509) == pattern(509, 0x5c),
            "the import of the exported descriptor does not show the memory written through it"
        );
        shown += "; imported, it shows that memory";
    }
    Ok(format!(
        "two exports gave descriptors {e1} and {e2}; closing one left the other; after the object's release and \
         further calls {e2} stayed open on the same file{shown}"
    ))
}

/// `shared_mapping.physical_identity`.
fn physical_identity(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let base = m.live();
    let o = s.create_ok(2 * g)?;
    let gone = s.create_ok(g)?;
    expect(s.release_object(&gone), &[MEMPLUG_STATUS_OK], "release")?;
    let r = if m.vb.is_some() { Some(s.reserve_ok(2 * g)?) } else { None };
    let export = m.caps & MEMPLUG_CAP_SHARED_EXPORT != 0;
    let live = m.live();
    let with = |f: &dyn Fn(&mut MemplugObjectRef)| {
        let mut x = o;
        f(&mut x);
        x
    };
    let (mech, unknown) = (MEMPLUG_STATUS_WRONG_MECHANISM, MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    let cases: [(&str, MemplugObjectRef, MemplugStatus); 8] = [
        ("naming another mechanism id", with(&|x| x.mechanism_id = m.id ^ (1 << 63)), mech),
        (
            "naming the device's ordinal + 1",
            with(&|x| x.device.ordinal = x.device.ordinal.wrapping_add(1)),
            MEMPLUG_STATUS_WRONG_DEVICE,
        ),
        (
            "naming another device kind",
            with(&|x| x.device.kind = other_kind(x.device.kind)),
            MEMPLUG_STATUS_WRONG_DEVICE,
        ),
        ("with a forged handle (high bits flipped)", with(&|x| x.handle ^= 0xffff_0000_0000_0000), unknown),
        (
            "with the right handle and another object id",
            with(&|x| x.object_id = x.object_id.wrapping_add(0x10_0000)),
            unknown,
        ),
        ("with the right handle and another size", with(&|x| x.size += g), unknown),
        ("with the right handle and a non-zero address", with(&|x| x.addr = 0x10_0000), unknown),
        ("that was released", gone, unknown),
    ];
    let mut calls = vec!["retain", "release"];
    if r.is_some() {
        calls.push("map");
    }
    if export {
        calls.push("export_fd");
    }
    for (what, bad, want) in &cases {
        let want = [*want];
        if let Some(r) = &r {
            expect(s.map(bad, 0, r, 0, g, RW), &want, &format!("map of a physical object {what}"))?;
        }
        expect(s.retain(bad), &want, &format!("retain of a physical object {what}"))?;
        expect(s.release_object(bad), &want, &format!("release of a physical object {what}"))?;
        if export {
            let (st, fd) = m.export_fd(&ctx.log, bad);
            if st == MEMPLUG_STATUS_OK {
                if let Some(id) = fd_identity(fd).filter(|_| fd > 2) {
                    OwnedFds::default().adopt(fd, id);
                }
            }
            expect(st, &want, &format!("export_fd of a physical object {what}"))?;
        }
        expect_live(m, live, &format!("after the refused calls on a physical object {what}"))?;
    }
    // Nothing changed: the reservation range is free, and the object has
    // exactly its create reference.
    if let Some(r) = &r {
        expect(s.map(&o, 0, r, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map of the real object afterwards")?;
        expect(s.unmap(r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "unmap")?;
    }
    expect(s.release_object(&o), &[MEMPLUG_STATUS_OK], "release of the real object's create reference")?;
    expect(
        m.release_object(&ctx.log, &o),
        &[unknown],
        "a second release of the real object (did a refused retain add a reference?)",
    )?;
    expect_live(m, base + u64::from(r.is_some()), "after the real object's release")?;
    Ok(format!(
        "{} refused for {} kinds of bad reference with their codes; live_objects and the object's references \
         unchanged",
        calls.join(", "),
        cases.len()
    ))
}

fn other_kind(k: MemplugDeviceKind) -> MemplugDeviceKind {
    if k == MEMPLUG_DEVICE_CPU {
        MEMPLUG_DEVICE_CUDA
    } else {
        MEMPLUG_DEVICE_CPU
    }
}

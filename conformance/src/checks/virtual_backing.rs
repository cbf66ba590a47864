//! `virtual_backing.*`.

use super::{ensure, expect, expect_live, skip, CheckFn, Checked, Ctx, Results, Scope, Verdict};
use crate::os::{protection, resident_pages, writable};
use crate::raw::Mech;
use memplug_sdk::abi::*;

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let name = Some(m.name.as_str());
    let checks: [(&'static str, CheckFn); 6] = [
        ("virtual_backing.reserve", reserve),
        ("virtual_backing.accounting", accounting),
        ("virtual_backing.residency", residency),
        ("virtual_backing.out_of_range", out_of_range),
        ("virtual_backing.invalid_state", invalid_state),
        ("virtual_backing.release_drops_mappings", release_drops_mappings),
    ];
    for (check, f) in checks {
        res.run(check, name, || {
            if m.vb.is_none() {
                skip!("no virtual_backing capability (flag clear, pointer NULL)");
            }
            f(ctx, m)
        });
    }
}

fn committed_is(ctx: &Ctx, m: &Mech, r: &MemplugObjectRef, want: u64, after: &str) -> Result<(), Verdict> {
    let (s, n) = m.committed(&ctx.log, r);
    expect(s, &[MEMPLUG_STATUS_OK], "committed_bytes")?;
    ensure!(n == want, "committed_bytes is {n} after {after}, expected {want}");
    Ok(())
}

fn reserve(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let want = 16 * g + 1;
    let made = s.reserve(want);
    expect(made.status, &[MEMPLUG_STATUS_OK], &format!("reserve({want})"))?;
    let b = made.block;
    ensure!(b.addr != 0, "reserve returned OK with address 0");
    ensure!(b.addr % g == 0, "address {:#x} is not aligned to the granularity {g}", b.addr);
    ensure!(
        b.size >= want && b.size % g == 0,
        "size {} for {want} bytes is not rounded up to the granularity {g}",
        b.size
    );
    committed_is(ctx, m, &made.obj, 0, "reserve")?;
    expect(s.release_reservation(&made.obj), &[MEMPLUG_STATUS_OK], "release")?;
    expect_live(m, live, "after release")?;
    for size in [0, 1 << 63, u64::MAX] {
        let made = s.reserve(size);
        let want: &[MemplugStatus] = if size == 0 {
            &[MEMPLUG_STATUS_INVALID_ARGUMENT]
        } else {
            &[MEMPLUG_STATUS_OUT_OF_MEMORY, MEMPLUG_STATUS_INVALID_ARGUMENT]
        };
        expect(made.status, want, &format!("reserve({size})"))?;
        expect_live(m, live, &format!("after the refused reserve({size})"))?;
    }
    Ok(format!("{want} bytes reserved as {} at {:#x}; sizes 0, 2^63, 2^64-1 refused", b.size, b.addr))
}

fn accounting(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let r = s.reserve_ok(16 * g)?;
    let steps: [(bool, u64, u64, u64); 5] =
        [(true, 0, 4, 4), (true, 8, 2, 6), (false, 0, 1, 5), (false, 1, 3, 2), (true, 10, 6, 8)];
    for (commit, off, len, total) in steps {
        let what = format!("{} [{off}g, +{len}g)", if commit { "commit" } else { "decommit" });
        let st = if commit {
            m.commit(&ctx.log, &r, off * g, len * g)
        } else {
            m.decommit(&ctx.log, &r, off * g, len * g)
        };
        expect(st, &[MEMPLUG_STATUS_OK], &what)?;
        committed_is(ctx, m, &r, total * g, &what)?;
    }
    expect(s.release_reservation(&r), &[MEMPLUG_STATUS_OK], "release with committed pages")?;
    expect_live(m, live, "after release")?;
    Ok("exact through 3 commits, 2 decommits and a release".into())
}

fn residency(ctx: &Ctx, m: &Mech) -> Checked {
    if !m.is_cpu() {
        skip!(
            "device {}: residency of device memory is not visible to the host",
            super::descriptor::device_string(m.device)
        );
    }
    let g = m.props.granularity;
    let page = crate::os::page_size();
    ensure!(g % page == 0, "granularity {g} is not a multiple of the page size {page}");
    let mut s = Scope::new(ctx, m);
    let r = s.reserve_ok(8 * g)?;
    let (addr, len) = (r.addr, 4 * g);
    ensure!(
        !protection(addr, 8 * g).is_some_and(|p| p.read || p.write),
        "a fresh reservation is accessible before any commit"
    );
    expect(m.commit(&ctx.log, &r, 0, len), &[MEMPLUG_STATUS_OK], "commit [0, 4g)")?;
    ensure!(writable(addr, len), "commit returned OK but [{addr:#x}, +{len}) is not mapped read-write");
    ensure!(
        !protection(addr + len, len).is_some_and(|p| p.read || p.write),
        "committing [0, 4g) also made [4g, 8g) accessible"
    );
    // SAFETY: mapped read-write (checked above) inside the kit's reservation.
    unsafe {
        for i in (0..len).step_by(page as usize) {
            ((addr + i) as *mut u8).write_volatile(0x5a);
        }
    }
    let pages = (len / page) as usize;
    let n = resident_pages(addr, len).map_err(Verdict::Fail)?;
    ensure!(n == pages, "{n} of {pages} committed and touched pages are resident");
    expect(m.decommit(&ctx.log, &r, 0, len), &[MEMPLUG_STATUS_OK], "decommit [0, 4g)")?;
    let n = resident_pages(addr, len).map_err(Verdict::Fail)?;
    ensure!(n == 0, "{n} of {pages} pages are still resident after decommit");
    ensure!(
        !protection(addr, len).is_some_and(|p| p.read || p.write),
        "decommitted pages are still accessible"
    );
    expect(m.commit(&ctx.log, &r, 0, len), &[MEMPLUG_STATUS_OK], "commit [0, 4g) again")?;
    ensure!(writable(addr, len), "the recommitted range is not mapped read-write");
    // SAFETY: mapped read-write (checked above).
    let nonzero =
        (0..len).step_by(page as usize).any(|i| unsafe { ((addr + i) as *const u8).read_volatile() } != 0);
    ensure!(!nonzero, "a recommitted page does not read as zeros");
    Ok(format!(
        "{pages} pages: read-write and resident after commit and touch, inaccessible and not resident \
         after decommit, zeros after recommit"
    ))
}

fn out_of_range(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let r = s.reserve_ok(8 * g)?;
    let size = r.size;
    expect(m.commit(&ctx.log, &r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "commit [0, 2g)")?;
    let range = [MEMPLUG_STATUS_OUT_OF_RANGE];
    let mut cases: Vec<(&str, u64, u64, &[MemplugStatus])> = vec![
        ("past the end", size, g, &range),
        ("straddling the end", size - g, 2 * g, &range),
        ("overflowing", u64::MAX - g + 1, 2 * g, &range),
        ("empty", g, 0, &range),
    ];
    if g >= 2 {
        cases.push(("with an unaligned offset", g / 2, g, &range));
        cases.push(("with an unaligned length", 2 * g, g / 2, &range));
    }
    for (what, off, len, want) in &cases {
        expect(
            m.commit(&ctx.log, &r, *off, *len),
            want,
            &format!("commit {what} (offset {off:#x}, len {len:#x})"),
        )?;
        committed_is(ctx, m, &r, 2 * g, &format!("the refused commit {what}"))?;
        expect(
            m.decommit(&ctx.log, &r, *off, *len),
            want,
            &format!("decommit {what} (offset {off:#x}, len {len:#x})"),
        )?;
        committed_is(ctx, m, &r, 2 * g, &format!("the refused decommit {what}"))?;
    }
    Ok(format!("{} kinds of bad range refused by commit and decommit", cases.len()))
}

fn invalid_state(ctx: &Ctx, m: &Mech) -> Checked {
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let r = s.reserve_ok(8 * g)?;
    let state = [MEMPLUG_STATUS_INVALID_STATE];
    expect(m.commit(&ctx.log, &r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "commit [0, 2g)")?;
    expect(m.commit(&ctx.log, &r, 0, 2 * g), &state, "commit [0, 2g) again")?;
    committed_is(ctx, m, &r, 2 * g, "the double commit")?;
    expect(m.commit(&ctx.log, &r, g, 2 * g), &state, "commit [g, 3g) over committed [g, 2g)")?;
    committed_is(ctx, m, &r, 2 * g, "the overlapping commit")?;
    expect(m.decommit(&ctx.log, &r, 4 * g, g), &state, "decommit of uncommitted [4g, 5g)")?;
    expect(m.decommit(&ctx.log, &r, g, 2 * g), &state, "decommit of half-committed [g, 3g)")?;
    committed_is(ctx, m, &r, 2 * g, "the refused decommits")?;
    expect(m.decommit(&ctx.log, &r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "decommit [0, 2g)")?;
    expect(m.decommit(&ctx.log, &r, 0, 2 * g), &state, "decommit [0, 2g) again")?;
    committed_is(ctx, m, &r, 0, "the double decommit")?;
    Ok("double and overlapping commits, decommits of uncommitted pages refused; nothing changed".into())
}

/// `virtual_backing.release_drops_mappings`: a reservation released with
/// shared mappings in it drops the references those mappings held, both
/// while the object still has its own reference and when the mappings are
/// all that keep it.
fn release_drops_mappings(ctx: &Ctx, m: &Mech) -> Checked {
    if m.sm.is_none() {
        skip!("no shared_mapping capability (flag clear, pointer NULL): no mapping can hold a reference");
    }
    let g = m.props.granularity;
    let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    // The object keeps its create reference through the release.
    let o = s.create_ok(2 * g)?;
    let r = s.reserve_ok(4 * g)?;
    expect(s.map(&o, 0, &r, 0, 2 * g, rw), &[MEMPLUG_STATUS_OK], "map the object at [0, 2g)")?;
    expect(
        s.map(&o, 0, &r, 2 * g, 2 * g, MEMPLUG_ACCESS_READ),
        &[MEMPLUG_STATUS_OK],
        "map it again at [2g, 4g)",
    )?;
    expect_live(m, live + 2, "with the object (mapped twice) and the reservation")?;
    expect(
        s.release_reservation(&r),
        &[MEMPLUG_STATUS_OK],
        "release of the reservation with both mappings in it",
    )?;
    expect_live(m, live + 1, "after the reservation's release (the object keeps its create reference)")?;
    expect(s.release_object(&o), &[MEMPLUG_STATUS_OK], "release of the object's own reference")?;
    expect_live(
        m,
        live,
        "after the object's own reference went (the released reservation's mappings still hold references: \
         the object leaks)",
    )?;
    // The mappings are all that keep the object.
    let o = s.create_ok(g)?;
    let r = s.reserve_ok(2 * g)?;
    expect(s.map(&o, 0, &r, g, g, rw), &[MEMPLUG_STATUS_OK], "map a second object at [g, 2g)")?;
    expect(s.release_object(&o), &[MEMPLUG_STATUS_OK], "release of its only host reference")?;
    expect_live(m, live + 2, "with the second object held by its mapping alone")?;
    expect(s.release_reservation(&r), &[MEMPLUG_STATUS_OK], "release of the reservation holding it")?;
    expect_live(m, live, "after releasing the reservation whose mapping was the object's last reference")?;
    Ok("a released reservation's mappings let go of their objects: with and without a host reference left, \
        live_objects came back"
        .into())
}

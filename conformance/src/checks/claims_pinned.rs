//! `claims.pinned_locked`: `MEMPLUG_ATTR_PINNED` claimed is memory the
//! kernel will not page out or migrate.
//!
//! Pinned memory is what DMA and RDMA engines are pointed at: a page the
//! kernel moves under them is silent corruption. On a CPU (host-visible)
//! mechanism the host can see it: the mapping is `mlock`ed (`/proc/self/
//! smaps` lists `lo` among a locked area's `VmFlags`, and its `Locked:`
//! size covers it), or is a driver's mapping of pages it pinned itself
//! (`io` or `pf`: VM_IO, VM_PFNMAP), and every page is resident before
//! anything touched it.

use super::descriptor_claims::{claimed, host_visible};
use super::{ensure, expect, skip, Checked, Ctx, Scope, Verdict};
use crate::os;
use crate::raw::request_1_2;
use crate::raw::Mech;
use memplug_sdk::abi::*;

/// One area of `/proc/self/smaps`.
#[derive(Debug, PartialEq)]
pub(crate) struct Area {
    pub start: u64,
    pub end: u64,
    pub locked_kb: u64,
    pub vm_locked: bool,
}

/// The areas of an smaps text.
pub(crate) fn areas(smaps: &str) -> Vec<Area> {
    let mut out: Vec<Area> = Vec::new();
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                out.push(Area { start, end, locked_kb: 0, vm_locked: false });
                continue;
            }
        }
        let Some(cur) = out.last_mut() else { continue };
        if let Some(v) = line.strip_prefix("Locked:") {
            cur.locked_kb = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("VmFlags:") {
            // `lo`: mlocked. `io` / `pf`: a driver's mapping of pages it
            // pinned itself (VM_IO, VM_PFNMAP), which the kernel never pages
            // out either: how a GPU driver maps its page-locked host memory.
            cur.vm_locked = v.split_whitespace().any(|f| matches!(f, "lo" | "io" | "pf"));
        }
    }
    out
}

/// Why `[addr, addr + len)` is not locked in `areas`, if it is not.
pub(crate) fn unlocked(areas: &[Area], addr: u64, len: u64) -> Option<String> {
    let end = addr + len;
    let mut covered = addr;
    for a in areas.iter().filter(|a| a.end > addr && a.start < end) {
        if !a.vm_locked {
            return Some(format!(
                "the mapping [{:#x}, {:#x}) holding it is not mlocked (no `lo` in its VmFlags; Locked: {} kB)",
                a.start, a.end, a.locked_kb
            ));
        }
        covered = covered.max(a.end.min(end));
    }
    (covered < end).then(|| format!("[{covered:#x}, {end:#x}) is not mapped"))
}

pub(super) fn pinned_locked(ctx: &Ctx, m: &Mech) -> Checked {
    let p = claimed(m)?;
    if p.attributes & MEMPLUG_ATTR_PINNED == 0 {
        skip!("the mechanism does not claim MEMPLUG_ATTR_PINNED");
    }
    host_visible(m, "MEMPLUG_ATTR_PINNED")?;
    let base = os::page_size();
    let g = p.granularity.max(base);
    let mut s = Scope::new(ctx, m);
    let mut ranges = Vec::new();
    let made = s.allocate(&request_1_2(m, 2 * g, base.max(p.min_alignment)));
    expect(made.status, &[MEMPLUG_STATUS_OK], "allocate(2 granules)")?;
    ranges.push(("an allocation", made.obj.addr, made.obj.size));
    if m.vb.is_some() {
        let r = s.reserve_ok(2 * g)?;
        expect(m.commit(&ctx.log, &r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "commit of the whole reservation")?;
        ranges.push(("a commit", r.addr, 2 * g));
    }
    let text = std::fs::read_to_string("/proc/self/smaps").map_err(|e| {
        Verdict::Skip(format!("/proc/self/smaps cannot be read ({e}): locking cannot be seen"))
    })?;
    let all = areas(&text);
    for (what, addr, len) in &ranges {
        if let Some(why) = unlocked(&all, *addr, *len) {
            return Err(Verdict::Fail(format!(
                "MEMPLUG_ATTR_PINNED is claimed, but {what} [{addr:#x}, +{len}) is not locked: {why}. Pinned memory \
                 must not be paged out or moved (mlock it, or register it with the driver that pins it), or do not \
                 claim PINNED"
            )));
        }
        let resident = os::resident_pages(*addr, *len).map_err(Verdict::Skip)?;
        let pages = len.div_ceil(base) as usize;
        ensure!(
            resident == pages,
            "MEMPLUG_ATTR_PINNED is claimed, but only {resident} of the {pages} pages of {what} [{addr:#x}, +{len}) \
             are resident before they were touched (locked on fault is not pinned)"
        );
    }
    Ok(format!(
        "{} locked (mlocked areas in /proc/self/smaps) and resident before any touch",
        ranges.iter().map(|r| r.0).collect::<Vec<_>>().join(" and ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "7f0000000000-7f0000002000 rw-p 00000000 00:00 0\nSize: 8 kB\nLocked: 8 kB\nVmFlags: rd wr \
                         mr mw me lo ac\n7f0000002000-7f0000004000 rw-p 00000000 00:00 0\nLocked: 0 kB\nVmFlags: rd \
                         wr mr mw me ac\n";

    #[test]
    fn locked_areas_are_read_from_smaps() {
        let a = areas(SMAPS);
        assert_eq!(a.len(), 2);
        assert!(a[0].vm_locked && a[0].locked_kb == 8 && !a[1].vm_locked);
        assert_eq!(unlocked(&a, 0x7f0000000000, 0x2000), None);
        assert!(unlocked(&a, 0x7f0000001000, 0x2000).unwrap().contains("not mlocked"));
        assert!(unlocked(&a, 0x7f0000010000, 0x1000).unwrap().contains("not mapped"));
    }

    #[test]
    fn a_drivers_pinned_mapping_counts_as_locked() {
        let driver = "7f1000000000-7f1000200000 rw-s 00000000 00:05 7 /dev/nvidiactl
Locked: 0 kB
VmFlags: rd \
                      wr sh mr mw me ms io pf dc de dd\n";
        let a = areas(driver);
        assert!(a[0].vm_locked, "VM_IO|VM_PFNMAP pages are never paged out");
        assert_eq!(unlocked(&a, 0x7f1000000000, 0x200000), None);
    }
}

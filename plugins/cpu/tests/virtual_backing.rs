//! The virtual backing capability: reservations cost no memory, commits
//! make pages usable, decommits really give them back, and the committed
//! count is exact; bad ranges and wrong states are refused whole.

mod common;
use common::*;

fn fill(addr: u64, len: u64, byte: u8) {
    unsafe { std::ptr::write_bytes(addr as *mut u8, byte, len as usize) }
}

fn all_bytes_are(addr: u64, len: u64, byte: u8) -> bool {
    unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.iter().all(|&b| b == byte)
}

#[test]
fn reserve_rounds_to_pages_and_costs_no_memory() {
    let h = harness();
    let page = h.page();
    for (asked, expect) in [(1, page), (page, page), (3 * page + 1, 4 * page), (64 << 30, 64 << 30)] {
        let r = h.reserve(asked).unwrap();
        assert_eq!(r.size, expect, "asked {asked}");
        assert_eq!(r.addr % page, 0);
        assert_eq!(mapping_at(r.addr).unwrap().0, "---p", "reserved, not accessible");
        assert_eq!(smaps_rss(r.addr, r.size), 0);
        assert_eq!(h.committed(&r).unwrap(), 0);
        h.release_reservation(&r).unwrap();
    }
    h.assert_balanced();
}

/// Each reservation is a kernel mapping of its own, committed or not: the
/// kernel merges adjacent anonymous mappings with the same protection, and
/// a reservation merged with its neighbour made every whole-range commit
/// and decommit split and merge mappings (about twice the time).
#[test]
fn neighbouring_reservations_keep_their_own_kernel_mappings() {
    let h = harness();
    let page = h.page();
    for size in [page, 2 << 20] {
        let rs: Vec<_> = (0..3).map(|_| h.reserve(size).unwrap()).collect();
        // A read-write anonymous neighbour too, as an allocator would map.
        let rw = h.reserve(size).unwrap();
        h.commit(&rw, 0, size).unwrap();
        for r in &rs {
            assert_eq!(mapping_bounds(r.addr), Some((r.addr, r.addr + size)), "reserved, size {size}");
            h.commit(r, 0, size).unwrap();
            assert_eq!(mapping_bounds(r.addr), Some((r.addr, r.addr + size)), "committed, size {size}");
        }
        for r in &rs {
            h.decommit(r, 0, size).unwrap();
            assert_eq!(mapping_bounds(r.addr), Some((r.addr, r.addr + size)), "decommitted, size {size}");
        }
        for r in rs.iter().chain([&rw]) {
            h.release_reservation(r).unwrap();
        }
    }
    h.assert_balanced();
}

#[test]
fn malformed_reserve_requests_are_refused() {
    let h = harness();
    refused(h.reserve(0), Status::InvalidArgument);
    let flagged = MemplugRequest { flags: 1, ..h.request(4096, 1) };
    refused(h.reserve_raw(&flagged), Status::InvalidArgument);
    let cuda = MemplugRequest {
        device: MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 },
        ..h.request(4096, 1)
    };
    refused(h.reserve_raw(&cuda), Status::WrongDevice);
    refused(h.reserve(1 << 62), Status::OutOfMemory);
    refused(h.reserve(u64::MAX), Status::OutOfMemory);
    h.assert_balanced();
}

#[test]
fn touched_pages_are_resident_until_decommit_and_read_zero_after() {
    let h = harness();
    let page = h.page();
    let res = h.reserve(64 * page).unwrap();
    let (off, len) = (8 * page, 16 * page);
    let addr = res.addr + off;

    h.commit(&res, off, len).unwrap();
    assert_eq!(mapping_at(addr).unwrap().0, "rw-p");
    assert_eq!(resident_bytes(addr, len), 0, "commit alone makes nothing resident");

    fill(addr, len, 0x5a);
    assert_eq!(resident_bytes(addr, len), len, "touching makes every page resident");
    assert!(smaps_rss(res.addr, res.size) >= len, "smaps agrees");

    h.decommit(&res, off, len).unwrap();
    assert_eq!(resident_bytes(addr, len), 0, "decommit gives the pages back");
    assert_eq!(smaps_rss(res.addr, res.size), 0);
    assert_eq!(mapping_at(addr).unwrap().0, "---p", "decommitted pages are inaccessible");

    h.commit(&res, off, len).unwrap();
    assert!(all_bytes_are(addr, len, 0), "re-committed pages read as zeros");
    h.release_reservation(&res).unwrap();
    h.assert_balanced();
}

#[test]
fn committed_bytes_follow_a_random_sequence_exactly() {
    let h = harness();
    let page = h.page();
    const PAGES: u64 = 32;
    let res = h.reserve(PAGES * page).unwrap();
    let mut model = [false; PAGES as usize];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for step in 0..600 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let first = x % PAGES;
        let count = 1 + (x >> 8) % (PAGES - first).min(6);
        let span = &mut model[first as usize..(first + count) as usize];
        let (off, len) = (first * page, count * page);
        if x & (1 << 40) == 0 {
            let r = h.commit(&res, off, len);
            if span.iter().any(|&c| c) {
                refused(r, Status::InvalidState);
            } else {
                r.unwrap();
                span.fill(true);
                // Committed pages are usable at once.
                fill(res.addr + off, len, step as u8);
            }
        } else {
            let r = h.decommit(&res, off, len);
            if span.iter().all(|&c| c) {
                r.unwrap();
                span.fill(false);
            } else {
                refused(r, Status::InvalidState);
            }
        }
        let expect = model.iter().filter(|&&c| c).count() as u64 * page;
        assert_eq!(h.committed(&res).unwrap(), expect, "after step {step}");
        for (i, &c) in model.iter().enumerate() {
            let perms = mapping_at(res.addr + i as u64 * page).unwrap().0;
            assert_eq!(perms, if c { "rw-p" } else { "---p" }, "page {i} after step {step}");
        }
    }
    h.release_reservation(&res).unwrap();
    h.assert_balanced();
}

#[test]
fn bad_ranges_are_out_of_range_and_change_nothing() {
    let h = harness();
    let page = h.page();
    let size = 8 * page;
    let res = h.reserve(size).unwrap();
    h.commit(&res, 0, page).unwrap();
    let bad = [
        ("empty", 0, 0),
        ("empty at a page", page, 0),
        ("unaligned offset", 1, page),
        ("unaligned len", page, page + 1),
        ("starts at the end", size, page),
        ("ends past the end", size - page, 2 * page),
        ("longer than the reservation", 0, size + page),
        ("far out", 1 << 40, page),
        ("offset + len overflows", u64::MAX - page + 1, 2 * page),
        ("len overflows alone", page, u64::MAX - page + 1),
    ];
    for (what, off, len) in bad {
        let m = refused(h.commit(&res, off, len), Status::OutOfRange);
        assert!(!m.is_empty(), "commit {what}");
        refused(h.decommit(&res, off, len), Status::OutOfRange);
        assert_eq!(h.committed(&res).unwrap(), page, "{what}");
    }
    h.release_reservation(&res).unwrap();
    h.assert_balanced();
}

#[test]
fn wrong_states_are_refused_whole() {
    let h = harness();
    let page = h.page();
    let res = h.reserve(8 * page).unwrap();
    h.commit(&res, 2 * page, 2 * page).unwrap();
    fill(res.addr + 2 * page, 2 * page, 0x77);

    // Committing over a committed page, even partly, commits nothing.
    refused(h.commit(&res, 2 * page, page), Status::InvalidState);
    let msg = refused(h.commit(&res, 0, 3 * page), Status::InvalidState);
    assert!(msg.contains("committed"), "{msg}");
    refused(h.commit(&res, 3 * page, 3 * page), Status::InvalidState);
    assert_eq!(mapping_at(res.addr).unwrap().0, "---p");
    assert_eq!(mapping_at(res.addr + 5 * page).unwrap().0, "---p");
    assert_eq!(h.committed(&res).unwrap(), 2 * page);

    // Decommitting a page that is not committed, even partly, decommits
    // nothing: the data of the committed part survives.
    refused(h.decommit(&res, 0, page), Status::InvalidState);
    refused(h.decommit(&res, page, 2 * page), Status::InvalidState);
    refused(h.decommit(&res, 3 * page, 2 * page), Status::InvalidState);
    assert!(all_bytes_are(res.addr + 2 * page, 2 * page, 0x77));
    assert_eq!(h.committed(&res).unwrap(), 2 * page);

    // A double decommit.
    h.decommit(&res, 2 * page, 2 * page).unwrap();
    refused(h.decommit(&res, 2 * page, 2 * page), Status::InvalidState);
    assert_eq!(h.committed(&res).unwrap(), 0);

    h.release_reservation(&res).unwrap();
    h.assert_balanced();
}

#[test]
fn release_gives_back_the_whole_range_with_committed_pages() {
    let h = harness();
    let page = h.page();
    let res = h.reserve(16 * page).unwrap();
    h.commit(&res, 0, 16 * page).unwrap();
    fill(res.addr, 16 * page, 1);
    h.release_reservation(&res).unwrap();
    assert_eq!(mapping_at(res.addr), None);
    assert_eq!(mapping_at(res.addr + 15 * page), None);
    h.assert_balanced();
}

/// A released reservation nobody else holds is kept and put to use again
/// by the next reserve (`reservations.rs`): the new one starts with nothing
/// committed, and every reference to the old one is still refused, even
/// where the new one has the same handle.
#[test]
fn a_reservation_reused_after_release_starts_empty_and_the_old_one_stays_unknown() {
    let h = harness();
    let page = h.page();
    for _ in 0..3 {
        let old = h.reserve(4 * page).unwrap();
        h.commit(&old, 0, 2 * page).unwrap();
        fill(old.addr, 2 * page, 0x5a);
        h.release_reservation(&old).unwrap();

        let new = h.reserve(4 * page).unwrap();
        assert_eq!(h.committed(&new).unwrap(), 0);
        assert_eq!(mapping_at(new.addr).unwrap().0, "---p", "reserved, not accessible");
        h.commit(&new, 0, 4 * page).unwrap();
        assert!(all_bytes_are(new.addr, 4 * page, 0));
        assert_eq!(h.committed(&new).unwrap(), 4 * page);

        refused(h.committed(&old), Status::UnknownAllocation);
        refused(h.commit(&old, 2 * page, page), Status::UnknownAllocation);
        refused(h.release_reservation(&old), Status::UnknownAllocation);
        assert_eq!(h.committed(&new).unwrap(), 4 * page);
        h.release_reservation(&new).unwrap();
    }
    h.assert_balanced();
}

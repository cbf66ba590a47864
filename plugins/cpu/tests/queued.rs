//! ABI 1.2 queue-ordered binding on the CPU, through the raw ABI: a queued
//! decommit or unmap waits for the work queued before it (the pages stay
//! readable until the stream gets there), the range cannot be reused
//! before, and refusals change nothing.

mod common;
use common::*;
use std::ffi::c_void;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
const FOREVER: u64 = u64::MAX;

fn perms(addr: u64) -> String {
    mapping_at(addr).expect("mapped").0
}

#[test]
fn the_cpu_mechanism_publishes_queued_binding() {
    let h = harness();
    assert!(h.vb.commit_on.is_some() && h.vb.decommit_on.is_some());
    assert!(h.sm.map_on.is_some() && h.sm.unmap_on.is_some());
}

#[test]
fn a_queued_decommit_waits_for_the_work_before_it() {
    let h = harness();
    let g = h.page();
    let s = h.stream_create().unwrap();
    let r = h.reserve(4 * g).unwrap();
    let f = h.commit_on(&r, 0, 2 * g, s).unwrap();
    h.fence_wait(f, FOREVER).unwrap();
    h.fence_destroy(f).unwrap();
    unsafe { (r.addr as *mut u8).write_volatile(42) };

    let gate = Gate::default();
    h.enqueue(s, wait_at_gate, &gate as *const Gate as *const c_void).unwrap();
    let f = h.decommit_on(&r, 0, 2 * g, s).unwrap();
    // Work before it still runs against the range: it stays readable.
    pending(h.fence_query(f), Status::NotReady);
    assert_eq!(perms(r.addr), "rw-p");
    assert_eq!(unsafe { (r.addr as *const u8).read_volatile() }, 42);
    // The host gave it up: not counted, not decommitted twice, not reused.
    assert_eq!(h.committed(&r).unwrap(), 0);
    refused(h.decommit(&r, 0, g), Status::InvalidState);
    let msg = refused(h.commit(&r, 0, g), Status::InvalidState);
    assert!(msg.contains("queued decommit"), "{msg}");
    let o = h.create(g).unwrap();
    refused(h.map(&o, 0, &r, g, g, RW), Status::InvalidState);
    // The rest of the reservation is free to use meanwhile.
    h.commit(&r, 2 * g, g).unwrap();

    gate.open();
    h.fence_wait(f, FOREVER).unwrap();
    assert_eq!(perms(r.addr), "---p", "decommitted once the stream got there");
    assert_eq!(resident_bytes(r.addr, 2 * g), 0);
    h.commit(&r, 0, g).unwrap();
    assert_eq!(unsafe { (r.addr as *const u8).read_volatile() }, 0, "a new commit reads zeros");
    h.fence_destroy(f).unwrap();
    h.release_object(&o).unwrap();
    h.release_reservation(&r).unwrap();
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

#[test]
fn a_queued_unmap_keeps_the_object_until_the_stream_gets_there() {
    let h = harness();
    let g = h.page();
    let s = h.stream_create().unwrap();
    let r = h.reserve(2 * g).unwrap();
    let o = h.create(g).unwrap();
    let f = h.map_on(&o, 0, &r, 0, g, RW, s).unwrap();
    h.fence_wait(f, FOREVER).unwrap();
    h.fence_destroy(f).unwrap();
    unsafe { (r.addr as *mut u8).write_volatile(7) };
    let live_mapped = h.live();

    let gate = Gate::default();
    h.enqueue(s, wait_at_gate, &gate as *const Gate as *const c_void).unwrap();
    let f = h.unmap_on(&r, 0, g, s).unwrap();
    // The host lets go of the object too: its memory stays, still mapped,
    // until the queued unmap has run.
    h.release_object(&o).unwrap();
    assert_eq!(h.live(), live_mapped + 1, "the object and the new fence are alive");
    assert_eq!(unsafe { (r.addr as *const u8).read_volatile() }, 7);
    refused(h.unmap(&r, 0, g), Status::InvalidState);
    refused(h.commit(&r, 0, g), Status::InvalidState);

    gate.open();
    h.fence_wait(f, FOREVER).unwrap();
    assert_eq!(perms(r.addr), "---p");
    h.fence_destroy(f).unwrap();
    h.release_reservation(&r).unwrap();
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

#[test]
fn a_release_before_the_stream_gets_there_leaves_nothing_behind() {
    let h = harness();
    let g = h.page();
    let s = h.stream_create().unwrap();
    let r = h.reserve(2 * g).unwrap();
    h.commit(&r, 0, g).unwrap();
    let o = h.create(g).unwrap();
    h.map(&o, 0, &r, g, g, RW).unwrap();
    h.release_object(&o).unwrap();
    let gate = Gate::default();
    h.enqueue(s, wait_at_gate, &gate as *const Gate as *const c_void).unwrap();
    let f1 = h.decommit_on(&r, 0, g, s).unwrap();
    let f2 = h.unmap_on(&r, g, g, s).unwrap();
    // Released while both are queued: the jobs must not touch the range
    // (it may be someone else's by then), and the object's last reference
    // still goes.
    h.release_reservation(&r).unwrap();
    let other = h.reserve(2 * g).unwrap();
    h.commit(&other, 0, 2 * g).unwrap();
    gate.open();
    h.fence_wait(f2, FOREVER).unwrap();
    h.fence_wait(f1, FOREVER).unwrap();
    if other.addr == r.addr {
        assert_eq!(perms(other.addr), "rw-p", "a stale job decommitted another reservation's pages");
    }
    h.fence_destroy(f1).unwrap();
    h.fence_destroy(f2).unwrap();
    h.release_reservation(&other).unwrap();
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

#[test]
fn queued_calls_refuse_with_nothing_changed() {
    let h = harness();
    let g = h.page();
    let s = h.stream_create().unwrap();
    let r = h.reserve(2 * g).unwrap();
    let live = h.live();
    // An unknown stream: nothing committed, nothing queued.
    refused(h.commit_on(&r, 0, g, s ^ 0x55), Status::UnknownAllocation);
    assert_eq!(h.committed(&r).unwrap(), 0);
    assert_eq!(perms(r.addr), "---p");
    h.commit(&r, 0, g).unwrap();
    refused(h.decommit_on(&r, 0, g, s ^ 0x55), Status::UnknownAllocation);
    assert_eq!(h.committed(&r).unwrap(), g, "still committed");
    // A range not committed / no mapping there.
    refused(h.decommit_on(&r, g, g, s), Status::InvalidState);
    refused(h.unmap_on(&r, g, g, s), Status::InvalidState);
    refused(h.commit_on(&r, 0, g, s), Status::InvalidState);
    assert_eq!(h.live(), live, "no fence was made for a refused call");
    h.release_reservation(&r).unwrap();
    h.stream_destroy(s).unwrap();
    h.assert_balanced();
}

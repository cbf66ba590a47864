//! `live_objects` counts every kind of object exactly: what the host's
//! unload gate relies on.

mod common;
use common::*;

#[test]
fn live_objects_counts_each_kind_and_returns_to_zero() {
    let h = harness();
    assert_eq!(h.live(), 0, "a fresh plugin holds nothing");
    let page = h.page();

    let alloc = h.allocate(100, 64).unwrap();
    assert_eq!(h.live(), 1);
    let res = h.reserve(4 * page).unwrap();
    assert_eq!(h.live(), 2);
    let phys = h.create(page).unwrap();
    assert_eq!(h.live(), 3);
    let stream = h.stream_create().unwrap();
    assert_eq!(h.live(), 4);
    let fence = h.fence_record(stream).unwrap();
    assert_eq!(h.live(), 5);

    // Commits, mappings and retains are states of objects, not objects.
    h.commit(&res, 0, page).unwrap();
    h.map(&phys, 0, &res, 2 * page, page, MEMPLUG_ACCESS_READ).unwrap();
    h.retain(&phys).unwrap();
    assert_eq!(h.live(), 5);

    // A refused call makes nothing and frees nothing.
    refused(h.allocate(0, 16), Status::InvalidArgument);
    refused(h.reserve(1 << 62), Status::OutOfMemory);
    refused(h.deallocate(&res), Status::UnknownAllocation);
    assert_eq!(h.live(), 5);

    h.fence_wait(fence, 10_000_000_000).unwrap();
    h.fence_destroy(fence).unwrap();
    assert_eq!(h.live(), 4);
    h.stream_destroy(stream).unwrap();
    assert_eq!(h.live(), 3);
    h.release_object(&phys).unwrap();
    h.release_object(&phys).unwrap();
    assert_eq!(h.live(), 3, "the mapping still holds the physical object");
    h.release_reservation(&res).unwrap();
    assert_eq!(h.live(), 1, "releasing the reservation dropped the mapping and so the object");
    h.deallocate(&alloc).unwrap();
    assert_eq!(h.live(), 0);
}

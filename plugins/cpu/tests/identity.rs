//! Identity (ARCHITECTURE.md §2, invariant 1; §3, Identity): every slot that takes
//! a `MemplugObjectRef` checks mechanism, then device, then that the handle
//! names a live object of the right kind exactly as it was issued — and a
//! refused call changes nothing.

mod common;
use common::*;

/// Every way a reference can be wrong, with the code it must get. Pairs of
/// faults check the order: mechanism before device before handle.
fn corruptions(good: &MemplugObjectRef) -> Vec<(&'static str, MemplugObjectRef, Status)> {
    let cuda = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };
    let cpu1 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 };
    let g = *good;
    vec![
        ("other mechanism", MemplugObjectRef { mechanism_id: 2, ..g }, Status::WrongMechanism),
        ("mechanism 0", MemplugObjectRef { mechanism_id: 0, ..g }, Status::WrongMechanism),
        (
            "other mechanism, other device, no handle",
            MemplugObjectRef { mechanism_id: 7, device: cuda, handle: 0, ..g },
            Status::WrongMechanism,
        ),
        ("CUDA device", MemplugObjectRef { device: cuda, ..g }, Status::WrongDevice),
        ("CPU ordinal 1", MemplugObjectRef { device: cpu1, ..g }, Status::WrongDevice),
        (
            "other device, forged handle",
            MemplugObjectRef { device: cpu1, handle: 999_999, ..g },
            Status::WrongDevice,
        ),
        ("handle 0", MemplugObjectRef { handle: 0, ..g }, Status::UnknownAllocation),
        ("next handle", MemplugObjectRef { handle: g.handle + 1, ..g }, Status::UnknownAllocation),
        ("forged handle", MemplugObjectRef { handle: 0xdead_beef, ..g }, Status::UnknownAllocation),
        ("handle u64::MAX", MemplugObjectRef { handle: u64::MAX, ..g }, Status::UnknownAllocation),
        ("other object_id", MemplugObjectRef { object_id: g.object_id + 1, ..g }, Status::UnknownAllocation),
        ("other addr", MemplugObjectRef { addr: g.addr ^ 0x1000, ..g }, Status::UnknownAllocation),
        ("other size", MemplugObjectRef { size: g.size + 1, ..g }, Status::UnknownAllocation),
        ("size 0", MemplugObjectRef { size: 0, ..g }, Status::UnknownAllocation),
    ]
}

/// Feeds every corruption of `good` to `slot`; each must be refused with
/// its code and a message, and leave the live count as it was.
#[track_caller]
fn assert_identity_checked(
    h: &Harness,
    slot: &str,
    good: &MemplugObjectRef,
    call: impl Fn(&MemplugObjectRef) -> Outcome<()>,
) {
    let live = h.live();
    for (what, bad, status) in corruptions(good) {
        let r = call(&bad);
        match r {
            Err(f) if f.status == status && !f.message.is_empty() => {}
            other => panic!("{slot} with {what}: expected {status}, got {other:?}"),
        }
        assert_eq!(h.live(), live, "{slot} with {what} changed the live count");
    }
}

#[test]
fn deallocate_checks_identity_and_refuses_a_double_free() {
    let h = harness();
    let a = h.allocate(64, 16).unwrap();
    let neighbour = h.allocate(64, 16).unwrap();
    assert_identity_checked(&h, "deallocate", &a, |o| h.deallocate(o));
    // A live neighbour's handle with this object's identity is still wrong.
    let swapped = MemplugObjectRef { handle: neighbour.handle, ..a };
    refused(h.deallocate(&swapped), Status::UnknownAllocation);

    h.deallocate(&a).unwrap();
    let msg = refused(h.deallocate(&a), Status::UnknownAllocation);
    assert!(msg.contains("allocation"), "{msg}");
    h.deallocate(&neighbour).unwrap();
    h.assert_balanced();
}

#[test]
fn a_reused_slot_does_not_revive_a_freed_handle() {
    let h = harness();
    let a = h.allocate(64, 16).unwrap();
    h.deallocate(&a).unwrap();
    let b = h.allocate(64, 16).unwrap();
    assert_eq!(b.handle, a.handle, "the slab reuses the freed slot");
    refused(h.deallocate(&a), Status::UnknownAllocation);
    h.deallocate(&b).unwrap();
    h.assert_balanced();
}

#[test]
fn objects_of_one_kind_are_unknown_to_the_slots_of_another() {
    let h = harness();
    let page = h.page();
    let alloc = h.allocate(page, 16).unwrap();
    let res = h.reserve(4 * page).unwrap();
    let phys = h.create(page).unwrap();
    let live = h.live();

    refused(h.deallocate(&res), Status::UnknownAllocation);
    refused(h.deallocate(&phys), Status::UnknownAllocation);
    refused(h.commit(&alloc, 0, page), Status::UnknownAllocation);
    refused(h.commit(&phys, 0, page), Status::UnknownAllocation);
    refused(h.committed(&alloc), Status::UnknownAllocation);
    refused(h.release_reservation(&phys), Status::UnknownAllocation);
    refused(h.release_reservation(&alloc), Status::UnknownAllocation);
    refused(h.retain(&res), Status::UnknownAllocation);
    refused(h.release_object(&alloc), Status::UnknownAllocation);
    refused(h.map(&res, 0, &res, 0, page, MEMPLUG_ACCESS_READ), Status::UnknownAllocation);
    refused(h.map(&phys, 0, &phys, 0, page, MEMPLUG_ACCESS_READ), Status::UnknownAllocation);
    refused(h.unmap(&alloc, 0, page), Status::UnknownAllocation);
    assert_eq!(h.live(), live);

    h.deallocate(&alloc).unwrap();
    h.release_reservation(&res).unwrap();
    h.release_object(&phys).unwrap();
    h.assert_balanced();
}

#[test]
fn virtual_backing_slots_check_identity() {
    let h = harness();
    let page = h.page();
    let res = h.reserve(4 * page).unwrap();

    assert_identity_checked(&h, "commit", &res, |r| h.commit(r, 0, page));
    assert_eq!(h.committed(&res).unwrap(), 0, "no refused commit committed anything");
    assert_eq!(mapping_at(res.addr).unwrap().0, "---p");
    h.commit(&res, 0, page).unwrap();

    assert_identity_checked(&h, "decommit", &res, |r| h.decommit(r, 0, page));
    assert_identity_checked(&h, "committed_bytes", &res, |r| h.committed(r).map(drop));
    assert_eq!(h.committed(&res).unwrap(), page, "no refused decommit decommitted anything");
    h.decommit(&res, 0, page).unwrap();

    assert_identity_checked(&h, "release", &res, |r| h.release_reservation(r));
    assert!(mapping_at(res.addr).is_some(), "no refused release unmapped anything");
    h.release_reservation(&res).unwrap();
    assert_eq!(mapping_at(res.addr), None, "the released range is unmapped");
    refused(h.release_reservation(&res), Status::UnknownAllocation);
    refused(h.commit(&res, 0, page), Status::UnknownAllocation);
    refused(h.committed(&res), Status::UnknownAllocation);
    h.assert_balanced();
}

#[test]
fn shared_mapping_slots_check_identity_of_both_references() {
    let h = harness();
    let page = h.page();
    let res = h.reserve(4 * page).unwrap();
    let phys = h.create(2 * page).unwrap();
    let rw = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;

    assert_identity_checked(&h, "map (object)", &phys, |o| h.map(o, 0, &res, 0, page, rw));
    assert_identity_checked(&h, "map (reservation)", &res, |r| h.map(&phys, 0, r, 0, page, rw));
    // Nothing was mapped by the refused calls.
    refused(h.unmap(&res, 0, page), Status::InvalidState);
    assert_eq!(mapping_at(res.addr).unwrap().0, "---p");

    h.map(&phys, 0, &res, 0, page, rw).unwrap();
    assert_identity_checked(&h, "unmap", &res, |r| h.unmap(r, 0, page));
    h.unmap(&res, 0, page).unwrap();

    assert_identity_checked(&h, "retain", &phys, |o| h.retain(o));
    assert_identity_checked(&h, "release", &phys, |o| h.release_object(o));
    // Still exactly the one reference from create: one release ends it.
    h.release_object(&phys).unwrap();
    refused(h.release_object(&phys), Status::UnknownAllocation);
    refused(h.retain(&phys), Status::UnknownAllocation);
    h.release_reservation(&res).unwrap();
    h.assert_balanced();
}

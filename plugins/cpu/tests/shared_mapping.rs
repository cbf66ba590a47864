//! The shared mapping capability: one physical object seen through views in
//! several reservations, read-only views that really are read-only, and
//! references that keep the pages exactly as long as someone can see them.

mod common;
use common::*;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
const RO: u32 = MEMPLUG_ACCESS_READ;

fn write_u64(addr: u64, v: u64) {
    unsafe { std::ptr::write_volatile(addr as *mut u64, v) }
}

fn read_u64(addr: u64) -> u64 {
    unsafe { std::ptr::read_volatile(addr as *const u64) }
}

#[test]
fn create_rounds_to_pages_and_is_zero_filled() {
    let h = harness();
    let page = h.page();
    let fds = plugin_memfds();
    let o = h.create(3 * page + 1).unwrap();
    assert_eq!(o.size, 4 * page);
    assert_eq!(o.addr, 0, "a physical object has no address until mapped");
    assert_eq!(plugin_memfds(), fds + 1);

    let res = h.reserve(4 * page).unwrap();
    h.map(&o, 0, &res, 0, 4 * page, RO).unwrap();
    let bytes = unsafe { std::slice::from_raw_parts(res.addr as *const u8, (4 * page) as usize) };
    assert!(bytes.iter().all(|&b| b == 0));
    h.unmap(&res, 0, 4 * page).unwrap();
    h.release_object(&o).unwrap();
    h.release_reservation(&res).unwrap();
    assert_eq!(plugin_memfds(), fds, "the last reference closes the memfd");
    h.assert_balanced();
}

#[test]
fn malformed_create_requests_are_refused() {
    let h = harness();
    refused(h.create(0), Status::InvalidArgument);
    refused(h.create_raw(&MemplugRequest { flags: 2, ..h.request(4096, 1) }), Status::InvalidArgument);
    let other = MemplugRequest {
        device: MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 3 },
        ..h.request(4096, 1)
    };
    refused(h.create_raw(&other), Status::WrongDevice);
    refused(h.create(1 << 62), Status::OutOfMemory);
    refused(h.create(u64::MAX), Status::OutOfMemory);
    h.assert_balanced();
}

#[test]
fn a_write_through_one_view_is_read_through_another() {
    let h = harness();
    let page = h.page();
    let o = h.create(4 * page).unwrap();
    let a = h.reserve(8 * page).unwrap();
    let b = h.reserve(8 * page).unwrap();

    // The whole object at page 1 of `a`; its pages 1..3 at page 4 of `b`.
    h.map(&o, 0, &a, page, 4 * page, RW).unwrap();
    h.map(&o, page, &b, 4 * page, 2 * page, RW).unwrap();
    assert_eq!(mapping_at(a.addr + page).unwrap().0, "rw-s");
    assert_eq!(mapping_at(b.addr + 4 * page).unwrap().0, "rw-s");
    assert_eq!(mapping_at(b.addr).unwrap().0, "---p", "the rest stays reserved");

    // Object byte offset `page + 8` is `a + 2 pages + 8` and `b + 4 pages + 8`.
    write_u64(a.addr + 2 * page + 8, 0x1234_5678_9abc_def0);
    assert_eq!(read_u64(b.addr + 4 * page + 8), 0x1234_5678_9abc_def0);
    write_u64(b.addr + 5 * page + 16, 42);
    assert_eq!(read_u64(a.addr + 3 * page + 16), 42);
    // Mapped pages are not committed pages.
    assert_eq!(h.committed(&a).unwrap(), 0);

    h.unmap(&a, page, 4 * page).unwrap();
    h.unmap(&b, 4 * page, 2 * page).unwrap();
    h.release_object(&o).unwrap();
    h.release_reservation(&a).unwrap();
    h.release_reservation(&b).unwrap();
    h.assert_balanced();
}

#[test]
fn a_read_only_view_faults_on_write_and_sees_updates() {
    let h = harness();
    let page = h.page();
    let o = h.create(page).unwrap();
    let rw = h.reserve(page).unwrap();
    let ro = h.reserve(page).unwrap();
    h.map(&o, 0, &rw, 0, page, RW).unwrap();
    h.map(&o, 0, &ro, 0, page, RO).unwrap();
    assert_eq!(mapping_at(ro.addr).unwrap().0, "r--s");

    write_u64(rw.addr, 7);
    assert_eq!(read_u64(ro.addr), 7, "the read-only view sees the other view's writes");

    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // Child: no core file for the expected crash, then the forbidden write.
        unsafe {
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            std::ptr::write_volatile(ro.addr as *mut u64, 8);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the child writing through a read-only view must die of SIGSEGV (wait status {status:#x})"
    );
    // The parent survives, and the failed write changed nothing.
    assert_eq!(read_u64(ro.addr), 7);
    write_u64(rw.addr, 9);
    assert_eq!(read_u64(ro.addr), 9);

    h.unmap(&rw, 0, page).unwrap();
    h.unmap(&ro, 0, page).unwrap();
    h.release_object(&o).unwrap();
    h.release_reservation(&rw).unwrap();
    h.release_reservation(&ro).unwrap();
    h.assert_balanced();
}

#[test]
fn releasing_the_last_reference_before_unmapping_keeps_the_data_until_the_last_unmap() {
    let h = harness();
    let page = h.page();
    let fds = plugin_memfds();
    let o = h.create(2 * page).unwrap();
    let a = h.reserve(2 * page).unwrap();
    let b = h.reserve(2 * page).unwrap();
    h.map(&o, 0, &a, 0, 2 * page, RW).unwrap();
    h.map(&o, 0, &b, 0, 2 * page, RO).unwrap();
    write_u64(a.addr + page, 0xfeed);
    let live = h.live();

    // The host's only reference goes: the handle is dead to the host...
    h.release_object(&o).unwrap();
    refused(h.retain(&o), Status::UnknownAllocation);
    refused(h.release_object(&o), Status::UnknownAllocation);
    let c = h.reserve(2 * page).unwrap();
    refused(h.map(&o, 0, &c, 0, page, RW), Status::UnknownAllocation);
    h.release_reservation(&c).unwrap();
    // ...but the pages stay while a view shows them.
    assert_eq!(h.live(), live, "the object is still held by its mappings");
    assert_eq!(plugin_memfds(), fds + 1);
    assert_eq!(read_u64(b.addr + page), 0xfeed);

    h.unmap(&a, 0, 2 * page).unwrap();
    assert_eq!(read_u64(b.addr + page), 0xfeed, "one view left");
    assert_eq!(plugin_memfds(), fds + 1);
    h.unmap(&b, 0, 2 * page).unwrap();
    assert_eq!(plugin_memfds(), fds, "the last unmap closes the memfd");
    assert_eq!(h.live(), live - 1);

    // Unmapping put the reservation back: inaccessible, and committable.
    assert_eq!(mapping_at(b.addr).unwrap().0, "---p");
    h.commit(&b, 0, 2 * page).unwrap();
    assert_eq!(read_u64(b.addr + page), 0, "fresh anonymous memory, not the object");
    h.release_reservation(&a).unwrap();
    h.release_reservation(&b).unwrap();
    h.assert_balanced();
}

#[test]
fn retain_and_release_count_references() {
    let h = harness();
    let page = h.page();
    let fds = plugin_memfds();
    let o = h.create(page).unwrap();
    h.retain(&o).unwrap();
    h.retain(&o).unwrap();
    h.release_object(&o).unwrap();
    h.release_object(&o).unwrap();
    assert_eq!(plugin_memfds(), fds + 1, "one reference is left");
    h.release_object(&o).unwrap();
    assert_eq!(plugin_memfds(), fds);
    refused(h.release_object(&o), Status::UnknownAllocation);
    h.assert_balanced();
}

#[test]
fn releasing_a_reservation_drops_the_references_of_its_mappings() {
    let h = harness();
    let page = h.page();
    let fds = plugin_memfds();
    let o = h.create(page).unwrap();
    let res = h.reserve(4 * page).unwrap();
    h.map(&o, 0, &res, 0, page, RW).unwrap();
    h.map(&o, 0, &res, 2 * page, page, RO).unwrap();
    h.release_object(&o).unwrap();
    assert_eq!(plugin_memfds(), fds + 1);
    h.release_reservation(&res).unwrap();
    assert_eq!(mapping_at(res.addr), None);
    assert_eq!(plugin_memfds(), fds, "the mappings' references went with the reservation");
    h.assert_balanced();
}

#[test]
fn mapping_ranges_and_states_are_checked() {
    let h = harness();
    let page = h.page();
    let o = h.create(4 * page).unwrap();
    let res = h.reserve(8 * page).unwrap();
    h.commit(&res, 0, page).unwrap();
    h.map(&o, 0, &res, 2 * page, 2 * page, RW).unwrap();
    let live = h.live();

    // Bad ranges, of the reservation or of the object.
    for (ooff, off, len) in [
        (0, 2 * page, 0),
        (0, 5 * page + 1, page),
        (0, 5 * page, page + 1),
        (0, 7 * page, 2 * page),
        (0, u64::MAX - page + 1, 2 * page),
        (1, 5 * page, page),
        (3 * page, 5 * page, 2 * page),
        (4 * page, 5 * page, page),
        (u64::MAX - page + 1, 5 * page, 2 * page),
    ] {
        refused(h.map(&o, ooff, &res, off, len, RW), Status::OutOfRange);
    }
    // Wrong states: over committed pages, over an existing mapping.
    refused(h.map(&o, 0, &res, 0, page, RW), Status::InvalidState);
    refused(h.map(&o, 0, &res, page, 2 * page, RW), Status::InvalidState);
    refused(h.map(&o, 0, &res, 3 * page, 2 * page, RO), Status::InvalidState);
    refused(h.commit(&res, 3 * page, page), Status::InvalidState);
    refused(h.decommit(&res, 2 * page, page), Status::InvalidState);
    // Access must be read or read|write.
    for access in [0, MEMPLUG_ACCESS_WRITE, 1 << 5] {
        refused(h.map(&o, 0, &res, 5 * page, page, access), Status::InvalidArgument);
    }
    // Unmap must name exactly one mapping.
    refused(h.unmap(&res, 2 * page, page), Status::InvalidState);
    refused(h.unmap(&res, 2 * page, 3 * page), Status::InvalidState);
    refused(h.unmap(&res, 3 * page, page), Status::InvalidState);
    refused(h.unmap(&res, 0, page), Status::InvalidState);
    refused(h.unmap(&res, 2 * page, 0), Status::OutOfRange);
    refused(h.unmap(&res, 2 * page + 1, page), Status::OutOfRange);
    refused(h.unmap(&res, 8 * page, page), Status::OutOfRange);

    // None of it changed anything.
    assert_eq!(h.live(), live);
    assert_eq!(h.committed(&res).unwrap(), page);
    assert_eq!(mapping_at(res.addr + page).unwrap().0, "---p");
    assert_eq!(mapping_at(res.addr + 2 * page).unwrap().0, "rw-s");
    assert_eq!(mapping_at(res.addr + 4 * page).unwrap().0, "---p");

    h.unmap(&res, 2 * page, 2 * page).unwrap();
    h.release_object(&o).unwrap();
    h.release_reservation(&res).unwrap();
    h.assert_balanced();
}

//! ABI 1.2 through the raw ABI: the memory descriptor the CPU mechanism
//! publishes, requests judged by it (page sizes, export kinds), and typed
//! export of its physical objects as memfds.

mod common;
use common::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;

#[test]
fn the_descriptor_says_host_memory_read_only_enforced_memfd_export_base_pages() {
    let h = harness();
    let p = h.properties().unwrap();
    let page = h.page();
    assert_eq!(p.recommended_granularity, 0, "the granularity is the one it works best at");
    assert_eq!(p.page_sizes, page, "base pages only: bit log2(page)");
    assert_eq!(
        p.attributes,
        MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_READ_ONLY_ENFORCED,
        "not ZERO_FILLED: allocations come from the system allocator"
    );
    assert_eq!(p.export_types, MEMPLUG_HANDLE_MEMFD);
    assert_eq!((p.location_kind, p.location_id), (MEMPLUG_LOCATION_HOST, 0));
    assert_eq!(p.flags, MEMPLUG_PROP_MAPS_AT_OFFSETS);
    assert_eq!(p.reserved1, 0);
}

#[test]
fn a_1_0_sized_properties_struct_gets_nothing_of_the_descriptor() {
    let h = harness();
    #[repr(C, align(8))]
    struct Buf([u8; 128]);
    let mut b = Buf([0xee; 128]);
    b.0[..4].copy_from_slice(&MEMPLUG_PROPERTIES_SIZE_1_0.to_ne_bytes());
    call(|sink| unsafe { h.alloc.properties.unwrap()(h.ctx as *mut _, b.0.as_mut_ptr().cast(), sink) })
        .unwrap();
    let n = MEMPLUG_PROPERTIES_SIZE_1_0 as usize;
    assert!(b.0[n..].iter().all(|&x| x == 0xee), "written past the 1.0 struct_size");
    assert_ne!(b.0[8..n], [0xee; 24][..], "the 1.0 fields are written");
}

#[test]
fn requests_naming_a_page_size_it_does_not_publish_are_refused() {
    let h = harness();
    let page = h.page();
    for bad in [2 * page, 3 * page, 2 << 20, 1] {
        let r = MemplugRequest { page_size: bad, ..h.request(page, 16) };
        let m = refused(h.allocate_raw(&r), Status::InvalidArgument);
        assert!(m.contains("page"), "{m}");
        refused(h.reserve_raw(&r), Status::InvalidArgument);
        refused(h.create_raw(&r), Status::InvalidArgument);
        h.assert_balanced();
    }
    // Its base page, named, is served.
    let r = MemplugRequest { page_size: page, ..h.request(page, 16) };
    let a = h.allocate_raw(&r).unwrap();
    h.deallocate(&h.object_ref(&r, &a)).unwrap();
    let b = h.reserve_raw(&r).unwrap();
    h.release_reservation(&h.object_ref(&r, &b)).unwrap();
    let c = h.create_raw(&r).unwrap();
    h.release_object(&h.object_ref(&r, &c)).unwrap();
    h.assert_balanced();
}

#[test]
fn a_create_naming_an_export_kind_it_does_not_offer_is_unsupported() {
    let h = harness();
    let page = h.page();
    for kind in [
        MEMPLUG_HANDLE_OPAQUE_FD,
        MEMPLUG_HANDLE_DMABUF_FD,
        MEMPLUG_HANDLE_WIN32,
        MEMPLUG_HANDLE_VENDOR_BLOB,
        MEMPLUG_HANDLE_MEMFD | MEMPLUG_HANDLE_DMABUF_FD,
    ] {
        let r = MemplugRequest { export_types: kind, ..h.request(page, 1) };
        refused(h.create_raw(&r), Status::Unsupported);
    }
    h.assert_balanced();
    let r = MemplugRequest { export_types: MEMPLUG_HANDLE_MEMFD, ..h.request(page, 1) };
    let b = h.create_raw(&r).unwrap();
    h.release_object(&h.object_ref(&r, &b)).unwrap();
    h.assert_balanced();
}

fn export_handle(h: &Harness, o: &MemplugObjectRef, kind: u32) -> Outcome<MemplugHandle> {
    let mut out = MemplugHandle { struct_size: MEMPLUG_HANDLE_SIZE_1_2, ..Default::default() };
    call(|sink| unsafe { h.sm.export_handle.unwrap()(h.ctx as *mut _, o, kind, &mut out, sink) })?;
    Ok(out)
}

fn import_handle(h: &Harness, handle: &MemplugHandle, size: u64) -> Outcome<MemplugObjectRef> {
    let r = h.request(size, 1);
    let mut out = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_2, ..Default::default() };
    call(|sink| unsafe { h.sm.import_handle.unwrap()(h.ctx as *mut _, handle, &r, &mut out, sink) })?;
    Ok(h.object_ref(&r, &out))
}

#[test]
fn a_physical_object_exports_as_a_memfd_handle_that_imports_as_the_same_memory() {
    let h = harness();
    let len = 2 * h.page();
    let a = h.create(len).unwrap();
    let handle = export_handle(&h, &a, MEMPLUG_HANDLE_MEMFD).unwrap();
    assert_eq!(handle.handle_type, MEMPLUG_HANDLE_MEMFD);
    assert!(handle.fd > 2);
    let fd = unsafe { OwnedFd::from_raw_fd(handle.fd) };
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().starts_with("/memfd:"), "{}", link.display());
    let again = export_handle(&h, &a, MEMPLUG_HANDLE_MEMFD).unwrap();
    assert_ne!(again.fd, handle.fd, "each export is a new descriptor");
    drop(unsafe { OwnedFd::from_raw_fd(again.fd) });

    let b = import_handle(&h, &handle, len).unwrap();
    // The handle stays the caller's: closing it leaves the import whole.
    drop(fd);
    let (ra, rb) = (h.reserve(len).unwrap(), h.reserve(len).unwrap());
    h.map(&a, 0, &ra, 0, len, RW).unwrap();
    h.map(&b, 0, &rb, 0, len, RW).unwrap();
    unsafe {
        ((ra.addr + len - 1) as *mut u8).write_volatile(0x5a);
        assert_eq!(((rb.addr + len - 1) as *const u8).read_volatile(), 0x5a);
    }
    for (r, o) in [(&ra, &a), (&rb, &b)] {
        h.unmap(r, 0, len).unwrap();
        h.release_reservation(r).unwrap();
        h.release_object(o).unwrap();
    }
    h.assert_balanced();
}

#[test]
fn typed_export_refuses_kinds_it_does_not_offer_and_handles_it_cannot_use() {
    let h = harness();
    let len = h.page();
    let a = h.create(len).unwrap();
    for kind in [MEMPLUG_HANDLE_OPAQUE_FD, MEMPLUG_HANDLE_DMABUF_FD, MEMPLUG_HANDLE_WIN32, 1 << 7, 0] {
        let m = refused(export_handle(&h, &a, kind), Status::Unsupported);
        assert!(m.contains("not one this mechanism offers"), "{m}");
    }
    let bad_fd = MemplugHandle {
        struct_size: MEMPLUG_HANDLE_SIZE_1_2,
        handle_type: MEMPLUG_HANDLE_MEMFD,
        fd: -1,
        ..Default::default()
    };
    refused(import_handle(&h, &bad_fd, len), Status::InvalidArgument);
    let handle = export_handle(&h, &a, MEMPLUG_HANDLE_MEMFD).unwrap();
    let fd = unsafe { OwnedFd::from_raw_fd(handle.fd) };
    let other_kind = MemplugHandle { handle_type: MEMPLUG_HANDLE_DMABUF_FD, ..handle };
    refused(import_handle(&h, &other_kind, len), Status::Unsupported);
    // More than the memory behind the handle, as for import_fd.
    let m = refused(import_handle(&h, &handle, 64 * len), Status::OutOfRange);
    assert!(m.contains("less than"), "{m}");
    drop(fd);
    let mut forged = a;
    forged.handle ^= 0xffff_0000_0000_0000;
    refused(export_handle(&h, &forged, MEMPLUG_HANDLE_MEMFD), Status::UnknownAllocation);
    h.release_object(&a).unwrap();
    h.assert_balanced();
}

//! The allocator capability through its C slots: alignment, sizes, refusals.

mod common;
use common::*;

#[test]
fn allocations_are_aligned_usable_and_freed() {
    let h = harness();
    let mut live = Vec::new();
    for shift in 0..=30u32 {
        let alignment = 1u64 << shift;
        for size in [1u64, 7, 64, 4096, 100_003] {
            let r = h.request(size, alignment);
            let b = h.allocate_raw(&r).unwrap();
            assert_ne!(b.handle, 0);
            assert_eq!(b.size, size, "the block reports the bytes asked for");
            assert_eq!(b.addr % alignment.max(16), 0, "size {size} alignment {alignment}");
            // Every byte is ours to write and read back.
            unsafe {
                let p = b.addr as *mut u8;
                std::ptr::write_bytes(p, 0xa5, size as usize);
                assert_eq!(*p.add(size as usize - 1), 0xa5);
            }
            live.push(h.object_ref(&r, &b));
            if shift > 24 {
                // Huge alignments cost address space; do not hoard them.
                h.deallocate(&live.pop().unwrap()).unwrap();
            }
        }
    }
    assert_eq!(h.live(), h.baseline + live.len() as u64);
    for o in &live {
        h.deallocate(o).unwrap();
    }
    h.assert_balanced();
}

#[test]
fn malformed_requests_are_invalid_arguments() {
    let h = harness();
    let cases: [(&str, MemplugRequest); 6] = [
        ("zero size", MemplugRequest { size: 0, ..h.request(64, 16) }),
        ("zero alignment", h.request(64, 0)),
        ("alignment 24", h.request(64, 24)),
        ("alignment 2 GiB", h.request(64, 1 << 31)),
        ("alignment 2^63", h.request(64, 1 << 63)),
        ("unknown flag", MemplugRequest { flags: 1 << 7, ..h.request(64, 16) }),
    ];
    for (what, r) in cases {
        let msg = refused(h.allocate_raw(&r), Status::InvalidArgument);
        assert!(!msg.is_empty(), "{what}");
    }
    h.assert_balanced();
}

#[test]
fn a_request_for_another_device_is_wrong_device() {
    let h = harness();
    for device in [
        MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 },
        MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 },
    ] {
        let r = MemplugRequest { device, ..h.request(64, 16) };
        refused(h.allocate_raw(&r), Status::WrongDevice);
    }
    h.assert_balanced();
}

#[test]
fn impossible_sizes_are_out_of_memory_not_an_abort() {
    let h = harness();
    for (size, alignment) in
        [(1u64 << 62, 16u64), (u64::MAX, 16), (i64::MAX as u64, 1 << 30), (1 << 50, 4096)]
    {
        let msg = refused(h.allocate_raw(&h.request(size, alignment)), Status::OutOfMemory);
        assert!(msg.contains(&size.to_string()), "{msg}");
    }
    h.assert_balanced();
}

#[test]
fn a_short_request_struct_is_refused() {
    let h = harness();
    let r = MemplugRequest { struct_size: MEMPLUG_REQUEST_SIZE_1_0 - 8, ..h.request(64, 16) };
    refused(h.allocate_raw(&r), Status::InvalidArgument);
    h.assert_balanced();
}

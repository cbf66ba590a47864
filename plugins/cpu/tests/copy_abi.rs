//! The CPU plugin's ABI 1.3 copy through its raw slots: the 1.3 view
//! publishes `copy` in a 96-byte sync table and `copy_kinds` DEVICE|HOST in
//! 80-byte properties; the 1.2 view has neither (an 88-byte table, and a
//! 72-byte properties struct written no further); the slot's own refusals
//! (overlap, wrap, len 0, unknown stream) before anything is enqueued.

mod common;
use common::*;

fn view(minor: u32) -> &'static MemplugMechanism {
    let host = host_info(MEMPLUG_ABI_MAJOR, 0, minor);
    let n = negotiate(memplug_plugin_cpu::memplug_plugin_v1, &host).expect("negotiation");
    assert_eq!(n.agreed_minor, minor);
    unsafe { &**(*n.plugin).mechanisms }
}

fn properties(m: &MemplugMechanism, size: u32) -> [u8; 96] {
    let mut buf = [0xa5u8; 96];
    buf[..4].copy_from_slice(&size.to_ne_bytes());
    let alloc = unsafe { &*m.allocator };
    let out = buf.as_mut_ptr().cast::<MemplugProperties>();
    call(|sink| unsafe { alloc.properties.unwrap()(m.ctx, out, sink) }).expect("properties");
    buf
}

#[test]
fn the_1_3_view_has_the_copy_and_its_kinds_and_the_1_2_view_neither() {
    let _h = harness();
    let m = view(3);
    let sync = unsafe { &*m.sync };
    assert_eq!(sync.struct_size, MEMPLUG_SYNC_SIZE_1_3);
    assert!(sync.copy.is_some());
    let p = properties(m, MEMPLUG_PROPERTIES_SIZE_1_3);
    let kinds = u32::from_ne_bytes(p[72..76].try_into().unwrap());
    assert_eq!(kinds, MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST);
    assert!(p[80..].iter().all(|&b| b == 0xa5), "nothing written past struct_size 80");

    let m = view(2);
    let sync = unsafe { &*m.sync };
    assert_eq!(sync.struct_size, MEMPLUG_SYNC_SIZE_1_2);
    assert!(sync.copy.is_none(), "the 1.2 table's prefix is all a 1.2 host reads; nothing past it either");
    let p = properties(m, MEMPLUG_PROPERTIES_SIZE_1_2);
    assert!(
        p[72..].iter().all(|&b| b == 0xa5),
        "a 1.2 host's properties are written no further than 72 bytes"
    );
}

#[test]
fn the_slot_refuses_before_enqueuing_and_copies_nothing_for_len_0() {
    let h = harness();
    let m = view(3);
    let copy = unsafe { &*m.sync }.copy.unwrap();
    let s = h.stream_create().unwrap();
    let mut buf = vec![1u8; 256];
    let a = buf.as_mut_ptr() as u64;
    let run = |stream: u64, dst: u64, src: u64, len: u64| {
        call(|sink| unsafe { copy(m.ctx, stream, dst, src, len, sink) })
    };
    let msg = refused(run(s, a + 8, a, 64), Status::InvalidArgument);
    assert!(msg.contains("overlap"), "{msg}");
    let msg = refused(run(s, u64::MAX - 8, a, 64), Status::OutOfRange);
    assert!(msg.contains("dst range"), "{msg}");
    run(s, a, a, 0).expect("len 0 is a no-op, even at one address");
    let msg = refused(run(s ^ (1 << 40), a + 128, a, 64), Status::UnknownAllocation);
    assert!(msg.contains("stream"), "{msg}");
    run(s, a + 128, a, 64).expect("host memory to host memory");
    h.stream_destroy(s).unwrap();
    assert!(buf.iter().all(|&b| b == 1));
}

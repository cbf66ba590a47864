//! What the CUDA plugin does with ABI 1.2 beyond device loss, through the
//! host, against the fake driver (or a real GPU with
//! MEMPLUG_CUDA_TEST_REAL=1): the memory descriptor and device identity
//! from the driver, the zero-fill skipped on `MEMPLUG_HINT_UNINITIALIZED_OK`,
//! peer access between the fake's two devices, `stream_wait_fence` as a
//! device-side wait, and typed stream adoption.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{Access, Placement, Status};
use memplug_sdk::abi::*;
use std::time::Duration;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;

fn cuda(n: u32) -> MemplugDevice {
    MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: n }
}

#[test]
fn the_descriptor_and_identity_are_what_the_driver_says() {
    let _s = serial();
    let p = load();
    for (i, m) in device_mechanisms(&p).iter().enumerate() {
        let props = m.properties();
        let d = props.descriptor;
        let g = props.granularity;
        assert_eq!(d.location, memplug_host::Location::DEVICE);
        assert_eq!(d.attributes, MEMPLUG_ATTR_DEVICE_LOCAL | MEMPLUG_ATTR_READ_ONLY_ENFORCED, "{d:?}");
        assert_eq!(d.page_sizes, g, "pages of the granularity");
        assert!(!d.maps_at_offsets, "CUDA maps a shareable handle only from its start");
        assert!(d.recommended_granularity == 0 || d.recommended_granularity % g == 0, "{d:?}");
        let id = m.identity().expect("the driver answers UUID and PCI queries");
        assert_ne!(id.valid & MEMPLUG_IDENTITY_UUID, 0);
        assert_ne!(id.valid & MEMPLUG_IDENTITY_PCI, 0);
        if !real() {
            let mut uuid = *b"memplug-fake-gpu";
            uuid[15] = i as u8;
            assert_eq!(id.uuid, uuid);
            assert_eq!((id.pci_domain, id.pci_bus, id.pci_device), (0, 0x10 + i as u32, 0));
            assert_eq!(d.recommended_granularity, g, "the fake recommends its minimum, as GPUs do");
        }
    }
    drop(p);
}

#[test]
fn a_reservation_asking_for_uninitialised_memory_commits_without_a_fill() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let g = m.properties().granularity;
    let memsets = || fake_entry_calls("cuMemsetD8Async");
    let filled = vb.reserve(2 * g).unwrap();
    let hinted = vb
        .reserve_placed(
            2 * g,
            AllocationClass::Kv,
            &Placement { hints: MEMPLUG_HINT_UNINITIALIZED_OK, ..Default::default() },
        )
        .unwrap();
    let before = memsets();
    vb.commit(&hinted, 0, g).unwrap();
    assert_eq!(memsets(), before, "no fill for a reservation that waived it");
    if !real() {
        assert_eq!(
            read(hinted.addr(), 16),
            vec![0xa5; 16],
            "the fake's fresh memory is a pattern, not zeros"
        );
    }
    vb.commit(&filled, 0, g).unwrap();
    if let (Some(a), Some(b)) = (before, memsets()) {
        assert_eq!(b, a + 1, "one fill for a plain reservation");
    }
    assert_eq!(read(filled.addr(), 16), vec![0; 16]);
    vb.release(filled).unwrap();
    vb.release(hinted).unwrap();
    // The same for a physical object made with the hint.
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let before = memsets();
    let o = sm
        .create_placed(
            g,
            AllocationClass::Kv,
            &Placement { hints: MEMPLUG_HINT_UNINITIALIZED_OK, ..Default::default() },
        )
        .unwrap();
    assert_eq!(memsets(), before, "no fill for a physical object that waived it");
    let plain = sm.create(g).unwrap();
    if let (Some(a), Some(b)) = (before, memsets()) {
        assert_eq!(b, a + 1, "one fill for a plain physical object");
    }
    sm.release(o).unwrap();
    sm.release(plain).unwrap();
    drop(m);
    unload_released(p);
}

#[test]
fn peer_access_opens_a_committed_range_to_the_other_device_and_closes_it() {
    let _s = serial();
    let p = load();
    if drv().devices.len() < 2 {
        eprintln!("skipped: one CUDA device, no peer");
        return;
    }
    let m = cuda0(&p);
    assert!(m.capabilities().peer_access());
    let pa = m.peer_access().expect("published with two devices");
    assert_eq!(pa.can_access_peer(cuda(1)).unwrap().map(Access::bits), Some(RW));
    assert_eq!(pa.can_access_peer(MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 }).unwrap(), None);
    assert_eq!(pa.can_access_peer(cuda(0)).unwrap().map(Access::bits), Some(RW), "its own memory");
    assert_eq!(pa.can_access_peer(cuda(7)).unwrap_err().status, Status::WrongDevice);

    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let g = m.properties().granularity;
    let r = vb.reserve(4 * g).unwrap();
    vb.commit(&r, 0, 2 * g).unwrap();
    // The fake enforces peer access for device work (a GPU would fault;
    // the fake refuses the copy at submission): a copy by device 1 from
    // device 0's memory needs the grant.
    let peer_copy = |addr: u64| {
        let mut buf = [0u8; 16];
        in_context(1, |d| unsafe {
            (d.api.memcpy_async)(buf.as_mut_ptr() as u64, addr, 16, std::ptr::null_mut())
        })
    };
    if !real() {
        assert_eq!(peer_copy(r.addr()), 1, "device 1 read device 0's memory without a grant");
    }
    // A range not wholly committed is refused, nothing set.
    let e = pa.set_peer_access(&r, g, 2 * g, cuda(1), Some(Access::ReadWrite)).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "{e}");
    let e = pa.set_peer_access(&r, 0, g, cuda(0), Some(Access::ReadOnly)).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "its own access is set by commit and map: {e}");
    pa.set_peer_access(&r, 0, 2 * g, cuda(1), Some(Access::ReadWrite)).unwrap();
    if !real() {
        assert_eq!(fake_access_of(r.addr(), 1).unwrap(), 3, "PROT_READ|PROT_WRITE for the peer");
        assert_eq!(fake_access_of(r.addr() + g, 1).unwrap(), 3);
        assert_eq!(fake_access_of(r.addr(), 0).unwrap(), 3, "the owner keeps its access");
        assert_eq!(peer_copy(r.addr()), 0, "device 1 reads with the grant");
    }
    pa.set_peer_access(&r, 0, g, cuda(1), None).unwrap();
    if !real() {
        assert_eq!(fake_access_of(r.addr(), 1).unwrap(), 0, "revoked");
        assert_eq!(peer_copy(r.addr()), 1, "device 1 read after the revoke");
        assert_eq!(peer_copy(r.addr() + g), 0, "the rest still readable by device 1");
        assert_eq!(fake_access_of(r.addr() + g, 1).unwrap(), 3, "the rest kept");
        assert_eq!(fake_access_of(r.addr(), 0).unwrap(), 3);
    }
    // Over a shared mapping, read access only.
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let o = sm.create(g).unwrap();
    sm.map(&o, 0, &r, 2 * g, g, Access::ReadWrite).unwrap();
    let e = pa.set_peer_access(&r, 2 * g, g, cuda(1), Some(Access::ReadWrite)).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.to_string().contains("shared mapping"), "{e}");
    pa.set_peer_access(&r, 2 * g, g, cuda(1), Some(Access::ReadOnly)).unwrap();
    if !real() {
        assert_eq!(fake_access_of(r.addr() + 2 * g, 1).unwrap(), 1, "PROT_READ for the peer");
    }
    sm.unmap(&r, 2 * g, g).unwrap();
    sm.release(o).unwrap();
    vb.release(r).unwrap();
    drop(m);
    unload_released(p);
}

#[test]
fn stream_wait_fence_holds_a_stream_on_the_device_not_a_thread() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let (a, b) = (sync.stream_create().unwrap(), sync.stream_create().unwrap());
    let (open, gate) = std::sync::mpsc::channel::<()>();
    sync.enqueue(&a, move || {
        let _ = gate.recv_timeout(Duration::from_secs(20));
    })
    .unwrap();
    let fa = sync.fence_record(&a).unwrap();
    sync.stream_wait_fence(&b, &fa).unwrap();
    // Recorded on B after the wait: an event record, not a host function,
    // so only the wait can hold it.
    let fb = sync.fence_record(&b).unwrap();
    assert!(!sync.fence_wait(&fb, Duration::from_millis(50)).unwrap(), "B ran past A's fence");
    open.send(()).unwrap();
    assert!(sync.fence_wait(&fb, Duration::from_secs(20)).unwrap());
    assert!(sync.fence_query(&fa).unwrap());
    for f in [fa, fb] {
        sync.fence_destroy(f).unwrap();
    }
    sync.stream_destroy(a).unwrap();
    sync.stream_destroy(b).unwrap();
    drop(m);
    unload_released(p);
}

#[test]
fn typed_adoption_takes_cuda_streams_only() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let sync = m.sync().unwrap();
    let e = unsafe { sync.stream_adopt_typed(MEMPLUG_DEVICE_CPU, std::ptr::null_mut()) }.unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    assert!(e.to_string().contains("not a CUstream"), "{e}");
    // The legacy default stream (NULL), named as a CUDA stream.
    let s = unsafe { sync.stream_adopt_typed(MEMPLUG_DEVICE_CUDA, std::ptr::null_mut()) }.unwrap();
    let f = sync.fence_record(&s).unwrap();
    assert!(sync.fence_wait(&f, Duration::from_secs(20)).unwrap());
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(s).unwrap();
    drop(m);
    unload_released(p);
}

#[test]
fn rdma_is_claimed_and_asked_of_the_driver_only_where_the_device_has_it() {
    if real() {
        eprintln!("skipped on a real GPU: the fake's switch decides the attribute");
        return;
    }
    let _s = serial();
    let p = load();
    let d = cuda0(&p).properties().descriptor;
    assert_eq!(d.attributes & MEMPLUG_ATTR_RDMA, 0, "the fake reports no RDMA by default");
    drop(p);
    run_child("rdma_child", &[("MEMPLUG_FAKE_CUDA_RDMA", Some(std::ffi::OsStr::new("1")))]);
}

#[test]
#[ignore = "run by rdma_is_claimed_and_asked_of_the_driver_only_where_the_device_has_it"]
fn rdma_child() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    assert_ne!(
        m.properties().descriptor.attributes & MEMPLUG_ATTR_RDMA,
        0,
        "claimed where the device has it"
    );
    let rdma_creates = || fake_rdma_creates().expect("fake mode");
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let g = m.properties().granularity;
    // The fake's RDMA-capable memory has twice the plain granularity: the
    // plugin asked with the properties it creates memory with.
    assert_eq!(g, 2 * FAKE_GRANULARITY, "granularity queried with gpuDirectRDMACapable");
    let r = vb.reserve(2 * g).unwrap();
    let before = rdma_creates();
    vb.commit(&r, 0, 2 * g).unwrap();
    assert_eq!(rdma_creates(), before + 2, "each granule made RDMA-capable");
    vb.release(r).unwrap();
    drop(m);
    unload_released(p);
}

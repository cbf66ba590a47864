//! DLPack export on the reference CPU plugin (linked in-process): zero
//! copy, the caller's layout, the read-only flag of a shared prefix, and a
//! deleter that frees through memplug — after its fences, from any thread,
//! after the manager is gone.

use memplug_host::dlpack::{self, DLDataType, ExportOptions, SharedRegion, TensorLayout};
use memplug_host::governor::AllocationClass;
use memplug_host::{
    BindingSpec, CacheConfig, FnFence, LoadOptions, MemoryBinding, Plugin, ProcessMemoryManager,
    Requirements, SharedFence,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const F32: DLDataType = DLDataType { code: dlpack::K_DL_FLOAT, bits: 32, lanes: 1 };
const MIB: u64 = 1 << 20;

fn setup() -> (ProcessMemoryManager, Arc<memplug_host::Context>, Arc<memplug_host::governor::Pool>) {
    let mgr = ProcessMemoryManager::new();
    // SAFETY: the reference CPU plugin's entry, built against this ABI.
    let cpu =
        unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }
            .unwrap();
    mgr.register_plugin(cpu).unwrap();
    let needs = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
    let ctx = mgr.select(MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 }, needs).unwrap();
    let pool = mgr.create_pool("dlpack", 64 * MIB).unwrap();
    (mgr, ctx, pool)
}

fn bind(
    mgr: &ProcessMemoryManager,
    ctx: &Arc<memplug_host::Context>,
    pool: &Arc<memplug_host::governor::Pool>,
) -> MemoryBinding {
    mgr.bind(ctx, pool, BindingSpec::new(AllocationClass::Activations)).unwrap()
}

/// A fence the test completes by hand.
fn manual_fence() -> (SharedFence, Arc<AtomicBool>) {
    let done = Arc::new(AtomicBool::new(false));
    let (q, w) = (done.clone(), done.clone());
    (FnFence::new("test", move || q.load(Ordering::Acquire), move |_| w.load(Ordering::Acquire)), done)
}

#[test]
fn allocation_exports_without_a_copy_and_the_deleter_frees() {
    let (mgr, ctx, pool) = setup();
    let a = bind(&mgr, &ctx, &pool).allocate(MIB, 256).unwrap();
    let addr = a.addr();
    let t = dlpack::export(a, &TensorLayout::new([256, 1024], F32), ExportOptions::default()).unwrap();
    let raw = t.tensor();
    assert_eq!(t.data(), addr, "the tensor is the allocation's memory");
    assert_eq!((raw.version.major, raw.flags), (dlpack::DLPACK_MAJOR_VERSION, 0));
    assert_eq!((raw.dl_tensor.device.device_type, raw.dl_tensor.device.device_id), (dlpack::K_DL_CPU, 0));
    assert_eq!((t.shape(), t.strides()), (&[256, 1024][..], &[1024, 1][..]));
    assert_eq!(raw.manager_ctx as u64, raw as *const _ as u64);
    // Writes through the tensor's pointer land in the allocation.
    // SAFETY: CPU memory of 1 MiB, owned by the tensor.
    unsafe { *(t.data() as *mut f32).add(1000) = 7.5 };
    assert_eq!(unsafe { *((addr as *const f32).add(1000)) }, 7.5);
    assert_eq!(pool.used(), MIB);
    drop(t); // the deleter
    assert_eq!(pool.used(), 0, "the deleter freed through memplug");
}

#[test]
fn a_refused_export_gives_the_allocation_back() {
    let (mgr, ctx, pool) = setup();
    let a = bind(&mgr, &ctx, &pool).allocate(4096, 64).unwrap();
    let addr = a.addr();
    let r = dlpack::export(a, &TensorLayout::new([1025], F32), ExportOptions::default()).unwrap_err();
    assert_eq!(r.error, dlpack::ExportError::OutOfBounds { needed: 4100, available: 4096 });
    assert_eq!((r.source.addr(), pool.used()), (addr, 4096));
    let r = dlpack::export(r.source, &TensorLayout::new([-1], F32), ExportOptions::default()).unwrap_err();
    assert!(matches!(r.error, dlpack::ExportError::Layout(_)), "{}", r.error);
    drop(r);
    assert_eq!(pool.used(), 0);
}

#[test]
fn shared_allocation_lives_until_the_last_tensor_goes() {
    let (mgr, ctx, pool) = setup();
    let a = Arc::new(bind(&mgr, &ctx, &pool).allocate(MIB, 256).unwrap());
    let whole = dlpack::export(a.clone(), &TensorLayout::bytes(MIB), ExportOptions::default()).unwrap();
    let half = TensorLayout::new([1024], F32).at(MIB / 2);
    let ro = ExportOptions { read_only: true, ..Default::default() };
    let tail = dlpack::export(a.clone(), &half, ro).unwrap();
    assert_eq!(tail.data(), a.addr() + MIB / 2);
    assert!(tail.is_read_only() && !whole.is_read_only());
    drop(a);
    drop(whole);
    assert_eq!(pool.used(), MIB, "one tensor still holds it");
    drop(tail);
    assert_eq!(pool.used(), 0);
}

#[test]
fn the_deleter_waits_for_the_exports_fences() {
    let (mgr, ctx, pool) = setup();
    let a = bind(&mgr, &ctx, &pool).allocate(MIB, 256).unwrap();
    let (fence, done) = manual_fence();
    let t = dlpack::export(
        a,
        &TensorLayout::bytes(MIB),
        ExportOptions { fences: vec![fence], ..Default::default() },
    )
    .unwrap();
    drop(t);
    mgr.poll();
    assert_eq!(pool.used(), MIB, "the device may still use it");
    done.store(true, Ordering::Release);
    mgr.poll();
    assert_eq!(pool.used(), 0);
}

#[test]
fn the_deleter_runs_on_another_thread_after_the_manager_is_gone() {
    let (mgr, ctx, pool) = setup();
    let t = dlpack::export(
        bind(&mgr, &ctx, &pool).allocate(MIB, 256).unwrap(),
        &TensorLayout::bytes(MIB),
        Default::default(),
    )
    .unwrap();
    let raw = t.into_raw() as usize;
    drop((mgr, ctx));
    assert_eq!(pool.used(), MIB);
    std::thread::spawn(move || {
        let p = raw as *mut dlpack::DLManagedTensorVersioned;
        // SAFETY: the consumer's one call of the deleter it was handed.
        unsafe { ((*p).deleter.unwrap())(p) };
    })
    .join()
    .unwrap();
    assert_eq!(pool.used(), 0, "freed by the plugin the tensor kept loaded");
}

#[test]
fn cached_allocation_goes_back_to_its_cache() {
    let (mgr, ctx, pool) = setup();
    let spec = BindingSpec::new(AllocationClass::Activations);
    let cache = mgr.bind_caching(&ctx, &pool, spec, CacheConfig::default()).unwrap();
    let a = cache.allocate(MIB, 256).unwrap();
    let addr = a.addr();
    let t = dlpack::export(a, &TensorLayout::bytes(MIB), Default::default()).unwrap();
    assert_eq!((t.data(), cache.stats().in_use_blocks), (addr, 1));
    drop(t);
    assert_eq!((cache.stats().in_use_blocks, cache.stats().idle_blocks), (0, 1));
    assert_eq!(cache.allocate(MIB, 256).unwrap().addr(), addr, "reused");
}

#[test]
fn region_views_see_growth_refuse_shrinking_and_flag_the_prefix() {
    let (mgr, ctx, pool) = setup();
    let kv = bind(&mgr, &ctx, &pool);
    let prefix = kv.create_shared(MIB, |v| unsafe { v.as_mut_slice()[0] = 42 }).unwrap();
    let region = SharedRegion::new(kv.reserve_virtual(16 * MIB).unwrap());
    region.map_prefix(&prefix).unwrap();
    region.grow_to(2 * MIB, |_| Ok::<(), ()>(())).unwrap();
    let base = region.view().addr;

    let all = region.to_dlpack(&TensorLayout::bytes(2 * MIB), Default::default()).unwrap();
    assert!(all.is_read_only(), "it touches the read-only prefix");
    assert!(all.memory_is_read_only(), "and its memory cannot be written");
    assert_eq!(unsafe { *(all.data() as *const u8) }, 42);
    let private = region.to_dlpack(&TensorLayout::bytes(MIB).at(MIB), Default::default()).unwrap();
    assert!(!private.is_read_only() && !private.memory_is_read_only());
    let asked = region
        .to_dlpack(&TensorLayout::bytes(16).at(MIB), ExportOptions { read_only: true, ..Default::default() })
        .unwrap();
    assert!(asked.is_read_only() && !asked.memory_is_read_only(), "the flag only: the bytes are writable");
    drop(asked);
    assert_eq!((private.data(), region.views()), (base + MIB, 2));
    assert!(region.to_dlpack(&TensorLayout::bytes(2 * MIB + 1), Default::default()).is_err());

    // Growing under live views keeps the base; shrinking is refused.
    region.grow_to(4 * MIB, |v| if v.addr == base { Ok(()) } else { Err(()) }).unwrap();
    assert!(region.shrink_to(MIB, vec![]).is_err());
    assert_eq!(region.view().len, 4 * MIB);
    drop(all);
    drop(private);
    assert_eq!(region.views(), 0);
    region.shrink_to(2 * MIB, vec![]).unwrap();
    assert_eq!(region.view().len, 2 * MIB);

    // The region goes with its last holder, view or handle.
    let view = region.to_dlpack(&TensorLayout::bytes(MIB).at(MIB), Default::default()).unwrap();
    drop(region);
    assert_eq!(pool.used(), prefix.charged() + MIB);
    drop(view);
    assert_eq!(pool.used(), prefix.charged());
}

/// A private copy of a view of the read-only prefix: its own writable
/// memory, the same bytes, flagged as a copy; a write to it changes neither
/// the prefix nor the region, and dropping it leaves the region's views.
#[test]
fn a_private_copy_of_read_only_memory_is_writable_and_apart() {
    let (mgr, ctx, pool) = setup();
    let kv = bind(&mgr, &ctx, &pool);
    let prefix =
        kv.create_shared(MIB, |v| unsafe { v.as_mut_slice()[..4].copy_from_slice(&[1, 2, 3, 4]) }).unwrap();
    let region = SharedRegion::new(kv.reserve_virtual(16 * MIB).unwrap());
    region.map_prefix(&prefix).unwrap();
    let used = pool.used();
    let u32s = DLDataType { code: dlpack::K_DL_UINT, bits: 32, lanes: 1 };
    // A reversed view (stride -1) of the prefix's first four bytes:
    // element 0 is the fourth byte.
    let bytes = DLDataType { code: dlpack::K_DL_UINT, bits: 8, lanes: 1 };
    let layout = TensorLayout { strides: Some(vec![-1]), ..TensorLayout::new([4], bytes) }.at(3);
    let view = region.to_dlpack(&layout, Default::default()).unwrap();
    assert!(view.memory_is_read_only());
    assert_eq!(view.data(), region.view().addr + 3, "data points at element 0, not the lowest byte");
    let copy = dlpack::private_copy(&view, false).unwrap();
    assert!(copy.is_copy() && !copy.is_read_only() && !copy.memory_is_read_only());
    assert_eq!((copy.shape(), copy.strides()), (&[4i64][..], &[-1i64][..]));
    let first = copy.data() as *mut u8;
    // SAFETY: the copy's four bytes, element 0 at `first`, stride -1.
    unsafe {
        assert_eq!([*first, *first.sub(1), *first.sub(2), *first.sub(3)], [4, 3, 2, 1]);
        *first = 99;
    }
    assert_eq!(unsafe { *((region.view().addr + 3) as *const u8) }, 4, "the prefix is untouched");
    assert_eq!(pool.used(), used, "a copy is not charged");
    drop(view);
    assert_eq!(region.views(), 0, "the copy does not hold the region");
    drop(copy);
    let typed = region.to_dlpack(&TensorLayout::new([2], u32s), Default::default()).unwrap();
    let c = dlpack::private_copy(&typed, true).unwrap();
    assert!(c.is_copy() && c.is_read_only() && !c.memory_is_read_only(), "read-only only when asked");
    assert_eq!(c.data() % 64, 0, "a copy is aligned");
}

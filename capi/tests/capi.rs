//! The C API driven from Rust through its `extern "C"` functions, against
//! the real CPU plugin library: every object kind, the status and
//! out-parameter rules, generational handles, callbacks and re-entry.

use memplug_host_capi::*;
use memplug_sdk::abi::{
    MemplugDevice, MEMPLUG_CAP_SHARED_MAPPING, MEMPLUG_CAP_SYNC, MEMPLUG_CAP_VIRTUAL_BACKING,
};
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

mod common;
use common::{last_error, ok, plugin_path};

struct Env {
    m: MemplugHostManager,
    mech: MemplugHostMechanism,
    pool: MemplugHostPool,
    binding: MemplugHostBinding,
}

impl Env {
    fn new(capacity: u64) -> Env {
        unsafe {
            let mut m = MemplugHostManager::default();
            ok(memplug_host_manager_create(&mut m));
            ok(memplug_host_manager_load_plugin(m, plugin_path().as_ptr()));
            let mut mech = MemplugHostMechanism::default();
            let cpu0 = MemplugDevice { kind: 1, ordinal: 0 };
            ok(memplug_host_manager_select(
                m,
                cpu0,
                MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING | MEMPLUG_CAP_SYNC,
                &mut mech,
            ));
            let mut pool = MemplugHostPool::default();
            ok(memplug_host_pool_create(m, c"gpu0".as_ptr(), capacity, &mut pool));
            let mut binding = MemplugHostBinding::default();
            ok(memplug_host_binding_create(m, mech, pool, null(), &mut binding));
            Env { m, mech, pool, binding }
        }
    }

    fn used(&self) -> u64 {
        let mut s =
            MemplugHostPoolStats { struct_size: MEMPLUG_HOST_POOL_STATS_SIZE_1_0, ..Default::default() };
        ok(unsafe { memplug_host_pool_stats(self.pool, &mut s) });
        s.used
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        assert_eq!(memplug_host_manager_destroy(self.m), MemplugHostStatus::Ok);
    }
}

#[test]
fn mechanism_info_describes_the_cpu_plugin() {
    let e = Env::new(1 << 30);
    let mut n = 0usize;
    ok(unsafe { memplug_host_manager_mechanism_count(e.m, &mut n) });
    // "cpu", then what this machine serves of the node and huge-page ones.
    let offered = memplug_plugin_cpu::offers().iter().filter(|o| o.not_offered.is_none()).count();
    assert_eq!(n, offered);
    let mut info = std::mem::MaybeUninit::<MemplugHostMechanismInfo>::zeroed();
    unsafe { (*info.as_mut_ptr()).struct_size = MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0 };
    ok(unsafe { memplug_host_mechanism_info(e.mech, info.as_mut_ptr()) });
    let info = unsafe { info.assume_init() };
    let name = unsafe { std::ffi::CStr::from_ptr(info.name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "cpu");
    assert_eq!(info.capabilities & 0xf, 0xf);
    assert!(info.granularity >= 4096);
    // Found by name too; a second handle is a distinct handle.
    let mut by_name = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(e.m, c"memplug-cpu/cpu".as_ptr(), &mut by_name) });
    assert_ne!(by_name, e.mech);
    ok(memplug_host_mechanism_release(by_name));
    assert_eq!(memplug_host_mechanism_release(by_name), MemplugHostStatus::StaleHandle);
    let mut none = MemplugHostMechanism::default();
    assert_eq!(
        unsafe { memplug_host_manager_find_mechanism(e.m, c"nope".as_ptr(), &mut none) },
        MemplugHostStatus::NotFound
    );
    assert_eq!(none.id, 0, "out-params are written only on success");
}

#[test]
fn allocate_free_and_stale_handles() {
    let e = Env::new(1 << 20);
    let mut a = MemplugHostAllocation::default();
    let mut addr = 0u64;
    ok(unsafe { memplug_host_allocate(e.binding, 1000, 64, &mut a, &mut addr) });
    assert_ne!(addr, 0);
    assert_eq!(addr % 64, 0);
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0xab, 1000) };
    let mut info = MemplugHostAllocationInfo {
        struct_size: MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0,
        ..Default::default()
    };
    ok(unsafe { memplug_host_allocation_info(a, &mut info) });
    assert_eq!(info.addr, addr);
    assert!(info.size >= 1000);
    assert_eq!(e.used(), info.size);
    ok(memplug_host_allocation_free(a));
    assert_eq!(e.used(), 0);
    // Double free: refused, never a second free.
    assert_eq!(memplug_host_allocation_free(a), MemplugHostStatus::StaleHandle);
    assert!(last_error().contains("freed"), "{}", last_error());
    assert_eq!(unsafe { memplug_host_allocation_info(a, &mut info) }, MemplugHostStatus::StaleHandle);
    // A new allocation reuses the slot with a newer generation: the old
    // handle stays stale.
    let mut b = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(e.binding, 10, 8, &mut b, null_mut()) });
    assert_ne!(a, b);
    assert_eq!(memplug_host_allocation_free(a), MemplugHostStatus::StaleHandle);
    ok(memplug_host_allocation_free(b));
    // The zero handle is a no-op; forged handles are refused.
    ok(memplug_host_allocation_free(MemplugHostAllocation::default()));
    let forged = MemplugHostAllocation { id: b.id ^ (1 << 40) };
    assert_eq!(memplug_host_allocation_free(forged), MemplugHostStatus::InvalidHandle);
    assert_eq!(
        memplug_host_allocation_free(MemplugHostAllocation { id: e.binding.id }),
        MemplugHostStatus::InvalidHandle,
        "a binding handle is not an allocation handle"
    );
    assert_eq!(
        memplug_host_allocation_free(MemplugHostAllocation { id: u64::MAX }),
        MemplugHostStatus::InvalidHandle
    );
}

#[test]
fn budget_and_bad_sizes_are_refused_with_codes() {
    let e = Env::new(1 << 16);
    let mut a = MemplugHostAllocation::default();
    assert_eq!(
        unsafe { memplug_host_allocate(e.binding, 1 << 20, 16, &mut a, null_mut()) },
        MemplugHostStatus::OutOfBudget
    );
    assert_eq!(a.id, 0);
    assert_eq!(
        unsafe { memplug_host_allocate(e.binding, u64::MAX, 16, &mut a, null_mut()) },
        MemplugHostStatus::OutOfBudget
    );
    assert_ne!(
        unsafe { memplug_host_allocate(e.binding, 64, 3, &mut a, null_mut()) },
        MemplugHostStatus::Ok,
        "a non-power-of-two alignment"
    );
    assert_eq!(a.id, 0);
    assert_eq!(e.used(), 0, "every failure returned its grant");
    assert_eq!(
        unsafe { memplug_host_allocate(e.binding, 64, 16, null_mut(), null_mut()) },
        MemplugHostStatus::NullArgument
    );
}

#[test]
fn handles_of_another_manager_are_refused() {
    let e1 = Env::new(1 << 20);
    let e2 = Env::new(1 << 20);
    let mut b = MemplugHostBinding::default();
    assert_eq!(
        unsafe { memplug_host_binding_create(e1.m, e2.mech, e1.pool, null(), &mut b) },
        MemplugHostStatus::WrongManager
    );
    assert_eq!(
        unsafe { memplug_host_binding_create(e1.m, e1.mech, e2.pool, null(), &mut b) },
        MemplugHostStatus::WrongManager
    );
    assert_eq!(b.id, 0);
    // A fence of manager 2 cannot order a free of manager 1.
    let mut s = MemplugHostStream::default();
    ok(unsafe { memplug_host_stream_create(e2.mech, &mut s) });
    let mut f = MemplugHostFence::default();
    ok(unsafe { memplug_host_fence_record(s, &mut f) });
    let mut a = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(e1.binding, 64, 16, &mut a, null_mut()) });
    assert_eq!(unsafe { memplug_host_allocation_free_after(a, &f, 1) }, MemplugHostStatus::WrongManager);
    ok(memplug_host_allocation_free(a));
    ok(memplug_host_fence_release(f));
    ok(memplug_host_stream_destroy(s));
}

#[test]
fn destroyed_managers_leave_only_stale_handles() {
    let mut a = MemplugHostAllocation::default();
    let (m, binding) = {
        let e = Env::new(1 << 20);
        ok(unsafe { memplug_host_allocate(e.binding, 64, 16, &mut a, null_mut()) });
        let r = (e.m, e.binding);
        drop(e); // destroys the manager with the allocation alive
        r
    };
    assert_eq!(memplug_host_allocation_free(a), MemplugHostStatus::StaleHandle);
    assert_eq!(
        unsafe { memplug_host_allocate(binding, 64, 16, &mut a, null_mut()) },
        MemplugHostStatus::StaleHandle
    );
    assert_eq!(memplug_host_manager_destroy(m), MemplugHostStatus::StaleHandle);
    ok(memplug_host_manager_destroy(MemplugHostManager::default()));
    // A new manager in the same slot does not revive old handles.
    let e = Env::new(1 << 20);
    assert_eq!(memplug_host_allocation_free(a), MemplugHostStatus::StaleHandle);
    assert_eq!(
        unsafe { memplug_host_allocate(binding, 64, 16, &mut a, null_mut()) },
        MemplugHostStatus::StaleHandle
    );
    drop(e);
}

struct Kv {
    allocs: std::sync::Mutex<Vec<MemplugHostAllocation>>,
    tickets: AtomicUsize,
    lie: bool,
}

unsafe extern "C" fn evict(userdata: *mut c_void, ticket: *const MemplugHostPressureTicket) -> u64 {
    let kv = unsafe { &*(userdata as *const Kv) };
    let t = unsafe { &*ticket };
    kv.tickets.fetch_add(1, Ordering::SeqCst);
    if kv.lie {
        return u64::MAX;
    }
    let mut freed = 0;
    let mut allocs = kv.allocs.lock().unwrap();
    while freed < t.bytes_wanted {
        let Some(a) = allocs.pop() else { break };
        let mut info = MemplugHostAllocationInfo {
            struct_size: MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0,
            ..Default::default()
        };
        assert_eq!(unsafe { memplug_host_allocation_info(a, &mut info) }, MemplugHostStatus::Ok);
        // Re-entering the API from the callback: allowed for frees.
        assert_eq!(memplug_host_allocation_free(a), MemplugHostStatus::Ok);
        freed += info.size;
    }
    // Destroying the manager from here is refused.
    freed
}

fn holder_env(kv: &Kv) -> (Env, MemplugHostHolder, MemplugHostBinding) {
    let e = Env::new(64 * 1024);
    let mut h = MemplugHostHolder::default();
    ok(unsafe {
        memplug_host_holder_register(
            e.pool,
            c"kv".as_ptr(),
            MEMPLUG_HOST_PRIORITY_LOWEST,
            Some(evict),
            kv as *const Kv as *mut c_void,
            &mut h,
        )
    });
    let opts = MemplugHostBindingOptions {
        struct_size: MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0,
        alloc_class: MEMPLUG_HOST_CLASS_KV,
        holder: h,
        wait_ns: 0,
        ..Default::default()
    };
    let mut kvb = MemplugHostBinding::default();
    ok(unsafe { memplug_host_binding_create(e.m, e.mech, e.pool, &opts, &mut kvb) });
    (e, h, kvb)
}

#[test]
fn pressure_tickets_reach_the_holder_which_frees_through_the_api() {
    let kv = Kv { allocs: Default::default(), tickets: AtomicUsize::new(0), lie: false };
    let (e, h, kvb) = holder_env(&kv);
    for _ in 0..16 {
        let mut a = MemplugHostAllocation::default();
        ok(unsafe { memplug_host_allocate(kvb, 4096, 64, &mut a, null_mut()) });
        kv.allocs.lock().unwrap().push(a);
    }
    assert_eq!(e.used(), 64 * 1024);
    // A request for no holder (highest priority) asks the KV holder.
    let mut big = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(e.binding, 3 * 4096, 64, &mut big, null_mut()) });
    assert_eq!(kv.tickets.load(Ordering::SeqCst), 1);
    let mut hs =
        MemplugHostHolderStats { struct_size: MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_holder_stats(h, &mut hs) });
    assert_eq!(hs.tickets, 1);
    assert_eq!(hs.bytes_answered, 3 * 4096);
    assert_eq!(hs.nonsense_answers, 0);
    assert_eq!(hs.leased, 13 * 4096);
    let mut cs =
        MemplugHostClassStats { struct_size: MEMPLUG_HOST_CLASS_STATS_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_pool_class_stats(e.pool, MEMPLUG_HOST_CLASS_KV, &mut cs) });
    assert_eq!(cs.leased, 13 * 4096);
    assert_eq!(
        unsafe { memplug_host_pool_class_stats(e.pool, 99, &mut cs) },
        MemplugHostStatus::InvalidArgument
    );
    ok(memplug_host_allocation_free(big));
    for a in kv.allocs.lock().unwrap().drain(..) {
        ok(memplug_host_allocation_free(a));
    }
    ok(memplug_host_holder_unregister(h));
    assert_eq!(memplug_host_holder_unregister(h), MemplugHostStatus::StaleHandle);
    ok(memplug_host_binding_destroy(kvb));
}

#[test]
fn nonsense_answers_are_clamped_and_counted() {
    let kv = Kv { allocs: Default::default(), tickets: AtomicUsize::new(0), lie: true };
    let (e, h, kvb) = holder_env(&kv);
    let mut a = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(kvb, 60 * 1024, 64, &mut a, null_mut()) });
    let mut big = MemplugHostAllocation::default();
    assert_eq!(
        unsafe { memplug_host_allocate(e.binding, 8 * 1024, 64, &mut big, null_mut()) },
        MemplugHostStatus::OutOfBudget,
        "a lie frees nothing"
    );
    let mut hs =
        MemplugHostHolderStats { struct_size: MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_holder_stats(h, &mut hs) });
    assert_eq!(hs.nonsense_answers, 1);
    assert!(hs.bytes_answered <= 64 * 1024);
    ok(memplug_host_allocation_free(a));
    ok(memplug_host_binding_destroy(kvb));
}

unsafe extern "C" fn destroy_from_callback(
    userdata: *mut c_void,
    _t: *const MemplugHostPressureTicket,
) -> u64 {
    let m = unsafe { *(userdata as *const MemplugHostManager) };
    let s = memplug_host_manager_destroy(m);
    DESTROY_RESULT.store(s as u64, Ordering::SeqCst);
    0
}

static DESTROY_RESULT: AtomicU64 = AtomicU64::new(0);
static REGROW_RESULT: AtomicU64 = AtomicU64::new(0);

#[test]
fn destroying_the_manager_from_a_callback_is_refused() {
    let e = Env::new(64 * 1024);
    let mut h = MemplugHostHolder::default();
    let m = e.m;
    ok(unsafe {
        memplug_host_holder_register(
            e.pool,
            c"h".as_ptr(),
            0,
            Some(destroy_from_callback),
            &m as *const _ as *mut c_void,
            &mut h,
        )
    });
    let mut a = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(e.binding, 60 * 1024, 16, &mut a, null_mut()) });
    let mut b = MemplugHostAllocation::default();
    assert_eq!(
        unsafe { memplug_host_allocate(e.binding, 8 * 1024, 16, &mut b, null_mut()) },
        MemplugHostStatus::OutOfBudget
    );
    assert_eq!(DESTROY_RESULT.load(Ordering::SeqCst), MemplugHostStatus::Reentrant as u64);
    ok(memplug_host_allocation_free(a));
}

unsafe extern "C" fn fill(userdata: *mut c_void, addr: u64, len: u64) {
    let byte = userdata as usize as u8;
    unsafe { std::ptr::write_bytes(addr as *mut u8, byte, len as usize) };
}

unsafe extern "C" fn accept(userdata: *mut c_void, _addr: u64, len: u64) -> bool {
    unsafe { *(userdata as *mut u64) = len };
    true
}

unsafe extern "C" fn refuse(_u: *mut c_void, _a: u64, _l: u64) -> bool {
    false
}

unsafe extern "C" fn regrow_same(userdata: *mut c_void, _a: u64, _l: u64) -> bool {
    let r = unsafe { *(userdata as *const MemplugHostRegion) };
    let s = unsafe { memplug_host_region_grow(r, 1 << 30, None, null_mut()) };
    REGROW_RESULT.store(s as u64, Ordering::SeqCst);
    true
}

fn region_info(r: MemplugHostRegion) -> MemplugHostRegionInfo {
    let mut i =
        MemplugHostRegionInfo { struct_size: MEMPLUG_HOST_REGION_INFO_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_region_info(r, &mut i) });
    i
}

#[test]
fn regions_grow_shrink_and_map_a_shared_prefix() {
    let e = Env::new(64 << 20);
    unsafe {
        let mut p = MemplugHostPrefix::default();
        ok(memplug_host_prefix_create(e.binding, 10_000, Some(fill), 0x5a as *mut c_void, &mut p));
        let mut pi =
            MemplugHostPrefixInfo { struct_size: MEMPLUG_HOST_PREFIX_INFO_SIZE_1_0, ..Default::default() };
        ok(memplug_host_prefix_info(p, &mut pi));
        assert!(pi.len >= 10_000);
        assert_eq!(pi.charged, pi.len);

        let mut r = MemplugHostRegion::default();
        ok(memplug_host_region_reserve(e.binding, 16 << 20, &mut r));
        ok(memplug_host_region_map_prefix(r, p));
        // A region that already has a prefix is in the wrong state for
        // another (memplug_host.h names INVALID_STATE; so does the code).
        assert_eq!(memplug_host_region_map_prefix(r, p), MemplugHostStatus::InvalidState);
        let i = region_info(r);
        assert_eq!(i.prefix_len, pi.len);
        assert_eq!(*(i.addr as *const u8), 0x5a);
        // Prefix charged once, whatever maps it.
        assert_eq!(e.used(), pi.len);

        let mut seen = 0u64;
        ok(memplug_host_region_grow(
            r,
            pi.len + (1 << 20),
            Some(accept),
            &mut seen as *mut u64 as *mut c_void,
        ));
        let i2 = region_info(r);
        assert_eq!(i2.addr, i.addr, "the base never moves");
        assert_eq!(seen, i2.len);
        assert_eq!(i2.committed, 1 << 20);
        *((i2.addr + i2.len - 1) as *mut u8) = 7;
        assert_eq!(e.used(), pi.len + (1 << 20));

        // A refused update leaves the region as it was.
        assert_eq!(
            memplug_host_region_grow(r, pi.len + (2 << 20), Some(refuse), null_mut()),
            MemplugHostStatus::CallbackRefused
        );
        assert_eq!(region_info(r).committed, 1 << 20);
        assert_eq!(e.used(), pi.len + (1 << 20));
        // Re-entering the same region from its grow callback is refused.
        ok(memplug_host_region_grow(r, pi.len + (2 << 20), Some(regrow_same), &r as *const _ as *mut c_void));
        assert_eq!(REGROW_RESULT.load(Ordering::SeqCst), MemplugHostStatus::Reentrant as u64);
        // Beyond the reservation.
        assert_eq!(
            memplug_host_region_grow(r, 1 << 40, None, null_mut()),
            MemplugHostStatus::InvalidArgument
        );

        ok(memplug_host_region_shrink(r, pi.len, null(), 0));
        assert_eq!(region_info(r).committed, 0);
        assert_eq!(e.used(), pi.len);

        // The region keeps the prefix alive after its handle goes.
        ok(memplug_host_prefix_release(p));
        assert_eq!(e.used(), pi.len);
        ok(memplug_host_region_free(r));
        assert_eq!(e.used(), 0);
        assert_eq!(memplug_host_region_free(r), MemplugHostStatus::StaleHandle);
    }
}

unsafe extern "C" fn flag_query(userdata: *mut c_void) -> bool {
    unsafe { (*(userdata as *const AtomicU64)).load(Ordering::SeqCst) != 0 }
}

unsafe extern "C" fn flag_release(userdata: *mut c_void) {
    unsafe { (*(userdata as *const AtomicU64)).fetch_add(10, Ordering::SeqCst) };
}

#[test]
fn frees_wait_for_runtime_fences() {
    let e = Env::new(1 << 20);
    let flag = AtomicU64::new(0);
    let mut f = MemplugHostFence::default();
    ok(unsafe {
        memplug_host_fence_from_callbacks(
            e.m,
            c"event".as_ptr(),
            Some(flag_query),
            None,
            Some(flag_release),
            &flag as *const _ as *mut c_void,
            &mut f,
        )
    });
    let mut a = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(e.binding, 4096, 64, &mut a, null_mut()) });
    ok(unsafe { memplug_host_allocation_free_after(a, &f, 1) });
    assert_eq!(memplug_host_allocation_free(a), MemplugHostStatus::StaleHandle);
    assert_eq!(e.used(), 4096, "not freed before the fence");
    let mut report =
        MemplugHostPollReport { struct_size: MEMPLUG_HOST_POLL_REPORT_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_manager_poll(e.m, &mut report) });
    assert_eq!((report.retired, report.pending), (0, 1));
    flag.store(1, Ordering::SeqCst);
    let mut done = false;
    ok(unsafe { memplug_host_fence_wait(f, 1_000_000, &mut done) });
    assert!(done);
    ok(unsafe { memplug_host_manager_poll(e.m, &mut report) });
    assert_eq!((report.retired, report.pending), (1, 0));
    assert_eq!(e.used(), 0);
    ok(memplug_host_fence_release(f));
    assert_eq!(flag.load(Ordering::SeqCst), 11, "release ran once, after the last reference");
}

unsafe extern "C" fn sleep_ms(userdata: *mut c_void) {
    std::thread::sleep(std::time::Duration::from_millis(userdata as u64));
}

#[test]
fn frees_wait_for_plugin_fences_on_a_plugin_stream() {
    let e = Env::new(1 << 20);
    let mut s = MemplugHostStream::default();
    ok(unsafe { memplug_host_stream_create(e.mech, &mut s) });
    ok(unsafe { memplug_host_stream_enqueue(s, Some(sleep_ms), 50 as *mut c_void) });
    let mut f = MemplugHostFence::default();
    ok(unsafe { memplug_host_fence_record(s, &mut f) });
    let mut a = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(e.binding, 4096, 64, &mut a, null_mut()) });
    ok(unsafe { memplug_host_allocation_free_after(a, &f, 1) });
    let mut done = true;
    ok(unsafe { memplug_host_fence_query(f, &mut done) });
    assert!(!done);
    assert_eq!(e.used(), 4096);
    ok(unsafe { memplug_host_fence_wait(f, 5_000_000_000, &mut done) });
    assert!(done);
    let mut left = 1u64;
    ok(unsafe { memplug_host_manager_drain(e.m, 1_000_000_000, &mut left) });
    assert_eq!(left, 0);
    assert_eq!(e.used(), 0);
    ok(memplug_host_fence_release(f));
    ok(memplug_host_stream_destroy(s));
}

#[test]
fn unload_is_refused_while_objects_live() {
    let e = Env::new(1 << 20);
    assert_eq!(
        unsafe { memplug_host_manager_unload_plugin(e.m, c"memplug-cpu".as_ptr()) },
        MemplugHostStatus::Busy
    );
    assert!(last_error().contains("pinned"), "{}", last_error());
    assert_eq!(
        unsafe { memplug_host_manager_load_plugin(e.m, c"/nonexistent/libx.so".as_ptr()) },
        MemplugHostStatus::LoadFailed
    );
    assert_eq!(
        unsafe { memplug_host_manager_load_plugin(e.m, plugin_path().as_ptr()) },
        MemplugHostStatus::AlreadyExists
    );
}

#[test]
fn many_threads_share_one_binding() {
    let e = Env::new(1 << 30);
    let b = e.binding;
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(move || {
                let mut live = Vec::new();
                for i in 0..2000u64 {
                    let mut a = MemplugHostAllocation::default();
                    ok(unsafe { memplug_host_allocate(b, 64 + i % 512, 16, &mut a, null_mut()) });
                    live.push(a);
                    if i % 2 == 0 {
                        ok(memplug_host_allocation_free(live.swap_remove(0)));
                    }
                }
                for a in live {
                    ok(memplug_host_allocation_free(a));
                }
            });
        }
    });
    assert_eq!(e.used(), 0);
}

#[test]
fn stats_text_follows_the_buffer_protocol() {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    // Asking for the size: NULL and 0.
    let mut need = 0usize;
    let s = unsafe { memplug_host_stats_json(m, null_mut(), 0, &mut need) };
    assert_eq!(s, MemplugHostStatus::BufferTooSmall, "{}", last_error());
    assert!(need > 1);
    // One byte short (no room for the NUL): nothing written.
    let mut buf = vec![0x55u8; need];
    let mut written = 0usize;
    let s = unsafe { memplug_host_stats_json(m, buf.as_mut_ptr().cast(), need - 1, &mut written) };
    assert_eq!(s, MemplugHostStatus::BufferTooSmall);
    assert_eq!(written, need, "the capacity needed, NUL included");
    assert!(buf.iter().all(|&b| b == 0x55), "nothing written to a short buffer");
    // Enough: the text, a NUL, and its length without the NUL.
    ok(unsafe { memplug_host_stats_json(m, buf.as_mut_ptr().cast(), need, &mut written) });
    assert_eq!(written, need - 1);
    assert_eq!(buf[written], 0);
    assert!(std::str::from_utf8(&buf[..written]).unwrap().starts_with("{\"schema_version\":"));
    // A non-zero capacity with a NULL buffer is a NULL argument.
    assert_eq!(
        unsafe { memplug_host_stats_json(m, null_mut(), 8, &mut written) },
        MemplugHostStatus::NullArgument
    );
    ok(memplug_host_manager_destroy(m));
}

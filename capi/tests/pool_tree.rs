//! Nested pools through the C API, against the real CPU plugin library:
//! `memplug_host_pool_create_child`, charges at every level,
//! `memplug_host_pool_set_capacity` (raise, lower, refuse with BUSY and the
//! live bytes in the message), `memplug_host_pool_info` and
//! `memplug_host_pool_parent`, pressure under the short pool.

use memplug_host_capi::*;
use memplug_sdk::abi::MemplugDevice;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const KIB: u64 = 1024;

mod common;
use common::{last_error, ok, plugin_path};

/// A manager with the CPU plugin and process (256 KiB) > gpu0 (128 KiB) >
/// tenant (96 KiB), a binding on the tenant and one on gpu0.
struct Tree {
    m: MemplugHostManager,
    mech: MemplugHostMechanism,
    process: MemplugHostPool,
    gpu: MemplugHostPool,
    tenant: MemplugHostPool,
    on_tenant: MemplugHostBinding,
    on_gpu: MemplugHostBinding,
}

impl Tree {
    fn new() -> Tree {
        unsafe {
            let mut m = MemplugHostManager::default();
            ok(memplug_host_manager_create(&mut m));
            ok(memplug_host_manager_load_plugin(m, plugin_path().as_ptr()));
            let mut mech = MemplugHostMechanism::default();
            ok(memplug_host_manager_select(m, MemplugDevice { kind: 1, ordinal: 0 }, 0, &mut mech));
            let (mut process, mut gpu, mut tenant) = Default::default();
            ok(memplug_host_pool_create(m, c"process".as_ptr(), 256 * KIB, &mut process));
            ok(memplug_host_pool_create_child(m, process, c"gpu0".as_ptr(), 128 * KIB, &mut gpu));
            ok(memplug_host_pool_create_child(m, gpu, c"tenant".as_ptr(), 96 * KIB, &mut tenant));
            let (mut on_tenant, mut on_gpu) = Default::default();
            ok(memplug_host_binding_create(m, mech, tenant, null(), &mut on_tenant));
            ok(memplug_host_binding_create(m, mech, gpu, null(), &mut on_gpu));
            Tree { m, mech, process, gpu, tenant, on_tenant, on_gpu }
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        assert_eq!(memplug_host_manager_destroy(self.m), MemplugHostStatus::Ok);
    }
}

fn info(pool: MemplugHostPool) -> MemplugHostPoolInfo {
    let mut i = std::mem::MaybeUninit::<MemplugHostPoolInfo>::zeroed();
    unsafe {
        (*i.as_mut_ptr()).struct_size = std::mem::size_of::<MemplugHostPoolInfo>() as u32;
        ok(memplug_host_pool_info(pool, i.as_mut_ptr()));
        i.assume_init()
    }
}

fn name(field: &[std::ffi::c_char]) -> String {
    unsafe { CStr::from_ptr(field.as_ptr()) }.to_str().unwrap().to_owned()
}

fn used(pool: MemplugHostPool) -> u64 {
    let mut s = MemplugHostPoolStats { struct_size: MEMPLUG_HOST_POOL_STATS_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_pool_stats(pool, &mut s) });
    s.used
}

fn allocate(b: MemplugHostBinding, size: u64) -> Result<MemplugHostAllocation, MemplugHostStatus> {
    let mut a = MemplugHostAllocation::default();
    match unsafe { memplug_host_allocate(b, size, 64, &mut a, null_mut()) } {
        MemplugHostStatus::Ok => Ok(a),
        s => Err(s),
    }
}

#[test]
fn a_child_pool_charges_every_level_and_reports_its_parent() {
    let t = Tree::new();
    let a = allocate(t.on_tenant, 64 * KIB).unwrap();
    assert_eq!((used(t.tenant), used(t.gpu), used(t.process)), (64 * KIB, 64 * KIB, 64 * KIB));
    let g = allocate(t.on_gpu, 16 * KIB).unwrap();
    assert_eq!((used(t.tenant), used(t.gpu), used(t.process)), (64 * KIB, 80 * KIB, 80 * KIB));

    let (ti, gi, pi) = (info(t.tenant), info(t.gpu), info(t.process));
    assert_eq!(ti.struct_size, MEMPLUG_HOST_POOL_INFO_SIZE_1_0);
    assert_eq!((ti.depth, gi.depth, pi.depth), (2, 1, 0));
    assert_eq!((ti.parent_id, gi.parent_id, pi.parent_id), (gi.pool_id, pi.pool_id, 0));
    assert_eq!((name(&ti.name), name(&ti.parent_name)), ("tenant".to_owned(), "gpu0".to_owned()));
    assert_eq!(name(&pi.parent_name), "");
    assert_eq!(
        (gi.capacity, gi.used, gi.free, gi.children_used, gi.children),
        (128 * KIB, 80 * KIB, 48 * KIB, 64 * KIB, 1)
    );
    assert_eq!((pi.used, pi.children_used, pi.children), (80 * KIB, 80 * KIB, 1));

    // The parent's handle: a new handle the caller owns; none for the root.
    let mut parent = MemplugHostPool::default();
    ok(unsafe { memplug_host_pool_parent(t.tenant, &mut parent) });
    assert_eq!(info(parent).pool_id, gi.pool_id);
    ok(memplug_host_pool_release(parent));
    let mut none = MemplugHostPool::default();
    assert_eq!(unsafe { memplug_host_pool_parent(t.process, &mut none) }, MemplugHostStatus::NotFound);
    assert_eq!(none.id, 0, "out untouched on failure");

    // A short ancestor refuses with OUT_OF_BUDGET and says which level.
    assert_eq!(allocate(t.on_tenant, 32 * KIB + 4 * KIB).unwrap_err(), MemplugHostStatus::OutOfBudget);
    assert!(last_error().contains("short in 'tenant'"), "{}", last_error());
    let big = allocate(t.on_gpu, 40 * KIB).unwrap(); // gpu0: 120 of 128
    assert_eq!(allocate(t.on_tenant, 16 * KIB).unwrap_err(), MemplugHostStatus::OutOfBudget);
    assert!(last_error().contains("short in 'gpu0'"), "{}", last_error());
    assert_eq!(used(t.tenant), 64 * KIB, "the refused charge left nothing behind");

    // A short struct_size is refused; a 1.0-sized one gets exactly that.
    let mut short = info(t.gpu);
    short.struct_size = 8;
    assert_eq!(unsafe { memplug_host_pool_info(t.gpu, &mut short) }, MemplugHostStatus::InvalidArgument);
    assert_eq!(unsafe { memplug_host_pool_info(t.gpu, null_mut()) }, MemplugHostStatus::NullArgument);

    for x in [a, g, big] {
        ok(memplug_host_allocation_free(x));
    }
    assert_eq!((used(t.tenant), used(t.gpu), used(t.process)), (0, 0, 0));
}

#[test]
fn create_child_checks_its_arguments() {
    let t = Tree::new();
    let mut p = MemplugHostPool::default();
    unsafe {
        assert_eq!(
            memplug_host_pool_create_child(t.m, t.gpu, c"tenant".as_ptr(), 1, &mut p),
            MemplugHostStatus::AlreadyExists
        );
        assert_eq!(
            memplug_host_pool_create_child(t.m, t.gpu, c"huge".as_ptr(), u64::MAX, &mut p),
            MemplugHostStatus::OutOfRange
        );
        assert_eq!(
            memplug_host_pool_create_child(t.m, t.gpu, null(), 1, &mut p),
            MemplugHostStatus::NullArgument
        );
        assert_eq!(
            memplug_host_pool_create_child(t.m, MemplugHostPool::default(), c"x".as_ptr(), 1, &mut p),
            MemplugHostStatus::InvalidHandle
        );
        // A parent of another manager.
        let mut other = MemplugHostManager::default();
        ok(memplug_host_manager_create(&mut other));
        let mut foreign = MemplugHostPool::default();
        ok(memplug_host_pool_create(other, c"foreign".as_ptr(), 1024, &mut foreign));
        assert_eq!(
            memplug_host_pool_create_child(t.m, foreign, c"x".as_ptr(), 1, &mut p),
            MemplugHostStatus::WrongManager
        );
        ok(memplug_host_manager_destroy(other));
        // A released parent handle is stale, but the pool lives on under
        // its child.
        let mut dev = MemplugHostPool::default();
        ok(memplug_host_pool_create_child(t.m, t.process, c"gpu1".as_ptr(), 64 * KIB, &mut dev));
        let mut child = MemplugHostPool::default();
        ok(memplug_host_pool_create_child(t.m, dev, c"gpu1/a".as_ptr(), 512 * KIB, &mut child));
        let dev_id = info(dev).pool_id;
        ok(memplug_host_pool_release(dev));
        assert_eq!(
            memplug_host_pool_create_child(t.m, dev, c"y".as_ptr(), 1, &mut p),
            MemplugHostStatus::StaleHandle
        );
        let mut b = MemplugHostBinding::default();
        ok(memplug_host_binding_create(t.m, t.mech, child, null(), &mut b));
        // Over-subscribed: the child (512 KiB) is bounded by gpu1 (64 KiB).
        assert_eq!(allocate(b, 68 * KIB).unwrap_err(), MemplugHostStatus::OutOfBudget);
        assert!(last_error().contains("short in 'gpu1'"), "{}", last_error());
        let a = allocate(b, 64 * KIB).unwrap();
        assert_eq!(used(t.process), 64 * KIB);
        assert_eq!((info(child).parent_id, name(&info(child).parent_name)), (dev_id, "gpu1".to_owned()));
        ok(memplug_host_allocation_free(a));
        ok(memplug_host_pool_release(child));
    }
}

#[test]
fn set_capacity_raises_lowers_and_refuses_with_busy_naming_the_live_bytes() {
    let t = Tree::new();
    let a = allocate(t.on_tenant, 64 * KIB).unwrap();
    // Raising always works.
    ok(memplug_host_pool_set_capacity(t.tenant, 200 * KIB));
    assert_eq!(info(t.tenant).capacity, 200 * KIB);
    // Lowering to what is live works at once.
    ok(memplug_host_pool_set_capacity(t.tenant, 64 * KIB));
    assert_eq!((info(t.tenant).capacity, info(t.tenant).free), (64 * KIB, 0));
    assert_eq!(allocate(t.on_tenant, 4 * KIB).unwrap_err(), MemplugHostStatus::OutOfBudget);
    // Below live (no holder to ask): BUSY, the capacity stays, the message
    // says how much is live.
    assert_eq!(memplug_host_pool_set_capacity(t.gpu, 32 * KIB), MemplugHostStatus::Busy);
    let msg = last_error();
    assert!(msg.contains(&format!("{} B are live", 64 * KIB)), "{msg}");
    assert_eq!(info(t.gpu).capacity, 128 * KIB);
    assert_eq!(memplug_host_pool_set_capacity(t.gpu, u64::MAX), MemplugHostStatus::OutOfRange);
    assert_eq!(
        memplug_host_pool_set_capacity(MemplugHostPool::default(), 1),
        MemplugHostStatus::InvalidHandle
    );
    ok(memplug_host_allocation_free(a));
    ok(memplug_host_pool_set_capacity(t.gpu, 32 * KIB));
    assert_eq!(info(t.gpu).capacity, 32 * KIB);
}

/// A holder of the tenant that frees its allocations when asked.
struct Stash {
    allocs: Mutex<Vec<MemplugHostAllocation>>,
    tickets: AtomicUsize,
    pools: Mutex<Vec<u64>>,
}

unsafe extern "C" fn free_all(userdata: *mut c_void, t: *const MemplugHostPressureTicket) -> u64 {
    let stash = unsafe { &*(userdata as *const Stash) };
    let t = unsafe { &*t };
    stash.tickets.fetch_add(1, Ordering::SeqCst);
    stash.pools.lock().unwrap().push(t.pool.id);
    let mut freed = 0;
    for a in stash.allocs.lock().unwrap().drain(..) {
        let mut i = MemplugHostAllocationInfo {
            struct_size: MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0,
            ..Default::default()
        };
        assert_eq!(unsafe { memplug_host_allocation_info(a, &mut i) }, MemplugHostStatus::Ok);
        assert_eq!(memplug_host_allocation_free(a), MemplugHostStatus::Ok);
        freed += i.size;
    }
    freed
}

#[test]
fn a_short_parent_and_a_lowering_send_tickets_to_the_holders_of_the_child() {
    let t = Tree::new();
    let stash = Stash { allocs: Mutex::default(), tickets: AtomicUsize::new(0), pools: Mutex::default() };
    let mut h = MemplugHostHolder::default();
    ok(unsafe {
        memplug_host_holder_register(
            t.tenant,
            c"tenant-kv".as_ptr(),
            MEMPLUG_HOST_PRIORITY_LOWEST,
            Some(free_all),
            &stash as *const Stash as *mut c_void,
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
    let mut kv = MemplugHostBinding::default();
    ok(unsafe { memplug_host_binding_create(t.m, t.mech, t.tenant, &opts, &mut kv) });
    for _ in 0..8 {
        stash.allocs.lock().unwrap().push(allocate(kv, 8 * KIB).unwrap());
    }
    // gpu0: 64 of 128 KiB through the tenant. 96 KiB on gpu0 itself is
    // short in gpu0: the tenant's holder (under gpu0) is asked and frees.
    let big = allocate(t.on_gpu, 96 * KIB).unwrap();
    assert_eq!(stash.tickets.load(Ordering::SeqCst), 1);
    assert_eq!((used(t.tenant), used(t.gpu)), (0, 96 * KIB));
    ok(memplug_host_allocation_free(big));

    // Lowering the process limit below what is live asks the same holder.
    for _ in 0..4 {
        stash.allocs.lock().unwrap().push(allocate(kv, 8 * KIB).unwrap());
    }
    ok(memplug_host_pool_set_capacity(t.process, 16 * KIB));
    assert_eq!(stash.tickets.load(Ordering::SeqCst), 2);
    assert_eq!((used(t.process), info(t.process).capacity), (0, 16 * KIB));
    // The ticket names the holder's own pool handle.
    assert!(stash.pools.lock().unwrap().iter().all(|&p| p == t.tenant.id));
    let mut hs =
        MemplugHostHolderStats { struct_size: MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_holder_stats(h, &mut hs) });
    assert_eq!((hs.tickets, hs.bytes_answered), (2, 96 * KIB));
    ok(memplug_host_holder_unregister(h));
    ok(memplug_host_binding_destroy(kv));
}

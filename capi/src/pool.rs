//! Pools and holders (pressure callbacks).

use crate::callbacks::{CallbackScope, UserData};
use crate::common::{
    name_field, MemplugHostHolder, MemplugHostManager, MemplugHostPool, MEMPLUG_HOST_NAME_MAX,
};
use crate::error::{boundary, c_str, require_non_null, write_out, Error, Result};
use crate::handle::Kind;
use crate::manager_tables::{self, pin, pin_manager, same_manager, HolderEntry, HolderShared, PoolEntry};
use crate::status::MemplugHostStatus;
use crate::struct_size::write_sized;
use memplug_host_dep::governor::{GovernorError, PressureTicket, Priority};
use memplug_host_dep::ManagerError;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Creates a pool of `capacity` bytes for one physical memory domain.
/// Names are unique per manager (`MEMPLUG_HOST_STATUS_ALREADY_EXISTS`);
/// a capacity the governor cannot represent is `_OUT_OF_RANGE`.
///
/// Ownership: the caller owns the handle (`memplug_host_pool_release`).
/// Thread-safety: any thread; a pool may be used from any thread.
///
/// # Safety
/// `name` must be NULL or NUL-terminated; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_create(
    manager: MemplugHostManager,
    name: *const c_char,
    capacity: u64,
    out: *mut MemplugHostPool,
) -> MemplugHostStatus {
    boundary("memplug_host_pool_create", || {
        // SAFETY: the caller's contract.
        let name = unsafe { c_str(name, "name") }?;
        require_non_null(out, "out")?;
        let (m, seat) = pin_manager(manager.id)?;
        let pool = m.pm.create_pool(name, capacity)?;
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, PoolEntry { pool }, [0, 0], out, |id| MemplugHostPool { id }) }
    })
}

/// Creates a pool of `capacity` bytes under `parent_pool` (a pool of the
/// same manager): a per-tenant or per-model budget inside a device pool, a
/// device pool under a process-wide limit. Every charge made in the new
/// pool (by bindings, allocations, regions, prefixes) must fit in it and in
/// every ancestor, and is charged at each level: the parent's `used`
/// includes its children's charges. A refusal
/// (`MEMPLUG_HOST_STATUS_OUT_OF_BUDGET`) says in its message which level was
/// short; pressure tickets go to the holders registered under the pool that
/// is short (that pool and every pool below it), lowest priority first. A
/// child's capacity may exceed its parent's: the smaller limit binds.
///
/// Statuses: `MEMPLUG_HOST_STATUS_ALREADY_EXISTS` for a name taken in this
/// manager, `_OUT_OF_RANGE` for a capacity the governor cannot represent,
/// `_WRONG_MANAGER` for a parent of another manager, `_NULL_ARGUMENT`,
/// `_INVALID_HANDLE` and `_STALE_HANDLE` as usual.
///
/// Ownership: the caller owns the new handle (`memplug_host_pool_release`);
/// the child keeps its parent pool alive, whatever becomes of the parent's
/// handle. Thread-safety: any thread.
///
/// # Safety
/// `name` must be NULL or NUL-terminated; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_create_child(
    manager: MemplugHostManager,
    parent_pool: MemplugHostPool,
    name: *const c_char,
    capacity: u64,
    out: *mut MemplugHostPool,
) -> MemplugHostStatus {
    boundary("memplug_host_pool_create_child", || {
        // SAFETY: the caller's contract.
        let name = unsafe { c_str(name, "name") }?;
        require_non_null(out, "out")?;
        let (m, seat) = pin_manager(manager.id)?;
        let (parent, _) = pin::<PoolEntry>(parent_pool.id)?;
        same_manager(seat, parent_pool.id, Kind::Pool)?;
        let pool = m.pm.create_child_pool(name, &parent.pool, capacity).map_err(|e| match e {
            ManagerError::Governor(GovernorError::UnknownPool { .. }) => {
                Error::new(MemplugHostStatus::WrongManager, "the parent pool belongs to another manager")
            }
            e => e.into(),
        })?;
        drop(parent);
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, PoolEntry { pool }, [0, 0], out, |id| MemplugHostPool { id }) }
    })
}

/// Changes a pool's capacity at run time.
///
/// * Raising always succeeds (requests waiting for room are woken).
/// * Lowering to at least the bytes live in the pool (its `used`, the
///   pools below it included) succeeds at once.
/// * Lowering below what is live first sends pressure tickets for the
///   excess to the holders registered with this pool or any pool below it
///   (lowest priority first, one at a time, no requester, priority
///   `MEMPLUG_HOST_PRIORITY_HIGHEST`, class `MEMPLUG_HOST_CLASS_OTHER`, a
///   timeout of 0), stopping once the rest fits. If more than `capacity` is
///   still live then, the call fails with `MEMPLUG_HOST_STATUS_BUSY` and the
///   capacity stays as it was; the last error message says how many bytes
///   are live ("... N B are live ...").
///
/// The change is atomic with respect to every charge: none can exceed the
/// new capacity. A capacity above 2^63 - 1 is `_OUT_OF_RANGE`. A child's
/// capacity may exceed its parent's. Thread-safety: any thread, also from
/// inside a pressure callback (a lowering made there sends no tickets to
/// holders under a pool related to the ticket's).
#[no_mangle]
pub extern "C" fn memplug_host_pool_set_capacity(pool: MemplugHostPool, capacity: u64) -> MemplugHostStatus {
    boundary("memplug_host_pool_set_capacity", || {
        let (e, _) = pin::<PoolEntry>(pool.id)?;
        e.pool.set_capacity(capacity).map_err(|err| match err {
            GovernorError::CapacityBelowLive { .. } => Error::new(MemplugHostStatus::Busy, err.to_string()),
            err => err.into(),
        })
    })
}

/// Reads a pool's place in a tree of pools: its id, its parent's id and
/// name, its depth, its capacity and use, and the share of the pools below
/// it (see `MemplugHostPoolInfo`). Set `out->struct_size` to
/// `sizeof(MemplugHostPoolInfo)` first; written only on success.
/// Thread-safety: any thread; never blocks an allocation.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_info(
    pool: MemplugHostPool,
    out: *mut MemplugHostPoolInfo,
) -> MemplugHostStatus {
    boundary("memplug_host_pool_info", || {
        require_non_null(out, "out")?;
        let (e, _) = pin::<PoolEntry>(pool.id)?;
        let p = &e.pool;
        let (used, capacity) = p.used_and_capacity();
        let children = p.children();
        let parent = p.parent();
        let v = MemplugHostPoolInfo {
            struct_size: MEMPLUG_HOST_POOL_INFO_SIZE_1_0,
            depth: p.depth().min(u32::MAX as usize) as u32,
            pool_id: p.id().get(),
            parent_id: parent.map_or(0, |q| q.id().get()),
            capacity,
            used,
            free: capacity - used,
            children_used: children.iter().map(|c| c.used()).fold(0, u64::saturating_add),
            children: children.len().min(u32::MAX as usize) as u32,
            reserved0: 0,
            name: name_field(p.name()),
            parent_name: parent.map_or([0; MEMPLUG_HOST_NAME_MAX], |q| name_field(q.name())),
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, v, "MemplugHostPoolInfo") }
    })
}

/// Gives a new handle to a pool's parent (`MEMPLUG_HOST_STATUS_NOT_FOUND`
/// for a pool without a parent), in the pool's manager.
///
/// Ownership: the caller owns the new handle (`memplug_host_pool_release`).
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_parent(
    pool: MemplugHostPool,
    out: *mut MemplugHostPool,
) -> MemplugHostStatus {
    boundary("memplug_host_pool_parent", || {
        require_non_null(out, "out")?;
        let (e, seat) = pin::<PoolEntry>(pool.id)?;
        let Some(parent) = e.pool.parent().cloned() else {
            return Err(Error::new(
                MemplugHostStatus::NotFound,
                format!("pool '{}' has no parent", e.pool.name()),
            ));
        };
        drop(e);
        // SAFETY: `out` was checked non-NULL.
        unsafe {
            manager_tables::issue(seat, PoolEntry { pool: parent }, [0, 0], out, |id| MemplugHostPool { id })
        }
    })
}

/// Releases a pool handle. The pool lives on while bindings and holders
/// use it (its name stays taken). The zero handle is a no-op.
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_pool_release(pool: MemplugHostPool) -> MemplugHostStatus {
    boundary("memplug_host_pool_release", || {
        manager_tables::remove::<PoolEntry>(pool.id)?;
        Ok(())
    })
}

/// Registers a holder with a pool: an owner of bytes that answers pressure
/// tickets with `callback` (see `MemplugHostPressureFn`; NULL: a holder that
/// always answers 0). Lower `priority` is asked first; a request made for a
/// holder only asks holders of equal or lower priority, never itself.
///
/// `userdata` is passed to every call of `callback`, from any thread; it
/// must stay valid until `memplug_host_holder_unregister` (or the manager's
/// destruction) returns, after which the callback is never called again.
///
/// Ownership: the caller owns the handle. Thread-safety: any thread.
///
/// # Safety
/// `name` must be NULL or NUL-terminated; `out` NULL or writable;
/// `callback` (when not NULL) callable as documented.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_holder_register(
    pool: MemplugHostPool,
    name: *const c_char,
    priority: u32,
    callback: MemplugHostPressureFn,
    userdata: *mut c_void,
    out: *mut MemplugHostHolder,
) -> MemplugHostStatus {
    boundary("memplug_host_holder_register", || {
        // SAFETY: the caller's contract.
        let name = unsafe { c_str(name, "name") }?;
        require_non_null(out, "out")?;
        let (entry, seat) = pin::<PoolEntry>(pool.id)?;
        let shared =
            Arc::new(HolderShared { handle: AtomicU64::new(0), answers_above_pool_use: AtomicU64::new(0) });
        // Weak: the pool owns the callback, so a strong reference would
        // keep the pool alive forever.
        let weak_pool = Arc::downgrade(&entry.pool);
        let cb = pressure_callback(callback, UserData(userdata), pool.id, weak_pool, shared.clone());
        let reg = entry.pool.register_holder(name, Priority(priority), cb);
        drop(entry);
        // The governor's id rides along unpinned (`memplug_host_holder_id`).
        let holder_id = reg.id().get();
        let id = manager_tables::insert(seat, HolderEntry { reg, shared: shared.clone() }, [holder_id, 0])?;
        shared.handle.store(id, Ordering::Release);
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostHolder { id }) };
        Ok(())
    })
}

fn pressure_callback(
    callback: MemplugHostPressureFn,
    userdata: UserData,
    pool_id: u64,
    pool: Weak<memplug_host_dep::governor::Pool>,
    shared: Arc<HolderShared>,
) -> impl Fn(&PressureTicket) -> u64 + Send + Sync + 'static {
    move |t: &PressureTicket| -> u64 {
        let Some(f) = callback else { return 0 };
        // The most any answer can truthfully be: every byte charged now.
        let ceiling = pool.upgrade().map_or(0, |p| p.used());
        let now = Instant::now();
        let ticket = MemplugHostPressureTicket {
            struct_size: MEMPLUG_HOST_PRESSURE_TICKET_SIZE_1_0,
            alloc_class: memplug_host_dep::mechanism::class_tag(t.class),
            bytes_wanted: t.bytes_wanted,
            requester_priority: t.priority.0,
            has_requester: t.requester.is_some() as u32,
            timeout_ns: t.deadline.saturating_duration_since(now).as_nanos().min(u64::MAX as u128) as u64,
            pool: MemplugHostPool { id: pool_id },
            holder: MemplugHostHolder { id: shared.handle.load(Ordering::Acquire) },
        };
        let answer = {
            let _scope = CallbackScope::enter();
            let ud = userdata;
            // SAFETY: the caller registered this function and userdata for
            // exactly this call; the ticket lives across the call.
            unsafe { f(ud.0, &ticket) }
        };
        if answer > ceiling {
            shared.answers_above_pool_use.fetch_add(1, Ordering::Relaxed);
            ceiling
        } else {
            answer
        }
    }
}

/// Unregisters a holder and releases its handle: no ticket is delivered
/// after this returns, and it returns only when no call of its callback
/// runs on another thread (a callback may unregister its own holder), so
/// `userdata` may be freed right after. Charges made for the holder stay
/// valid and are released as usual; the pool's statistics keep counting
/// them. The zero handle is a no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_holder_unregister(holder: MemplugHostHolder) -> MemplugHostStatus {
    boundary("memplug_host_holder_unregister", || -> Result<()> {
        manager_tables::remove::<HolderEntry>(holder.id)?;
        Ok(())
    })
}

/// Writes the holder's id to `out`: the governor's number for it, unique in
/// the process and never reused, the number loss notices name
/// (`MemplugHostLossNotice::holder_id`). Never 0. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_holder_id(
    holder: MemplugHostHolder,
    out: *mut u64,
) -> MemplugHostStatus {
    boundary("memplug_host_holder_id", || {
        require_non_null(out, "out")?;
        // Read without pinning, so that this never delays an unregister.
        let [id, _] = manager_tables::meta::<HolderEntry>(holder.id)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, id) };
        Ok(())
    })
}

/// Lowest holder priority: asked first under pressure.
pub const MEMPLUG_HOST_PRIORITY_LOWEST: u32 = 0;

/// Highest holder priority; also the priority of a request made on behalf
/// of no holder.
pub const MEMPLUG_HOST_PRIORITY_HIGHEST: u32 = u32::MAX;

/// A request for room, given to a holder's pressure callback.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPressureTicket {
    /// `sizeof(MemplugHostPressureTicket)` of the library; read only fields
    /// that fit.
    pub struct_size: u32,
    /// Class of the request (`MEMPLUG_HOST_CLASS_*`).
    pub alloc_class: u32,
    /// Bytes still missing when the ticket was issued.
    pub bytes_wanted: u64,
    /// Priority of the requester (`MEMPLUG_HOST_PRIORITY_HIGHEST` for a
    /// request made on behalf of no holder).
    pub requester_priority: u32,
    /// 1 when the request was made on behalf of a holder, else 0.
    pub has_requester: u32,
    /// Time left before the requester gives up, in nanoseconds; 0: release
    /// what can be released at once, do not block.
    pub timeout_ns: u64,
    /// The pool that needs room (the handle the holder registered with).
    pub pool: MemplugHostPool,
    /// The holder being asked.
    pub holder: MemplugHostHolder,
}

/// A pool's place in a tree of pools (`memplug_host_pool_info`): its
/// identity, its parent, its capacity and the share of its use that comes
/// from the pools below it. `capacity`, `used` and `free` are one
/// consistent reading; `children_used` sums the children's use, read one
/// after the other (exact when no operation is in flight).
///
/// The pool and parent ids are the governor's: unique in the process,
/// never reused, the same number whatever handle names the pool (so a
/// child's `parent_id` equals its parent's `pool_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostPoolInfo {
    /// `sizeof(MemplugHostPoolInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Ancestors above the pool: 0 for a pool made with
    /// `memplug_host_pool_create`, 1 for its children, and so on.
    pub depth: u32,
    /// The pool's id.
    pub pool_id: u64,
    /// The parent's id; 0 for a pool without a parent
    /// (`memplug_host_pool_parent` gives a handle to the parent).
    pub parent_id: u64,
    /// Bytes the pool may charge in all (`memplug_host_pool_set_capacity`);
    /// a parent's smaller capacity may bind first.
    pub capacity: u64,
    /// Bytes charged at this level, the pools below it included (as in
    /// `MemplugHostPoolStats`).
    pub used: u64,
    /// `capacity - used`.
    pub free: u64,
    /// Of `used`, the bytes charged through the pools below this one.
    pub children_used: u64,
    /// Pools created directly under this one, alive now.
    pub children: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// The pool's name, NUL-terminated (truncated to fit).
    pub name: [c_char; MEMPLUG_HOST_NAME_MAX],
    /// The parent's name, NUL-terminated; empty for a pool without a parent.
    pub parent_name: [c_char; MEMPLUG_HOST_NAME_MAX],
}

/// A holder's answer to a pressure ticket: the bytes it released (or
/// queued for release after fences), through the normal paths
/// (`memplug_host_allocation_free*`, `memplug_host_region_shrink`...).
/// Zero is a legal answer. Answers are recorded, never trusted as refunds;
/// an answer larger than the pool's use is clamped and counted as nonsense.
///
/// Called on the thread whose request needs room, with no host lock held,
/// possibly on several threads at once. It may call the C API (free, shrink,
/// allocate — a request made from inside a callback sends no tickets of its
/// own), except `memplug_host_manager_destroy` and operations on a region
/// whose grow is running on this thread (`MEMPLUG_HOST_STATUS_REENTRANT`).
/// It must not unwind (no C++ exception may leave it).
pub type MemplugHostPressureFn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, ticket: *const MemplugHostPressureTicket) -> u64>;

/// Size of `MemplugHostPressureTicket` in API 1.0.
pub const MEMPLUG_HOST_PRESSURE_TICKET_SIZE_1_0: u32 = 48;

/// Size of `MemplugHostPoolInfo` in API 1.0.
pub const MEMPLUG_HOST_POOL_INFO_SIZE_1_0: u32 = 192;

//! Pools and holders (pressure callbacks).

use crate::callbacks::{CallbackScope, UserData};
use crate::error::{boundary, c_str, require_non_null, write_out, Result};
use crate::manager_tables::{self, pin, pin_manager, HolderEntry, HolderShared, PoolEntry};
use crate::status::MemplugHostStatus;
use crate::types::{
    MemplugHostHolder, MemplugHostManager, MemplugHostPool, MemplugHostPressureFn, MemplugHostPressureTicket,
    MEMPLUG_HOST_PRESSURE_TICKET_SIZE_1_0,
};
use memplug_host_dep::governor::{PressureTicket, Priority};
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
        let id = manager_tables::insert(seat, PoolEntry { pool }, [0, 0])?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostPool { id }) };
        Ok(())
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
        let id = manager_tables::insert(seat, HolderEntry { reg, shared: shared.clone() }, [0, 0])?;
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

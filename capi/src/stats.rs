//! Pool and holder statistics.

use crate::error::{boundary, require_non_null};
use crate::manager_tables::{pin, HolderEntry, PoolEntry};
use crate::status::MemplugHostStatus;
use crate::types::{
    write_sized, MemplugHostClassStats, MemplugHostHolder, MemplugHostHolderStats, MemplugHostPool,
    MemplugHostPoolStats, MEMPLUG_HOST_CLASS_STATS_SIZE_1_0, MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0,
    MEMPLUG_HOST_POOL_STATS_SIZE_1_0,
};
use memplug_host_dep::governor::AllocationClass;
use std::sync::atomic::Ordering;

/// Reads a pool's figures. Set `out->struct_size` to
/// `sizeof(MemplugHostPoolStats)` first; written only on success.
/// Thread-safety: any thread; never blocks an allocation.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_stats(
    pool: MemplugHostPool,
    out: *mut MemplugHostPoolStats,
) -> MemplugHostStatus {
    boundary("memplug_host_pool_stats", || {
        require_non_null(out, "out")?;
        let (e, _) = pin::<PoolEntry>(pool.id)?;
        let s = e.pool.snapshot();
        let v = MemplugHostPoolStats {
            struct_size: MEMPLUG_HOST_POOL_STATS_SIZE_1_0,
            holders: s.holders.min(u32::MAX as usize) as u32,
            capacity: s.capacity,
            used: s.used,
            free: s.free,
            peak: s.peak,
            reserved: s.reserved,
            leased: s.leased,
            quarantined: s.quarantined,
            tickets: s.pressure.tickets,
            bytes_wanted: s.pressure.bytes_wanted,
            bytes_answered: s.pressure.bytes_answered,
            zero_answers: s.pressure.zero_answers,
            waits: s.waits,
            wait_timeouts: s.wait_timeouts,
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, v, "MemplugHostPoolStats") }
    })
}

/// Reads a pool's figures for one class (`MEMPLUG_HOST_CLASS_*`; another
/// number is `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`). Set
/// `out->struct_size` first. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_class_stats(
    pool: MemplugHostPool,
    class: u32,
    out: *mut MemplugHostClassStats,
) -> MemplugHostStatus {
    boundary("memplug_host_pool_class_stats", || {
        require_non_null(out, "out")?;
        let class = crate::binding::class_of(class)?;
        let (e, _) = pin::<PoolEntry>(pool.id)?;
        let s = e.pool.snapshot();
        let c = s.class(class);
        let v = MemplugHostClassStats {
            struct_size: MEMPLUG_HOST_CLASS_STATS_SIZE_1_0,
            reserved0: 0,
            reserved: c.reserved,
            leased: c.leased,
            quarantined: c.quarantined,
            leases: c.leases,
            grants: c.grants,
            failures: c.failures,
            quarantines: c.quarantines,
            leaked_leases: c.leaked_leases,
            leaked_bytes: c.leaked_bytes,
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, v, "MemplugHostClassStats") }
    })
}

/// Reads a holder's figures: what is charged to it and the tickets it
/// received. Set `out->struct_size` first. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_holder_stats(
    holder: MemplugHostHolder,
    out: *mut MemplugHostHolderStats,
) -> MemplugHostStatus {
    boundary("memplug_host_holder_stats", || {
        require_non_null(out, "out")?;
        let (e, _) = pin::<HolderEntry>(holder.id)?;
        let s = e.reg.stats();
        let t = s.totals();
        let v = MemplugHostHolderStats {
            struct_size: MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0,
            priority: s.priority.0,
            registered: s.registered as u32,
            reserved0: 0,
            reserved: t.reserved,
            leased: t.leased,
            quarantined: t.quarantined,
            leases: t.leases,
            tickets: s.pressure.tickets,
            bytes_wanted: s.pressure.bytes_wanted,
            bytes_answered: s.pressure.bytes_answered,
            zero_answers: s.pressure.zero_answers,
            nonsense_answers: e.shared.answers_above_pool_use.load(Ordering::Relaxed),
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, v, "MemplugHostHolderStats") }
    })
}

const _: () = assert!(AllocationClass::COUNT == crate::types::MEMPLUG_HOST_CLASS_COUNT as usize);

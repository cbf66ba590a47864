//! Pool and holder statistics.

use crate::common::{MemplugHostHolder, MemplugHostPool};
use crate::error::{boundary, require_non_null};
use crate::manager_tables::{pin, HolderEntry, PoolEntry};
use crate::status::MemplugHostStatus;
use crate::struct_size::write_sized;
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

const _: () = assert!(AllocationClass::COUNT == crate::common::MEMPLUG_HOST_CLASS_COUNT as usize);

/// Figures of one allocation class (`memplug_host_pool_class_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostClassStats {
    /// `sizeof(MemplugHostClassStats)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Bytes held by reservations (granted, not yet committed).
    pub reserved: u64,
    /// Bytes charged to live leases.
    pub leased: u64,
    /// Bytes quarantined: charged for good because a release failed.
    pub quarantined: u64,
    /// Live leases.
    pub leases: u64,
    /// Reservations granted, cumulative.
    pub grants: u64,
    /// Reservation requests refused, cumulative.
    pub failures: u64,
    /// Quarantine events, cumulative.
    pub quarantines: u64,
    /// Leases dropped without release (a bug somewhere), cumulative.
    pub leaked_leases: u64,
    /// Bytes of those leaked leases, cumulative (they stay charged).
    pub leaked_bytes: u64,
}

/// A pool's figures (`memplug_host_pool_stats`). `used`, `free`,
/// `capacity` and `peak` are exact; the sums are exact when no operation
/// on the pool is in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPoolStats {
    /// `sizeof(MemplugHostPoolStats)`; set to the bytes written.
    pub struct_size: u32,
    /// Holders registered now.
    pub holders: u32,
    /// Bytes the pool may charge in all.
    pub capacity: u64,
    /// Bytes charged: reservations, leases and quarantine.
    pub used: u64,
    /// `capacity - used`.
    pub free: u64,
    /// Highest `used` ever.
    pub peak: u64,
    /// Of `used`, bytes held by reservations (granted, not committed), in
    /// the pool's own accounts (summed over classes).
    pub reserved: u64,
    /// Bytes charged to live leases, in the pool's own accounts.
    pub leased: u64,
    /// Bytes quarantined, in the pool's own accounts.
    pub quarantined: u64,
    /// Pressure tickets this pool issued, and their sums.
    pub tickets: u64,
    /// Bytes the tickets asked for, summed.
    pub bytes_wanted: u64,
    /// Bytes the holders said they released in answer, summed (clamped).
    pub bytes_answered: u64,
    /// Tickets answered with 0 bytes.
    pub zero_answers: u64,
    /// Requests that waited for room, and those whose deadline passed.
    pub waits: u64,
    /// Requests whose wait for room ended at their deadline, refused.
    pub wait_timeouts: u64,
}

/// A holder's figures (`memplug_host_holder_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostHolderStats {
    /// `sizeof(MemplugHostHolderStats)`; set to the bytes written.
    pub struct_size: u32,
    /// The priority given at registration: the holder is asked only by
    /// requests of at least this priority.
    pub priority: u32,
    /// 1 while registered.
    pub registered: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Sums over every class of what is charged to the holder.
    pub reserved: u64,
    /// Bytes charged to its live leases.
    pub leased: u64,
    /// Bytes of its quarantined charges.
    pub quarantined: u64,
    /// Its live leases (charged objects).
    pub leases: u64,
    /// Tickets received, and their sums.
    pub tickets: u64,
    /// Bytes those tickets asked for, summed.
    pub bytes_wanted: u64,
    /// Sum of the (clamped) answers.
    pub bytes_answered: u64,
    /// Tickets it answered with 0 bytes.
    pub zero_answers: u64,
    /// Answers larger than the pool's whole use when the ticket was issued:
    /// nonsense, clamped to that figure and counted here.
    pub nonsense_answers: u64,
}

/// Size of `MemplugHostClassStats` in API 1.0.
pub const MEMPLUG_HOST_CLASS_STATS_SIZE_1_0: u32 = 80;

/// Size of `MemplugHostPoolStats` in API 1.0.
pub const MEMPLUG_HOST_POOL_STATS_SIZE_1_0: u32 = 112;

/// Size of `MemplugHostHolderStats` in API 1.0.
pub const MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0: u32 = 88;

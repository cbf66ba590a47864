//! Caching bindings through the C API: size-classed reuse of freed blocks
//! (see the host's `cache` module for what is promised).

use crate::binding::class_of;
use crate::binding::{MemplugHostAllocationInfo, MemplugHostBindingOptions};
use crate::common::{MemplugHostFence, MemplugHostManager, MemplugHostMechanism, MemplugHostPool};
use crate::error::{boundary, c_str, require_non_null, write_out, Error};
use crate::fence::collect_fences;
use crate::handle::Kind;
use crate::manager_tables::{self, pin, pin_manager, same_manager, CacheEntry, PoolEntry};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::{read_sized, write_sized};
use memplug_host_dep::governor::Priority;
use memplug_host_dep::registry::Context;
use memplug_host_dep::{BindingSpec, CacheConfig, CachedAllocation, IdlePolicy, StreamKey};
use memplug_sdk::prefix::Prefixed;
use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

/// A caching binding (`memplug_host_cache_create`). Destroy with
/// `memplug_host_cache_destroy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostCache {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A block handed out by a caching binding. Give it back with
/// `memplug_host_cached_free` or `memplug_host_cached_free_on`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostCachedAllocation {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// The block alignment a C cache uses when its options leave it 0.
const C_DEFAULT_MIN_ALIGNMENT: u64 = 256;

/// How a caching binding is set up (API 1.2; the idle policy's fields
/// since API 1.3). Zero fields take the defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostCacheOptions {
    /// `sizeof(MemplugHostCacheOptions)`.
    pub struct_size: u32,
    /// The priority of the holder the cache registers (as
    /// `memplug_host_holder_register`'s): lower is asked first under
    /// pressure, and a request may ask only holders of its priority or
    /// lower. 0, the lowest, gives cached bytes back before anyone's, and
    /// lets a miss make room only from caches of priority 0.
    pub priority: u32,
    /// Requests larger than this bypass the cache (served and freed by the
    /// binding directly); 0: 1 GiB.
    pub max_block: u64,
    /// New blocks are aligned to at least this (a power of two) and to the
    /// mechanism's minimum alignment; 0: 256 (API 1.2's promise, kept; ask
    /// for 16 to let small blocks take `malloc`'s faster path).
    pub min_alignment: u64,
    /// API 1.3: the most bytes the cache keeps idle; a free past it gives
    /// idle blocks back. 0: a quarter of the pool's capacity when the cache
    /// is made; `UINT64_MAX`: no cap; 1: keep nothing (no block is that
    /// small).
    pub max_idle_bytes: u64,
    /// API 1.3: blocks idle longer than this many nanoseconds are given
    /// back at the next miss and by `memplug_host_cache_collect`. 0: no age.
    pub max_idle_age_ns: u64,
    /// API 1.3: a fraction of the pool's capacity in (0, 1]: a miss that
    /// would take the pool's use past it gives idle blocks back first (the
    /// model of PyTorch's `garbage_collection_threshold`). 0: never.
    pub gc_threshold: f64,
}

/// A caching binding's figures (`memplug_host_cache_stats`). Every byte is
/// charged to the pool under the cache's holder.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostCacheStats {
    /// `sizeof(MemplugHostCacheStats)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// The governor's id of the cache's holder (as `memplug_host_holder_id`).
    pub holder_id: u64,
    /// Requests served by an idle block.
    pub hits: u64,
    /// Requests that made a new block.
    pub misses: u64,
    /// Requests above `max_block`, never kept.
    pub bypasses: u64,
    /// Bytes kept idle (charged, not handed out).
    pub idle_bytes: u64,
    /// Idle blocks holding those bytes.
    pub idle_blocks: u64,
    /// Idle blocks still waiting for the fences they were freed behind.
    pub pending_blocks: u64,
    /// Bytes handed out and not yet freed (bypasses not included).
    pub in_use_bytes: u64,
    /// The blocks holding those bytes.
    pub in_use_blocks: u64,
    /// Idle bytes given back by `memplug_host_cache_trim`.
    pub trimmed_bytes: u64,
    /// Idle bytes given back to pressure (tickets, and misses that found
    /// the pool full).
    pub pressure_bytes: u64,
    /// API 1.3: blocks freed while pinned by work outside any stream (a
    /// UCX registration or transfer) that has not completed: counted in
    /// `in_use_blocks`, reused by nobody and given back by no trim until
    /// it completes. A 1.2 caller (`struct_size` 96) is not written this.
    pub pinned_blocks: u64,
}

/// Size of `MemplugHostCacheOptions` in API 1.2, where it first appeared.
pub const MEMPLUG_HOST_CACHE_OPTIONS_SIZE_1_2: u32 = 24;
/// Size of `MemplugHostCacheOptions` in API 1.3 (the idle policy).
pub const MEMPLUG_HOST_CACHE_OPTIONS_SIZE_1_3: u32 = 48;
/// Size of `MemplugHostCacheStats` in API 1.2, where it first appeared.
pub const MEMPLUG_HOST_CACHE_STATS_SIZE_1_2: u32 = 96;
/// Size of `MemplugHostCacheStats` in API 1.3 (`pinned_blocks`).
pub const MEMPLUG_HOST_CACHE_STATS_SIZE_1_3: u32 = 104;

// SAFETY: `#[repr(C)]`, first field `struct_size: u32`, integers and an
// `f64` only: valid when zeroed (0.0).
unsafe impl Prefixed for MemplugHostCacheOptions {
    const SIZE_1_0: u32 = MEMPLUG_HOST_CACHE_OPTIONS_SIZE_1_2;
}
const _: () =
    assert!(std::mem::size_of::<MemplugHostCacheOptions>() == MEMPLUG_HOST_CACHE_OPTIONS_SIZE_1_3 as usize);
// SAFETY: as above.
unsafe impl Prefixed for MemplugHostCacheStats {
    const SIZE_1_0: u32 = MEMPLUG_HOST_CACHE_STATS_SIZE_1_2;
}
const _: () =
    assert!(std::mem::size_of::<MemplugHostCacheStats>() == MEMPLUG_HOST_CACHE_STATS_SIZE_1_3 as usize);

/// Creates a caching binding: a binding (as `memplug_host_binding_create`
/// with `binding_options`, which may be NULL) whose freed blocks are kept,
/// charged, and reused by later requests of the same size class (classes
/// are at most 25 % larger than the request; blocks are never split).
///
/// The cache registers its own holder in `pool`, named `holder_name` (NULL:
/// "cache"), so `binding_options->holder` must be the zero handle
/// (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT` otherwise): it answers that
/// holder's pressure tickets by freeing idle blocks, never one handed out.
/// `options` may be NULL (defaults); a `min_alignment` that is not a power
/// of two, or a `gc_threshold` outside (0, 1], is refused. Every handle must belong to `manager`.
///
/// Ownership: the caller owns the handle (`memplug_host_cache_destroy`).
/// Thread-safety: any thread; a cache may be used from many threads at once.
///
/// # Safety
/// `binding_options` and `options` must be NULL or readable for their
/// `struct_size` bytes; `holder_name` NULL or NUL-terminated; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cache_create(
    manager: MemplugHostManager,
    mechanism: MemplugHostMechanism,
    pool: MemplugHostPool,
    binding_options: *const MemplugHostBindingOptions,
    holder_name: *const c_char,
    options: *const MemplugHostCacheOptions,
    out: *mut MemplugHostCache,
) -> MemplugHostStatus {
    boundary("memplug_host_cache_create", || {
        require_non_null(out, "out")?;
        let mut spec = BindingSpec::new(class_of(crate::common::MEMPLUG_HOST_CLASS_OTHER)?);
        if !binding_options.is_null() {
            // SAFETY: non-NULL; the caller's contract covers the size.
            let o = unsafe { read_sized(binding_options, "MemplugHostBindingOptions") }?;
            if o.holder.id != 0 {
                return Err(Error::new(
                    S::InvalidArgument,
                    "a caching binding registers its own holder: binding_options->holder must be zero",
                ));
            }
            spec = BindingSpec::new(class_of(o.alloc_class)?);
            if o.wait_ns != 0 {
                spec = spec.wait(Duration::from_nanos(o.wait_ns));
            }
            spec.placement = crate::binding::placement(&o)?;
        }
        // The C API promised 256 B since 1.2 (the Rust default is 16): a C
        // caller who set nothing keeps what the frozen header said.
        let mut config = CacheConfig { min_alignment: C_DEFAULT_MIN_ALIGNMENT, ..CacheConfig::default() };
        if !holder_name.is_null() {
            // SAFETY: non-NULL and NUL-terminated by the caller's contract.
            config.holder_name = unsafe { c_str(holder_name, "holder_name") }?.to_string();
        }
        if !options.is_null() {
            // SAFETY: non-NULL; the caller's contract covers the size.
            let o = unsafe { read_sized(options, "MemplugHostCacheOptions") }?;
            config.priority = Priority(o.priority);
            if o.max_block != 0 {
                config.max_block = o.max_block;
            }
            if o.min_alignment != 0 {
                config.min_alignment = o.min_alignment;
            }
            config.idle = idle_policy(&o)?;
        }
        let (m, seat) = pin_manager(manager.id)?;
        same_manager(seat, mechanism.id, Kind::Mechanism)?;
        same_manager(seat, pool.id, Kind::Pool)?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let (p, _) = pin::<PoolEntry>(pool.id)?;
        let cache = m.pm.bind_caching(&ctx, &p.pool, spec, config)?;
        // SAFETY: `out` was checked non-NULL.
        unsafe {
            manager_tables::issue(seat, CacheEntry { cache }, [0, 0], out, |id| MemplugHostCache { id })
        }
    })
}

/// Destroys a cache handle. Blocks it handed out stay valid; once the last
/// comes back, every idle block is freed and the cache's holder
/// unregistered. The zero handle is a no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_cache_destroy(cache: MemplugHostCache) -> MemplugHostStatus {
    boundary("memplug_host_cache_destroy", || {
        manager_tables::remove::<CacheEntry>(cache.id)?;
        Ok(())
    })
}

/// A `stream` value of the cache functions: 0 is "no stream" (the host's
/// own use); any other value names one stream, the same value always for
/// the same stream (a `MemplugHostStream`'s id, or a runtime's own stream
/// handle such as a `cudaStream_t`).
fn stream_key(stream: u64) -> Option<StreamKey> {
    (stream != 0).then(|| StreamKey::runtime(stream))
}

/// Allocates `size` bytes aligned to `alignment` (a power of two) from the
/// cache: an idle block of the size class when one may be used — any ready
/// block, or one freed on this same `stream` (see `memplug_host_cached_free_on`)
/// — else a new block through the binding (as `memplug_host_allocate`,
/// after giving back the cache's own idle blocks when the pool has no room).
/// `stream` 0: for the host, ordered on no stream.
///
/// `out` receives the handle and `out_addr` (may be NULL) the address;
/// both only on success. Failures are the binding's (`_OUT_OF_BUDGET`,
/// `_DEVICE_LOST`, the plugin's refusals).
///
/// Ownership: the caller owns the block (`memplug_host_cached_free[_on]`);
/// it outlives the cache handle. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable; `out_addr` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cache_allocate(
    cache: MemplugHostCache,
    size: u64,
    alignment: u64,
    stream: u64,
    out: *mut MemplugHostCachedAllocation,
    out_addr: *mut u64,
) -> MemplugHostStatus {
    boundary("memplug_host_cache_allocate", || {
        require_non_null(out, "out")?;
        let (c, seat, tables) = manager_tables::pin_with_tables::<CacheEntry>(cache.id)?;
        let vacant = manager_tables::vacant_in::<CachedAllocation>(tables)?;
        let made = c.cache.allocate_maybe_on(size, alignment, stream_key(stream));
        // Straight from the result into the slot (`fill_made`): unpacked
        // with `?` first, the allocation was copied through the stack twice
        // (callgrind).
        let (id, [addr, _]) = manager_tables::fill_made(seat, vacant, made, |a| [a.addr(), size])?;
        drop(c);
        // SAFETY: checked non-NULL.
        unsafe {
            write_out(out, MemplugHostCachedAllocation { id });
            if !out_addr.is_null() {
                write_out(out_addr, addr);
            }
        }
        Ok(())
    })
}

/// Reads a cached block's address and the size requested. Set
/// `out->struct_size` first. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cached_allocation_info(
    allocation: MemplugHostCachedAllocation,
    out: *mut MemplugHostAllocationInfo,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    boundary("memplug_host_cached_allocation_info", || unsafe {
        crate::binding::write_info::<CachedAllocation>(allocation.id, out)
    })
}

/// Gives a block back to its cache, for anyone to reuse at once: no device
/// work may still use it. A block above the cache's largest class, or of a
/// context no longer active, is freed instead. A block registered with
/// UCX or with a UCX transfer in flight
/// (`memplug_host_ucx_register_cached_allocation`,
/// `_peer_pull_into_cached_allocation`) goes to no request, and is not
/// trimmed, until the deregistration or the transfer's completion. The
/// handle is stale afterwards (a second free is
/// `MEMPLUG_HOST_STATUS_STALE_HANDLE`). The zero handle is a no-op.
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_cached_free(allocation: MemplugHostCachedAllocation) -> MemplugHostStatus {
    boundary("memplug_host_cached_free", || manager_tables::remove_drop::<CachedAllocation>(allocation.id))
}

/// Gives a block back behind `fences[0..count]`, the last work using it:
/// a request on the same `stream` may reuse it at once (the stream runs
/// the new work after the old), any other only once every fence has
/// completed; freeing it to the mechanism (trim, pressure) waits for them
/// in the deferred-free queue. `stream` 0 names no stream: nobody reuses it
/// before the fences complete. A block registered with UCX or with a UCX
/// transfer in flight goes to no request until then, on `stream` neither
/// (as for `memplug_host_cached_free`). The fences must belong to the block's
/// manager; on any refusal the block is untouched. The handle is stale
/// afterwards; the fence handles stay the caller's. Thread-safety: any
/// thread.
///
/// # Safety
/// `fences` must be NULL or readable for `count` handles.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cached_free_on(
    allocation: MemplugHostCachedAllocation,
    stream: u64,
    fences: *const MemplugHostFence,
    count: usize,
) -> MemplugHostStatus {
    boundary("memplug_host_cached_free_on", || {
        if allocation.id == 0 {
            return Ok(());
        }
        let raw = crate::handle::expect(allocation.id, Kind::CachedAllocation)?;
        // SAFETY: the caller's contract.
        let mut fences = unsafe { collect_fences(raw.manager, fences, count) }?.into_vec();
        let Some(mut a) = manager_tables::take_unpinned::<CachedAllocation>(allocation.id)? else {
            return Ok(());
        };
        let last = fences.pop();
        for f in fences {
            a.used_by(f);
        }
        match (last, stream_key(stream)) {
            (Some(f), Some(s)) => a.free_on(s, f),
            (Some(f), None) => {
                a.used_by(f);
                drop(a);
            }
            (None, _) => drop(a),
        }
        Ok(())
    })
}

/// Frees idle blocks until `bytes` of charge are given back
/// (`UINT64_MAX`: every idle block); ready blocks first, then those still
/// behind fences (freed after them through the deferred-free queue).
/// `out_released` (may be NULL) receives the bytes given back.
/// Thread-safety: any thread.
///
/// # Safety
/// `out_released` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cache_trim(
    cache: MemplugHostCache,
    bytes: u64,
    out_released: *mut u64,
) -> MemplugHostStatus {
    boundary("memplug_host_cache_trim", || {
        let (c, _) = pin::<CacheEntry>(cache.id)?;
        let released = c.cache.trim(bytes);
        if !out_released.is_null() {
            // SAFETY: non-NULL, writable by the caller's contract.
            unsafe { write_out(out_released, released) };
        }
        Ok(())
    })
}

/// Applies the cache's idle policy now, as if every rule were due: gives
/// back blocks idle past `max_idle_age_ns`, idle bytes above
/// `max_idle_bytes`, and, when the pool's use is past `gc_threshold`, ready
/// blocks until it is not. For a runtime to call between steps or from a
/// timer (a cache nobody allocates from has no miss to apply the age at).
/// `out_released` (may be NULL) receives the bytes given back (counted as
/// trimmed). Thread-safety: any thread.
///
/// # Safety
/// `out_released` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cache_collect(
    cache: MemplugHostCache,
    out_released: *mut u64,
) -> MemplugHostStatus {
    boundary("memplug_host_cache_collect", || {
        let (c, _) = pin::<CacheEntry>(cache.id)?;
        let released = c.cache.collect();
        if !out_released.is_null() {
            // SAFETY: non-NULL, writable by the caller's contract.
            unsafe { write_out(out_released, released) };
        }
        Ok(())
    })
}

/// The idle policy of options read with `read_sized` (the 1.3 fields read
/// as zero from a 1.2 caller: the defaults).
fn idle_policy(o: &MemplugHostCacheOptions) -> Result<IdlePolicy, Error> {
    let mut idle = IdlePolicy::default();
    match o.max_idle_bytes {
        0 => {}
        1 => idle.max_idle_bytes = Some(0),
        n => idle.max_idle_bytes = Some(n),
    }
    if o.max_idle_age_ns != 0 {
        idle.max_idle_age = Some(Duration::from_nanos(o.max_idle_age_ns));
    }
    if o.gc_threshold != 0.0 {
        if !(o.gc_threshold > 0.0 && o.gc_threshold <= 1.0) {
            let why = format!("gc_threshold {} is not in (0, 1] (0: no threshold)", o.gc_threshold);
            return Err(Error::new(S::InvalidArgument, why));
        }
        idle.gc_threshold = Some(o.gc_threshold);
    }
    Ok(idle)
}

/// Reads a cache's figures. Set `out->struct_size` to
/// `sizeof(MemplugHostCacheStats)` first; written only on success.
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_cache_stats(
    cache: MemplugHostCache,
    out: *mut MemplugHostCacheStats,
) -> MemplugHostStatus {
    boundary("memplug_host_cache_stats", || {
        require_non_null(out, "out")?;
        let (c, _) = pin::<CacheEntry>(cache.id)?;
        let s = c.cache.stats();
        let v = MemplugHostCacheStats {
            struct_size: MEMPLUG_HOST_CACHE_STATS_SIZE_1_3,
            reserved0: 0,
            holder_id: c.cache.holder().id().get(),
            hits: s.hits,
            misses: s.misses,
            bypasses: s.bypasses,
            idle_bytes: s.idle_bytes,
            idle_blocks: s.idle_blocks,
            pending_blocks: s.pending_blocks,
            in_use_bytes: s.in_use_bytes,
            in_use_blocks: s.in_use_blocks,
            trimmed_bytes: s.trimmed_bytes,
            pressure_bytes: s.pressure_bytes,
            pinned_blocks: s.pinned_blocks,
        };
        drop(c);
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, v, "MemplugHostCacheStats") }
    })
}

#[cfg(test)]
#[test]
fn sizes_match_the_constants() {
    assert_eq!(std::mem::size_of::<MemplugHostCacheOptions>() as u32, MEMPLUG_HOST_CACHE_OPTIONS_SIZE_1_3);
    // The 1.2 prefix ends where the first 1.3 field starts.
    assert_eq!(
        std::mem::offset_of!(MemplugHostCacheOptions, max_idle_bytes) as u32,
        MEMPLUG_HOST_CACHE_OPTIONS_SIZE_1_2
    );
    assert_eq!(std::mem::size_of::<MemplugHostCacheStats>() as u32, MEMPLUG_HOST_CACHE_STATS_SIZE_1_3);
    assert_eq!(
        std::mem::offset_of!(MemplugHostCacheStats, pinned_blocks) as u32,
        MEMPLUG_HOST_CACHE_STATS_SIZE_1_2
    );
}

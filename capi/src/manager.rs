//! Managers, plugins and mechanisms.

use crate::callbacks::{not_in_callback, not_in_lifecycle_callback};
use crate::error::{boundary, c_str, require_non_null, write_out, Error, Result};
use crate::handle::{self, Kind};
use crate::manager_tables::{self, existing_tables, managers, pin, pin_manager, ManagerState};
use crate::slot_table::Removed;
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::types::{
    name_field, write_sized, MemplugHostManager, MemplugHostMechanism, MemplugHostMechanismInfo,
    MemplugHostPollReport, MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0, MEMPLUG_HOST_POLL_REPORT_SIZE_1_0,
};
use memplug_host_dep::registry::{Context, Requirements};
use memplug_host_dep::{LoadOptions, Mechanism, Plugin, ProcessMemoryManager};
use memplug_sdk::abi::{
    MemplugDevice, MemplugHostInfo, MemplugMessageSink, MemplugNegotiation, MemplugStatus,
    MEMPLUG_CAP_ALLOCATOR, MEMPLUG_CAP_SHARED_MAPPING, MEMPLUG_CAP_SYNC, MEMPLUG_CAP_VIRTUAL_BACKING,
};
use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

/// Creates a process memory manager: an empty registry of plugins, an
/// empty governor, a deferred-free queue (polled by the frees themselves,
/// by `memplug_host_manager_poll`, or by a reaper thread started with
/// `memplug_host_manager_start_reaper`).
///
/// Ownership: the caller owns the manager; destroy it with
/// `memplug_host_manager_destroy`. Up to 1023 managers may live at once
/// (`MEMPLUG_HOST_STATUS_LIMIT_REACHED` beyond).
/// Thread-safety: a manager and every object issued through it may be used
/// from any thread concurrently.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_create(out: *mut MemplugHostManager) -> MemplugHostStatus {
    boundary("memplug_host_manager_create", || {
        require_non_null(out, "out")?;
        let state = ManagerState { pm: ProcessMemoryManager::new() };
        let (seat, gen) = managers().insert(state, [0, 0]).map_err(|_| {
            Error::new(S::LimitReached, format!("{} managers are alive already", handle::MAX_MANAGERS - 1))
        })?;
        // Objects a previous manager of this seat left behind (made by
        // another thread while it was being destroyed) go now.
        if let Some(t) = existing_tables(seat) {
            t.sweep();
        }
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostManager { id: handle::encode(Kind::Manager, seat, gen, seat) }) };
        Ok(())
    })
}

/// Destroys a manager and everything issued through it: ends its
/// subscriptions (waiting for lifecycle callbacks running on other
/// threads), frees allocations
/// and regions (after their fences), releases prefixes, fences, streams,
/// bindings, holders, mechanisms and pools, then drains the deferred-free
/// queue for up to one second (frees whose fences never complete stay
/// allocated — never freed on a guess — and keep their plugin loaded). Every
/// handle of the manager is stale afterwards. The zero handle is a no-op.
///
/// Returns `MEMPLUG_HOST_STATUS_REENTRANT` when called from inside a
/// callback the host is running. Destroying a manager while other threads
/// still use it is a usage error; it stays memory-safe (their calls fail
/// with `MEMPLUG_HOST_STATUS_STALE_HANDLE`).
///
/// Thread-safety: any thread, once.
#[no_mangle]
pub extern "C" fn memplug_host_manager_destroy(manager: MemplugHostManager) -> MemplugHostStatus {
    boundary("memplug_host_manager_destroy", || {
        if manager.id == 0 {
            return Ok(());
        }
        let raw = handle::expect(manager.id, Kind::Manager)?;
        not_in_callback("memplug_host_manager_destroy")?;
        let removed = managers().remove(raw.key()).map_err(|m| Error::miss(m, Kind::Manager, manager.id))?;
        if let Some(t) = existing_tables(raw.manager) {
            t.sweep();
        }
        if let Removed::Now(state) = removed {
            drop(state);
        }
        Ok(())
    })
}

/// Loads a plugin library by path, validates it (entry symbol, version
/// negotiation, vtables, capability flags) and registers its mechanisms.
/// A refused plugin never crashes the host: the call fails with
/// `MEMPLUG_HOST_STATUS_LOAD_FAILED` (or `_VERSION_MISMATCH`,
/// `_ALREADY_EXISTS` for a second plugin of the same name) and the last
/// error message says what is wrong.
///
/// Thread-safety: any thread.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_load_plugin(
    manager: MemplugHostManager,
    path: *const c_char,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_load_plugin", || {
        // SAFETY: the caller's contract.
        let path = unsafe { c_str(path, "path") }?;
        let (m, _) = pin_manager(manager.id)?;
        m.pm.load_plugin(path, &LoadOptions::default())?;
        Ok(())
    })
}

/// Registers a plugin linked into the program (a statically linked plugin,
/// or one the program opened itself): `entry` is its `memplug_plugin_v1`
/// function, called once, now, through the same negotiation and validation
/// as a library loaded by path; `label` names it in messages. Fails as
/// `memplug_host_manager_load_plugin` does (`MEMPLUG_HOST_STATUS_NULL_ARGUMENT`
/// for a NULL `entry`). The plugin's code must stay mapped for as long as the
/// manager exists.
///
/// Thread-safety: any thread.
///
/// # Safety
/// `entry` must follow the `memplug_plugin_v1` contract of `memplug.h` as
/// far as memory safety goes (the host validates everything it can check);
/// `label` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_register_entry(
    manager: MemplugHostManager,
    // Spelled out rather than `Option<MemplugEntryV1>` so cbindgen writes a
    // C function pointer; `Plugin::from_entry` checks it is that type.
    entry: Option<
        unsafe extern "C" fn(
            *const MemplugHostInfo,
            *mut MemplugNegotiation,
            *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    label: *const c_char,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_register_entry", || {
        let entry = entry.ok_or_else(|| Error::null("entry"))?;
        // SAFETY: the caller's contract.
        let label = unsafe { c_str(label, "label") }?;
        let (m, _) = pin_manager(manager.id)?;
        // SAFETY: the caller vouches for `entry` (see above).
        let plugin = unsafe { Plugin::from_entry(entry, label, &LoadOptions::default()) }
            .map_err(memplug_host_dep::ManagerError::from)?;
        m.pm.register_plugin(plugin)?;
        Ok(())
    })
}

/// Unloads a plugin by name, or refuses with `MEMPLUG_HOST_STATUS_BUSY`
/// (the message says what is still alive: mechanism handles, bindings,
/// allocations, queued frees) and leaves it loaded.
///
/// Thread-safety: any thread.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_unload_plugin(
    manager: MemplugHostManager,
    name: *const c_char,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_unload_plugin", || {
        // SAFETY: the caller's contract.
        let name = unsafe { c_str(name, "name") }?;
        let (m, _) = pin_manager(manager.id)?;
        m.pm.unload_plugin(name)?;
        Ok(())
    })
}

/// The number of mechanisms of every loaded plugin.
///
/// Thread-safety: any thread (a concurrent load changes the count).
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_mechanism_count(
    manager: MemplugHostManager,
    out: *mut usize,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_mechanism_count", || {
        require_non_null(out, "out")?;
        let (m, _) = pin_manager(manager.id)?;
        let n = m.pm.mechanisms().len();
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, n) };
        Ok(())
    })
}

fn issue_mechanism(seat: u32, ctx: Arc<Context>) -> Result<MemplugHostMechanism> {
    Ok(MemplugHostMechanism { id: manager_tables::insert(seat, ctx, [0, 0])? })
}

/// A handle to the `index`-th mechanism (registration order, from 0);
/// `MEMPLUG_HOST_STATUS_NOT_FOUND` past the end.
///
/// Ownership: the caller owns the new handle; release it with
/// `memplug_host_mechanism_release`. While it lives its plugin cannot be
/// unloaded. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_mechanism(
    manager: MemplugHostManager,
    index: usize,
    out: *mut MemplugHostMechanism,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_mechanism", || {
        require_non_null(out, "out")?;
        let (m, seat) = pin_manager(manager.id)?;
        let all = m.pm.mechanisms();
        let mech = all.get(index).ok_or_else(|| {
            Error::new(S::NotFound, format!("no mechanism {index}: {} are registered", all.len()))
        })?;
        let ctx = m.pm.context(mech.label())?;
        let h = issue_mechanism(seat, ctx)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, h) };
        Ok(())
    })
}

/// A handle to a mechanism by `"plugin/mechanism"` or bare mechanism name
/// (first match); `MEMPLUG_HOST_STATUS_NOT_FOUND` when none matches.
///
/// Ownership and thread-safety as `memplug_host_manager_mechanism`.
///
/// # Safety
/// `name` must be NULL or NUL-terminated; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_find_mechanism(
    manager: MemplugHostManager,
    name: *const c_char,
    out: *mut MemplugHostMechanism,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_find_mechanism", || {
        // SAFETY: the caller's contract.
        let name = unsafe { c_str(name, "name") }?;
        require_non_null(out, "out")?;
        let (m, seat) = pin_manager(manager.id)?;
        let h = issue_mechanism(seat, m.pm.context(name)?)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, h) };
        Ok(())
    })
}

/// The first mechanism (registration order) serving `device` with every
/// capability in `required` (`MEMPLUG_CAP_*` flags of memplug.h).
/// `MEMPLUG_HOST_STATUS_NOT_FOUND` when no mechanism serves the device,
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED` when none has the capabilities (the
/// message lists what each candidate lacks), `_INVALID_ARGUMENT` for
/// unknown flag bits.
///
/// Ownership and thread-safety as `memplug_host_manager_mechanism`.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_select(
    manager: MemplugHostManager,
    device: MemplugDevice,
    required: u32,
    out: *mut MemplugHostMechanism,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_select", || {
        require_non_null(out, "out")?;
        let known = MEMPLUG_CAP_ALLOCATOR
            | MEMPLUG_CAP_VIRTUAL_BACKING
            | MEMPLUG_CAP_SHARED_MAPPING
            | MEMPLUG_CAP_SYNC;
        if required & !known != 0 {
            return Err(Error::new(
                S::InvalidArgument,
                format!("unknown capability bits {:#x}", required & !known),
            ));
        }
        let req = Requirements {
            virtual_backing: required & MEMPLUG_CAP_VIRTUAL_BACKING != 0,
            shared_mapping: required & MEMPLUG_CAP_SHARED_MAPPING != 0,
            sync: required & MEMPLUG_CAP_SYNC != 0,
        };
        let (m, seat) = pin_manager(manager.id)?;
        let h = issue_mechanism(seat, m.pm.select(device, req)?)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, h) };
        Ok(())
    })
}

/// Describes a mechanism: device, `MEMPLUG_CAP_*` capabilities, alignment,
/// granularity, names. Set `out->struct_size` to
/// `sizeof(MemplugHostMechanismInfo)` first.
///
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_info(
    mechanism: MemplugHostMechanism,
    out: *mut MemplugHostMechanismInfo,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_info", || {
        require_non_null(out, "out")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let info = mechanism_info(ctx.mechanism());
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, info, "MemplugHostMechanismInfo") }
    })
}

/// What `memplug_host_mechanism_info` says of a mechanism.
pub(crate) fn mechanism_info(m: &Mechanism) -> MemplugHostMechanismInfo {
    let p = m.properties();
    MemplugHostMechanismInfo {
        struct_size: MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0,
        capabilities: m.capabilities().0,
        device: m.device().0,
        mechanism_id: m.id(),
        min_alignment: p.min_alignment,
        max_alignment: p.max_alignment,
        granularity: p.granularity,
        name: name_field(m.name()),
        plugin_name: name_field(m.plugin_name()),
    }
}

/// Releases a mechanism handle (bindings made from it keep the mechanism).
/// The zero handle is a no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_mechanism_release(mechanism: MemplugHostMechanism) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_release", || {
        manager_tables::remove::<Arc<Context>>(mechanism.id)?;
        Ok(())
    })
}

/// Retires the frees whose fences have completed, then drives the
/// mechanisms' lives: delivers the lifecycle events not delivered yet (their
/// callbacks run on this thread), terminates lost contexts with no call in
/// flight and retiring ones whose last object is gone (settling each
/// exactly once; `memplug_host_mechanism_settlement` reads it afterwards),
/// and unloads plugins replaced with `unload_old_plugin` once all their
/// contexts have terminated. `out` may be NULL; when given, set
/// `out->struct_size` first. Never waits for the device.
///
/// Returns `MEMPLUG_HOST_STATUS_REENTRANT` inside a lifecycle callback.
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_poll(
    manager: MemplugHostManager,
    out: *mut MemplugHostPollReport,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_poll", || {
        not_in_lifecycle_callback("memplug_host_manager_poll")?;
        let (m, _) = pin_manager(manager.id)?;
        let r = m.pm.poll();
        if !out.is_null() {
            let report = MemplugHostPollReport {
                struct_size: MEMPLUG_HOST_POLL_REPORT_SIZE_1_0,
                reserved0: 0,
                retired: r.retired as u64,
                quarantined: r.quarantined as u64,
                pending: r.still_pending as u64,
            };
            // SAFETY: non-NULL; the caller's contract covers the size.
            unsafe { write_sized(out, report, "MemplugHostPollReport") }?;
        }
        Ok(())
    })
}

/// Starts a background thread that, every `interval_ns` nanoseconds, does
/// what `memplug_host_manager_poll` does: retires completed frees and
/// drives the mechanisms' lives (lifecycle callbacks then run on that
/// thread). Idempotent. It stops when the manager is drained or destroyed.
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_manager_start_reaper(
    manager: MemplugHostManager,
    interval_ns: u64,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_start_reaper", || {
        if interval_ns == 0 {
            return Err(Error::new(S::InvalidArgument, "interval_ns is 0"));
        }
        let (m, _) = pin_manager(manager.id)?;
        m.pm.start_reaper(Duration::from_nanos(interval_ns));
        Ok(())
    })
}

/// Stops the reaper and waits up to `timeout_ns` for queued frees to
/// retire. `out_left` (may be NULL) receives the number of frees still
/// waiting afterwards (their fences did not complete in time; they stay
/// queued, never freed on a guess). Not allowed inside a callback
/// (`MEMPLUG_HOST_STATUS_REENTRANT`). Thread-safety: any thread.
///
/// # Safety
/// `out_left` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_drain(
    manager: MemplugHostManager,
    timeout_ns: u64,
    out_left: *mut u64,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_drain", || {
        not_in_callback("memplug_host_manager_drain")?;
        let (m, _) = pin_manager(manager.id)?;
        let r = m.pm.drain(Duration::from_nanos(timeout_ns));
        if !out_left.is_null() {
            // SAFETY: checked non-NULL.
            unsafe { write_out(out_left, r.left.len() as u64) };
        }
        Ok(())
    })
}

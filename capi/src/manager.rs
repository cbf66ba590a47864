//! Managers, plugins and mechanisms.

use crate::callbacks::{not_in_callback, not_in_lifecycle_callback};
use crate::common::{name_field, MemplugHostManager, MemplugHostMechanism};
use crate::error::{boundary, c_str, require_non_null, write_out, Error, Result};
use crate::handle::{self, Kind};
use crate::manager_tables::{self, existing_tables, managers, pin, pin_manager, ManagerState};
use crate::mechanism_info::{
    MemplugHostDescriptor, MemplugHostDeviceIdentity, MemplugHostMechanismInfo, MemplugHostMemoryNeeds,
    MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1, MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1,
    MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0,
};
use crate::slot_table::Removed;
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::{read_sized, write_sized};
use memplug_host_dep::registry::{Context, Requirements};
use memplug_host_dep::{LoadOptions, Location, Mechanism, MemoryNeeds, Plugin, ProcessMemoryManager};
use memplug_sdk::abi::{
    MemplugDevice, MemplugHostInfo, MemplugMessageSink, MemplugNegotiation, MemplugStatus,
    MEMPLUG_ATTR_COMPRESSED, MEMPLUG_ATTR_DEVICE_LOCAL, MEMPLUG_ATTR_HOST_COHERENT,
    MEMPLUG_ATTR_HOST_VISIBLE, MEMPLUG_ATTR_PINNED, MEMPLUG_ATTR_RDMA, MEMPLUG_ATTR_READ_ONLY_ENFORCED,
    MEMPLUG_ATTR_ZERO_FILLED, MEMPLUG_CAP_ALLOCATOR, MEMPLUG_CAP_SHARED_MAPPING, MEMPLUG_CAP_SYNC,
    MEMPLUG_CAP_VIRTUAL_BACKING, MEMPLUG_LOCATION_ANY, MEMPLUG_LOCATION_NUMA_NODE, MEMPLUG_LOCATION_TIER,
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
        let req = requirements(required)?;
        let (m, seat) = pin_manager(manager.id)?;
        let h = issue_mechanism(seat, m.pm.select(device, req)?)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, h) };
        Ok(())
    })
}

/// The requirements `required` (`MEMPLUG_CAP_*` bits) names, refusing
/// bits selection does not know.
fn requirements(required: u32) -> Result<Requirements> {
    let known =
        MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING | MEMPLUG_CAP_SYNC;
    if required & !known != 0 {
        return Err(Error::new(
            S::InvalidArgument,
            format!("unknown capability bits {:#x}", required & !known),
        ));
    }
    Ok(Requirements {
        virtual_backing: required & MEMPLUG_CAP_VIRTUAL_BACKING != 0,
        shared_mapping: required & MEMPLUG_CAP_SHARED_MAPPING != 0,
        sync: required & MEMPLUG_CAP_SYNC != 0,
    })
}

/// Every `MEMPLUG_ATTR_*` bit of the plugin ABI this library knows.
const KNOWN_ATTRIBUTES: u32 = MEMPLUG_ATTR_DEVICE_LOCAL
    | MEMPLUG_ATTR_HOST_VISIBLE
    | MEMPLUG_ATTR_HOST_COHERENT
    | MEMPLUG_ATTR_PINNED
    | MEMPLUG_ATTR_COMPRESSED
    | MEMPLUG_ATTR_RDMA
    | MEMPLUG_ATTR_READ_ONLY_ENFORCED
    | MEMPLUG_ATTR_ZERO_FILLED;

/// A location from a caller's `location_kind` and `location_id`: a
/// `MEMPLUG_LOCATION_*` kind this library knows, and an id only for the
/// kinds that name a node or tier.
pub(crate) fn location_of(kind: u32, id: u32, what: &str) -> Result<Location> {
    if kind > MEMPLUG_LOCATION_TIER {
        return Err(Error::new(S::InvalidArgument, format!("{what}: unknown location kind {kind}")));
    }
    if id != 0 && kind != MEMPLUG_LOCATION_NUMA_NODE && kind != MEMPLUG_LOCATION_TIER {
        return Err(Error::new(
            S::InvalidArgument,
            format!(
                "{what}: location id {id} with location kind {kind}, which names no node or tier (use 0)"
            ),
        ));
    }
    Ok(Location { kind, id })
}

/// A page size from a caller: 0 (none) or a power of two.
pub(crate) fn page_size_of(bytes: u64, what: &str) -> Result<u64> {
    if bytes != 0 && !bytes.is_power_of_two() {
        return Err(Error::new(
            S::InvalidArgument,
            format!("{what}: page size {bytes:#x} is not a power of two"),
        ));
    }
    Ok(bytes)
}

/// The host's needs from the caller's struct.
fn memory_needs(n: &MemplugHostMemoryNeeds) -> Result<MemoryNeeds> {
    const WHAT: &str = "MemplugHostMemoryNeeds";
    if n.attributes & !KNOWN_ATTRIBUTES != 0 {
        return Err(Error::new(
            S::InvalidArgument,
            format!("{WHAT}: unknown attribute bits {:#x}", n.attributes & !KNOWN_ATTRIBUTES),
        ));
    }
    let location = location_of(n.location_kind, n.location_id, WHAT)?;
    let page_size = page_size_of(n.page_size, WHAT)?;
    Ok(MemoryNeeds {
        attributes: n.attributes,
        location: (location.kind != MEMPLUG_LOCATION_ANY).then_some(location),
        page_size: (page_size != 0).then_some(page_size),
    })
}

/// As `memplug_host_manager_select`, also requiring what `needs` says of
/// the memory: every attribute it names, its location, a page size (judged
/// against each mechanism's descriptor, `memplug_host_mechanism_descriptor`).
/// `needs` may be NULL (no needs: the same as `memplug_host_manager_select`);
/// otherwise set `needs->struct_size` to `sizeof(MemplugHostMemoryNeeds)`.
///
/// `MEMPLUG_HOST_STATUS_NOT_FOUND` when no mechanism serves the device,
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED` when none has the capabilities and
/// meets the needs (the message lists what each candidate lacks: missing
/// attribute bits, the location it has, the page size), `_INVALID_ARGUMENT`
/// for unknown capability or attribute bits, an unknown location kind, a
/// location id with a kind that names no node or tier, a page size that is
/// not a power of two, or a short `struct_size`.
///
/// Ownership and thread-safety as `memplug_host_manager_mechanism`.
///
/// # Safety
/// `needs` must be NULL or readable for its `struct_size` bytes; `out`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_select_needing(
    manager: MemplugHostManager,
    device: MemplugDevice,
    required: u32,
    needs: *const MemplugHostMemoryNeeds,
    out: *mut MemplugHostMechanism,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_select_needing", || {
        require_non_null(out, "out")?;
        let req = requirements(required)?;
        let needs = if needs.is_null() {
            MemoryNeeds::default()
        } else {
            // SAFETY: non-NULL; the caller's contract covers the size.
            memory_needs(&unsafe { read_sized(needs, "MemplugHostMemoryNeeds") }?)?
        };
        let (m, seat) = pin_manager(manager.id)?;
        let h = issue_mechanism(seat, m.pm.select_needing(device, req, &needs)?)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, h) };
        Ok(())
    })
}

/// Describes a mechanism: device, `MEMPLUG_CAP_*` capabilities (those of
/// later ABI minors included: `MEMPLUG_CAP_TYPED_EXPORT` says it exports
/// typed handles), alignment, granularity, names. Its memory is described
/// by `memplug_host_mechanism_descriptor`, its device by
/// `memplug_host_mechanism_identity`. Set `out->struct_size` to
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

/// Describes a mechanism's memory: the plugin ABI 1.2 memory descriptor
/// (page sizes, `MEMPLUG_ATTR_*` attributes, `MEMPLUG_HANDLE_*` export
/// kinds, location, mapping at offsets, recommended granularity). Every
/// field is zero for a mechanism whose plugin agreed on an older minor.
/// Set `out->struct_size` to `sizeof(MemplugHostDescriptor)` first.
///
/// Thread-safety: any thread (the descriptor is read once, at load).
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_descriptor(
    mechanism: MemplugHostMechanism,
    out: *mut MemplugHostDescriptor,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_descriptor", || {
        require_non_null(out, "out")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let d = ctx.mechanism().properties().descriptor;
        drop(ctx);
        let value = MemplugHostDescriptor {
            struct_size: MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1,
            reserved0: 0,
            recommended_granularity: d.recommended_granularity,
            page_sizes: d.page_sizes,
            attributes: d.attributes,
            export_types: d.export_types,
            location_kind: d.location.kind,
            location_id: d.location.id,
            maps_at_offsets: u32::from(d.maps_at_offsets),
            reserved1: 0,
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, value, "MemplugHostDescriptor") }
    })
}

/// The identity of a mechanism's device (plugin ABI 1.2: UUID, PCI
/// address, sub-device, NUMA node; `valid` says which). Set
/// `out->struct_size` to `sizeof(MemplugHostDeviceIdentity)` first.
/// `MEMPLUG_HOST_STATUS_NOT_FOUND` (and `out` untouched) when the plugin
/// published none — it did not say, or it agreed on an older minor.
///
/// Thread-safety: any thread (the identity is read once, at load).
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_identity(
    mechanism: MemplugHostMechanism,
    out: *mut MemplugHostDeviceIdentity,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_identity", || {
        require_non_null(out, "out")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let m = ctx.mechanism();
        let Some(i) = m.identity() else {
            return Err(Error::new(
                S::NotFound,
                format!("mechanism {} published no device identity", m.label()),
            ));
        };
        drop(ctx);
        let value = MemplugHostDeviceIdentity {
            struct_size: MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1,
            valid: i.valid,
            uuid: i.uuid,
            pci_domain: i.pci_domain,
            pci_bus: i.pci_bus,
            pci_device: i.pci_device,
            pci_function: i.pci_function,
            sub_device: i.sub_device,
            numa_node: i.numa_node,
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, value, "MemplugHostDeviceIdentity") }
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

/// What a poll of the deferred-free queue did (`memplug_host_manager_poll`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPollReport {
    /// `sizeof(MemplugHostPollReport)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Frees retired by this poll.
    pub retired: u64,
    /// Frees the plugin refused (quarantined) during this poll.
    pub quarantined: u64,
    /// Frees still waiting for fences.
    pub pending: u64,
}

/// Size of `MemplugHostPollReport` in API 1.0.
pub const MEMPLUG_HOST_POLL_REPORT_SIZE_1_0: u32 = 32;

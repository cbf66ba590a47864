//! `descriptor.vtables`: a mechanism's sub-vtables read as untrusted
//! prefixes, their required slots checked, and the kit's `Mech` built from
//! them.

use super::*;
use crate::checks::{ensure, fail, Verdict};
use crate::raw::{DescriptorSeen, Mech};
use core::ffi::c_void;
use memplug_sdk::facts::{self, Need, Vtable};
use memplug_sdk::prefix::{self, PrefixError, Prefixed};

/// Reads a sub-vtable whose pointer was published; `what` names it.
fn vtable<T: Prefixed>(p: *const T, what: &str) -> Result<T, Verdict> {
    vtable_sized(p, what).map(|(t, _)| t)
}

/// [`vtable`] with the `struct_size` the plugin declared.
fn vtable_sized<T: Prefixed>(p: *const T, what: &str) -> Result<(T, u32), Verdict> {
    // SAFETY: plugin-owned vtable, at least struct_size bytes.
    match unsafe { prefix::read_with_size(p) } {
        Ok(t) => Ok(t),
        Err(PrefixError::Null) => fail!("{what} pointer is NULL"),
        Err(PrefixError::Short { declared, min }) => {
            fail!("{what}.struct_size {declared} is shorter than ABI 1.0's {min}")
        }
    }
}

/// Fails when `table` leaves NULL a slot the ABI says it must publish
/// (`need`: always, or with a capability the mechanism claims); `what`
/// names the table in the message.
fn required<T: Vtable>(table: &T, need: Need, what: &str) -> Result<(), Verdict> {
    let missing: Vec<&str> = facts::unpublished(table, need).collect();
    ensure!(missing.is_empty(), "{what}: required slot(s) NULL: {}", missing.join(", "));
    Ok(())
}

/// The optional slots `table` leaves NULL, as `table.slot`.
fn optional_nulls<T: Vtable>(table: &T) -> impl Iterator<Item = String> + '_ {
    facts::unpublished(table, Need::Optional).map(|slot| format!("{}.{slot}", T::NAME))
}

/// A mechanism's sub-vtables, read and checked (`descriptor.vtables`).
pub(crate) struct Tables {
    alloc: MemplugAllocator,
    vb: Option<MemplugVirtualBacking>,
    sm: Option<MemplugSharedMapping>,
    sync: Option<MemplugSync>,
    /// The 1.2 peer access table.
    peer: Option<MemplugPeerAccess>,
    /// The optional slots left NULL, as `table.slot`.
    pub(super) optional_null: Vec<String>,
}

/// Reads every sub-vtable `desc` publishes, as a host of `agreed_minor`
/// would: each at least its 1.0 size with its required slots, the 1.1
/// export slots only with `MEMPLUG_CAP_SHARED_EXPORT`.
pub(crate) fn read_tables(desc: &MemplugMechanism, agreed_minor: u32) -> Result<Tables, Verdict> {
    let caps = desc.capabilities;
    let a: MemplugAllocator = vtable(desc.allocator, "allocator")?;
    required(&a, Need::Required, "allocator")?;
    // ABI 1.2 queue-ordered binding: its slots only with the flag, at 1.2,
    // in tables long enough (a host ignores them otherwise; the flag's
    // conditions are descriptor.capabilities').
    let queued = caps & MEMPLUG_CAP_QUEUED_BINDING != 0 && agreed_minor >= 2;
    let vb = if caps & MEMPLUG_CAP_VIRTUAL_BACKING != 0 {
        let (mut v, declared): (MemplugVirtualBacking, u32) =
            vtable_sized(desc.virtual_backing, "virtual_backing")?;
        required(&v, Need::Required, "virtual_backing")?;
        if queued {
            ensure!(
                declared >= MEMPLUG_VIRTUAL_BACKING_SIZE_1_2,
                "MEMPLUG_CAP_QUEUED_BINDING is set but virtual_backing.struct_size {declared} is shorter than ABI \
                 1.2's {MEMPLUG_VIRTUAL_BACKING_SIZE_1_2} (commit_on, decommit_on)"
            );
            required(
                &v,
                Need::WithCapability(MEMPLUG_CAP_QUEUED_BINDING),
                "virtual_backing (MEMPLUG_CAP_QUEUED_BINDING is set)",
            )?;
        } else {
            (v.commit_on, v.decommit_on) = (None, None);
        }
        Some(v)
    } else {
        None
    };
    let sm = if caps & MEMPLUG_CAP_SHARED_MAPPING != 0 {
        let (mut v, declared): (MemplugSharedMapping, u32) =
            vtable_sized(desc.shared_mapping, "shared_mapping")?;
        let export = v.export_fd.is_some() || v.import_fd.is_some();
        if caps & MEMPLUG_CAP_SHARED_EXPORT != 0 {
            ensure!(
                declared >= MEMPLUG_SHARED_MAPPING_SIZE_1_1,
                "MEMPLUG_CAP_SHARED_EXPORT is set but shared_mapping.struct_size {declared} is shorter than ABI \
                 1.1's {MEMPLUG_SHARED_MAPPING_SIZE_1_1}"
            );
            required(
                &v,
                Need::WithCapability(MEMPLUG_CAP_SHARED_EXPORT),
                "shared_mapping (MEMPLUG_CAP_SHARED_EXPORT is set)",
            )?;
        } else {
            // Below 1.1 the export slots are past what the agreed minor
            // defines: a longer table is allowed, and they are ignored.
            ensure!(
                !export || agreed_minor < 1,
                "shared_mapping publishes export_fd or import_fd but MEMPLUG_CAP_SHARED_EXPORT is not set"
            );
            v.export_fd = None;
            v.import_fd = None;
        }
        let typed = v.export_handle.is_some() || v.import_handle.is_some();
        if caps & MEMPLUG_CAP_TYPED_EXPORT != 0 && agreed_minor >= 2 {
            ensure!(
                declared >= MEMPLUG_SHARED_MAPPING_SIZE_1_2,
                "MEMPLUG_CAP_TYPED_EXPORT is set but shared_mapping.struct_size {declared} is shorter than ABI \
                 1.2's {MEMPLUG_SHARED_MAPPING_SIZE_1_2}"
            );
            required(
                &v,
                Need::WithCapability(MEMPLUG_CAP_TYPED_EXPORT),
                "shared_mapping (MEMPLUG_CAP_TYPED_EXPORT is set)",
            )?;
        } else {
            // Below 1.2 the typed slots are past what the agreed minor
            // defines (and the flag is descriptor.capabilities' failure):
            // ignored, as a host ignores them.
            ensure!(
                !typed || agreed_minor < 2 || declared < MEMPLUG_SHARED_MAPPING_SIZE_1_2,
                "shared_mapping publishes export_handle or import_handle but MEMPLUG_CAP_TYPED_EXPORT is not set"
            );
            v.export_handle = None;
            v.import_handle = None;
        }
        if queued {
            ensure!(
                declared >= MEMPLUG_SHARED_MAPPING_SIZE_1_2,
                "MEMPLUG_CAP_QUEUED_BINDING is set but shared_mapping.struct_size {declared} is shorter than ABI \
                 1.2's {MEMPLUG_SHARED_MAPPING_SIZE_1_2} (map_on, unmap_on)"
            );
            required(
                &v,
                Need::WithCapability(MEMPLUG_CAP_QUEUED_BINDING),
                "shared_mapping (MEMPLUG_CAP_QUEUED_BINDING is set)",
            )?;
        } else {
            (v.map_on, v.unmap_on) = (None, None);
        }
        required(&v, Need::Required, "shared_mapping")?;
        Some(v)
    } else {
        None
    };
    let sync = if caps & MEMPLUG_CAP_SYNC != 0 {
        let mut v: MemplugSync = vtable(desc.sync, "sync")?;
        required(&v, Need::Required, "sync")?;
        if agreed_minor < 2 {
            // The 1.2 slots are past what the agreed minor defines.
            (v.stream_wait_fence, v.stream_adopt_typed) = (None, None);
        }
        if agreed_minor < 3 {
            v.copy = None; // 1.3's
        }
        Some(v)
    } else {
        None
    };
    if queued && (vb.is_none() || sync.is_none()) {
        fail!("MEMPLUG_CAP_QUEUED_BINDING is set without MEMPLUG_CAP_VIRTUAL_BACKING and MEMPLUG_CAP_SYNC");
    }
    // ABI 1.2 peer access: the table, at its size with both slots, when
    // the flag is set (the pointer's agreement with it is
    // descriptor.capabilities').
    let peer = if caps & MEMPLUG_CAP_PEER_ACCESS != 0 && agreed_minor >= 2 && !desc.peer_access.is_null() {
        let v: MemplugPeerAccess = vtable(desc.peer_access, "peer_access")?;
        required(&v, Need::Required, "peer_access")?;
        Some(v)
    } else {
        None
    };
    let mut optional_null: Vec<String> = Vec::new();
    optional_null.extend(optional_nulls(&a));
    if let Some(s) = &sync {
        let since = |slot: &String| {
            MemplugSync::SLOTS
                .iter()
                .find(|f| format!("sync.{}", f.name) == *slot)
                .map_or(0, |f| f.since_minor)
        };
        optional_null.extend(optional_nulls(s).filter(|slot| since(slot) <= agreed_minor));
    }
    Ok(Tables { alloc: a, vb, sm, sync, peer, optional_null })
}

/// The kit's view of a mechanism whose tables were read (properties still
/// default).
pub(crate) fn mech_of(
    name: &str,
    desc: &MemplugMechanism,
    t: Tables,
    agreed_minor: u32,
    live_objects: unsafe extern "C" fn(*mut c_void) -> u64,
    plugin_ctx: *mut c_void,
) -> Mech {
    Mech {
        name: name.to_string(),
        id: desc.mechanism_id,
        device: desc.device,
        caps: desc.capabilities,
        ctx: desc.ctx,
        agreed_minor,
        plugin_max_minor: agreed_minor,
        alloc: t.alloc,
        vb: t.vb,
        sm: t.sm,
        sync: t.sync,
        peer: t.peer,
        props: MemplugProperties::default(),
        descriptor: DescriptorSeen::Older,
        // Present only in a 1.2-sized descriptor at an agreed minor of 2
        // (prefix reads leave a shorter one's NULL).
        identity: if agreed_minor >= 2 { desc.identity } else { core::ptr::null() },
        live_objects,
        plugin_ctx,
    }
}

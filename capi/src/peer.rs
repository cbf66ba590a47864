//! Peer access (C API 1.1, plugin ABI 1.2 `MEMPLUG_CAP_PEER_ACCESS`): which
//! other devices a mechanism's memory can be opened to, and opening a
//! range of a region to one.

use crate::callbacks::lock_region;
use crate::common::{MemplugHostMechanism, MemplugHostRegion};
use crate::error::{boundary, require_non_null, write_out, Error};
use crate::manager_tables::{pin, RegionEntry};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::registry::Context;
use memplug_host_dep::Access;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_ACCESS_READ, MEMPLUG_ACCESS_WRITE};
use std::sync::Arc;

/// Asks a mechanism what access device `peer` can be given to its memory:
/// `out_access` receives `MEMPLUG_ACCESS_*` bits (memplug.h;
/// `MEMPLUG_ACCESS_READ`, or `_READ | _WRITE`), 0 when the peer can be given
/// none (an unreachable device is an answer, not an error).
///
/// A mechanism without `MEMPLUG_CAP_PEER_ACCESS` (`MemplugHostMechanismInfo`
/// `capabilities`; never set by a plugin that agreed on an ABI minor below
/// 1.2) refuses with `MEMPLUG_HOST_STATUS_UNSUPPORTED` and a message saying
/// so. A plugin's own refusal (an unknown device) comes back with its code.
///
/// Granting access to a range of a region is
/// `memplug_host_region_set_peer_access`. Thread-safety: any thread.
///
/// # Safety
/// `out_access` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_can_access_peer(
    mechanism: MemplugHostMechanism,
    peer: MemplugDevice,
    out_access: *mut u32,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_can_access_peer", || {
        require_non_null(out_access, "out_access")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let mech = ctx.mechanism().clone();
        drop(ctx);
        let pa = mech.peer_access().ok_or_else(|| {
            Error::new(
                S::Unsupported,
                format!(
                    "mechanism {} has no peer access (MEMPLUG_CAP_PEER_ACCESS, plugin ABI 1.2)",
                    mech.label()
                ),
            )
        })?;
        let access = pa.can_access_peer(peer)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_access, access.map_or(0, |a| a.bits())) };
        Ok(())
    })
}

/// Sets what device `peer` may do with `[offset, offset + len)` of a
/// region (offsets from the region's base, its prefix included):
/// `access` is `MEMPLUG_ACCESS_READ`, `MEMPLUG_ACCESS_READ |
/// MEMPLUG_ACCESS_WRITE` (memplug.h), or 0 to revoke. See
/// `memplug_host_mechanism_can_access_peer` for what a peer can be given.
///
/// Refusals, each leaving everything as it was:
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED` when the region's mechanism has no
/// `MEMPLUG_CAP_PEER_ACCESS` (with a message saying so);
/// `_INVALID_ARGUMENT` for other `access` bits, or for write access to a
/// range overlapping a prefix mapped read-only; `_OUT_OF_RANGE` for a
/// range that is empty, overflows, is not aligned to the mechanism's
/// granularity, or goes past the region's usable bytes (`len` of
/// `MemplugHostRegionInfo`: the prefix and the committed private part);
/// `_BUSY` for a range committed by `memplug_host_region_grow_on` whose
/// fence has not completed. The plugin's own refusals (more than it
/// allows that peer: `_UNSUPPORTED`; an unknown device) come back with
/// their codes. Nothing is charged.
///
/// A revoke must not race the peer's work still using the range: the
/// caller orders that. Thread-safety: any thread; calls on one region are
/// serialised.
#[no_mangle]
pub extern "C" fn memplug_host_region_set_peer_access(
    region: MemplugHostRegion,
    offset: u64,
    len: u64,
    peer: MemplugDevice,
    access: u32,
) -> MemplugHostStatus {
    boundary("memplug_host_region_set_peer_access", || {
        let (e, _) = pin::<RegionEntry>(region.id)?;
        let access = match access {
            0 => None,
            a => Some(Access::from_bits(a).ok_or_else(|| {
                Error::new(
                    S::InvalidArgument,
                    format!(
                        "access {a:#x} is not 0, MEMPLUG_ACCESS_READ ({MEMPLUG_ACCESS_READ:#x}) or \
                         MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE ({:#x})",
                        MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE
                    ),
                )
            })?),
        };
        let mut l = lock_region(&e)?;
        l.guard.set_peer_access(offset, len, peer, access)?;
        Ok(())
    })
}

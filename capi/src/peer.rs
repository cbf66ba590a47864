//! Peer access (C API 1.1, plugin ABI 1.2 `MEMPLUG_CAP_PEER_ACCESS`): which
//! other devices a mechanism's memory can be opened to.

use crate::error::{boundary, require_non_null, write_out, Error};
use crate::manager_tables::pin;
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::types::MemplugHostMechanism;
use memplug_host_dep::registry::Context;
use memplug_sdk::abi::MemplugDevice;
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
/// Granting access to a range (the plugin's `set_peer_access`) is not in
/// this API yet. Thread-safety: any thread.
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

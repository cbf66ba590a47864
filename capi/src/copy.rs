//! The plugin ABI 1.3 stream-ordered copy through the C API (C API 1.3).

use crate::common::{MemplugHostMechanism, MemplugHostStream};
use crate::error::{boundary, require_non_null, write_out, Error};
use crate::manager_tables::{pin, StreamEntry};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::registry::Context;
use std::sync::Arc;

/// The address spaces `mechanism`'s copy copies between: `MEMPLUG_COPY_*`
/// bits of memplug.h (its own memory, host memory, a peer device's), 0 for
/// a mechanism without the copy (no sync capability, a plugin older than
/// ABI 1.3, or one that does not publish it). Thread-safety: any thread.
///
/// # Safety
/// `out_kinds` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_copy_kinds(
    mechanism: MemplugHostMechanism,
    out_kinds: *mut u32,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_copy_kinds", || {
        require_non_null(out_kinds, "out_kinds")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let kinds = ctx.mechanism().sync().map_or(0, |s| s.copy_kinds().0);
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_kinds, kinds) };
        Ok(())
    })
}

/// Copies `len` bytes from `src` to `dst` on `stream`: after the work
/// enqueued on it before, and before the work (and the fences) enqueued
/// after. Returns once the copy is queued, not done: record a fence after
/// it to know when. `len` 0 is a no-op.
///
/// Refused before the plugin is called: `MEMPLUG_HOST_STATUS_OUT_OF_RANGE`
/// for a range whose end does not fit in 64 bits,
/// `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT` for overlapping ranges,
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED` for a mechanism without the copy
/// (`memplug_host_mechanism_copy_kinds` says 0), `_INVALID_STATE` for a
/// destroyed stream. The plugin refuses ranges outside memory it can copy
/// (`_OUT_OF_RANGE`) and address spaces it does not publish (`_UNSUPPORTED`).
/// Thread-safety: any thread.
///
/// # Safety
/// The plugin writes `len` bytes at `dst`: `[src, src + len)` must stay
/// readable and `[dst, dst + len)` writable, and nothing else may write
/// either (or read `dst`) until the copy is done; memory of the mechanism
/// must stay allocated until then (free it behind a fence recorded after the
/// copy).
#[no_mangle]
pub unsafe extern "C" fn memplug_host_stream_copy(
    stream: MemplugHostStream,
    dst: u64,
    src: u64,
    len: u64,
) -> MemplugHostStatus {
    boundary("memplug_host_stream_copy", || {
        let (e, _) = pin::<StreamEntry>(stream.id)?;
        let guard = e.stream.lock().unwrap_or_else(|p| p.into_inner());
        let s = guard.as_ref().ok_or_else(|| Error::new(S::InvalidState, "the stream was destroyed"))?;
        let sync = e.mechanism.sync().expect("a stream's mechanism has the sync capability");
        // SAFETY: the caller's contract, as documented above.
        unsafe { sync.copy(s, dst, src, len) }?;
        Ok(())
    })
}

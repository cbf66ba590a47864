//! The slot ABI 1.3 adds: the stream-ordered copy. Same rules as
//! `thunks.rs`: what the SDK can judge from the arguments alone is judged
//! before the vendor's trait sees them.

use super::context::mech;
use super::guard::guard;
use crate::abi::*;
use crate::author::*;
use core::ffi::c_void;

pub(super) unsafe extern "C" fn y_copy<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    dst: u64,
    src: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "copy", || {
        let m = mech::<M>(ctx)?;
        // A copy of nothing is done (the ABI's no-op); wrapping and
        // overlapping ranges are refused before anything is enqueued.
        match crate::check_copy_ranges(dst, src, len) {
            Ok(true) => m.imp.copy(stream, dst, src, len),
            Ok(false) => Ok(()),
            Err(e) => Err(PluginError::new(e.status(), format!("copy: {e}"))),
        }
    })
}

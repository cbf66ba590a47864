//! The stream-ordered copy of ABI 1.3: `len` bytes from `src` to `dst`,
//! enqueued on a stream of the mechanism. The host refuses, before the
//! plugin sees them, what it can judge from the numbers (a range wrapping
//! around the address space, overlapping ranges: the checks are the SDK's
//! [`check_copy_ranges`], the one statement of them), a stream of another
//! mechanism, and a copy the mechanism does not publish; whether each range
//! lies in memory the mechanism can copy is the plugin's to judge.

use super::{CopyKinds, SyncApi};
use crate::error::CallError;
use crate::tokens::Stream;
use memplug_sdk::{check_copy_ranges, Status};

impl SyncApi<'_> {
    /// Whether [`copy`](Self::copy) reaches the plugin: it agreed on ABI
    /// 1.3 or newer and publishes the slot.
    pub fn can_copy(&self) -> bool {
        self.vt.copy.is_some()
    }

    /// The address spaces the copy copies between (none without one).
    pub fn copy_kinds(&self) -> CopyKinds {
        self.m.props.copy_kinds
    }

    /// Enqueues on `stream` a copy of `len` bytes from address `src` to
    /// address `dst`, after the work enqueued on it before and before the
    /// work enqueued after (a fence recorded next completes once the bytes
    /// are at `dst`); returns without waiting. `len` 0 does nothing (the
    /// plugin is not called). Refused: `Unsupported` without the slot,
    /// `OutOfRange` for a range whose end does not fit in 64 bits,
    /// `InvalidArgument` for overlapping ranges, `WrongMechanism` for a
    /// stream of another mechanism; the plugin refuses ranges outside
    /// memory it can copy (`OutOfRange`) and spaces it does not publish
    /// (`Unsupported`).
    ///
    /// # Safety
    /// The plugin writes `len` bytes at `dst`, and for host memory
    /// (`MEMPLUG_COPY_HOST`) it cannot tell a live buffer from any other
    /// address: the caller vouches that `[src, src + len)` stays readable
    /// and `[dst, dst + len)` writable, and that nothing else reads or
    /// writes `dst`'s bytes (or writes `src`'s), until the copy is done. Memory of
    /// the mechanism stays the caller's to keep alive until then too: free
    /// or decommit it only behind a fence recorded after the copy.
    pub unsafe fn copy(&self, stream: &Stream, dst: u64, src: u64, len: u64) -> Result<(), CallError> {
        const SLOT: &str = "sync.copy";
        let m = self.m;
        let Some(f) = self.vt.copy else {
            let why = if m.minor < 3 {
                format!("the plugin agreed on ABI 1.{}; the stream-ordered copy is ABI 1.3", m.minor)
            } else {
                "the plugin does not publish copy (ABI 1.3, optional)".into()
            };
            return Err(m.refuse(SLOT, Status::Unsupported, why));
        };
        m.check_handle_made_here(SLOT, stream.mechanism_key, "stream")?;
        match check_copy_ranges(dst, src, len) {
            Ok(true) => m.call(SLOT, f, (stream.handle, dst, src, len)),
            Ok(false) => Ok(()),
            Err(e) => Err(m.refuse(SLOT, e.status(), e.to_string())),
        }
    }
}

//! Optional capability: streams and fences (`StreamSync`).

use super::*;
use core::ffi::c_void;
use std::time::Duration;

/// Optional capability: streams and fences. (Named `StreamSync` so it does
/// not shadow `std::marker::Sync`.)
///
/// Streams and fences are your own non-zero `u64` handles; the SDK cannot
/// check them, so every method that takes one must refuse a handle that
/// names no live stream or fence of this mechanism with
/// `UNKNOWN_ALLOCATION`. The SDK checks the host's out-pointers (non-NULL,
/// before calling you) and a host function's pointer, and maps
/// [`FenceState::Pending`] to `NOT_READY` (query) or `TIMEOUT` (wait)
/// without a message.
pub trait StreamSync: Send + Sync + 'static {
    /// Whether `stream_adopt` is published.
    const CAN_ADOPT: bool = false;

    /// Creates a stream owned by the plugin.
    fn stream_create(&self) -> PluginResult<u64>;
    /// Wraps a runtime's native stream without owning it. Called only when
    /// `CAN_ADOPT` is true; `native` is unchecked (refuse NULL with
    /// `INVALID_ARGUMENT`).
    fn stream_adopt(&self, _native: *mut c_void) -> PluginResult<u64> {
        Err(PluginError::unsupported("stream_adopt is not published"))
    }
    /// Destroys a stream after its submitted work has run (blocks until
    /// then); from one of the stream's own host functions it is `BUSY` and
    /// destroys nothing.
    fn stream_destroy(&self, stream: u64) -> PluginResult<()>;
    /// Runs `f` on the stream after the work submitted before it: exactly
    /// once when this returns `Ok`, never when it fails.
    fn enqueue_host_fn(&self, stream: u64, f: HostFn) -> PluginResult<()>;
    /// Records a fence that completes when the work submitted to `stream`
    /// before it has run.
    fn fence_record(&self, stream: u64) -> PluginResult<u64>;
    /// Whether the fence has completed; never blocks. Monotonic: once
    /// complete, complete until destroyed.
    fn fence_query(&self, fence: u64) -> PluginResult<FenceState>;
    /// Blocks until the fence completes or `timeout` passes. The host's
    /// `UINT64_MAX` nanoseconds (the largest `Duration` this is given)
    /// means no limit: never answer `Pending` then.
    fn fence_wait(&self, fence: u64, timeout: Duration) -> PluginResult<FenceState>;
    /// Destroys a fence handle, complete or not.
    fn fence_destroy(&self, fence: u64) -> PluginResult<()>;

    /// Whether `stream_wait_fence` is published (ABI 1.2).
    const CAN_WAIT_FENCE: bool = false;
    /// Later work on `stream` waits for `fence` (one of yours, possibly of
    /// another stream), without blocking the caller. Both handles are
    /// yours to check.
    fn stream_wait_fence(&self, _stream: u64, _fence: u64) -> PluginResult<()> {
        Err(PluginError::unsupported("stream_wait_fence is not published"))
    }

    /// Whether `stream_adopt_typed` is published (ABI 1.2).
    const CAN_ADOPT_TYPED: bool = false;
    /// [`stream_adopt`](Self::stream_adopt) with the native stream's API
    /// named by its `MEMPLUG_DEVICE_*` kind; refuse a kind you do not adopt
    /// with `UNSUPPORTED`.
    fn stream_adopt_typed(&self, _native_kind: u32, _native: *mut c_void) -> PluginResult<u64> {
        Err(PluginError::unsupported("stream_adopt_typed is not published"))
    }

    /// Whether `copy` is published (ABI 1.3). [`copy_kinds`](Self::copy_kinds)
    /// must then name at least one address space.
    const CAN_COPY: bool = false;
    /// The `MEMPLUG_COPY_*` spaces `copy` copies between, published in the
    /// properties to hosts of 1.3 (called once, when the sync capability is
    /// added to the mechanism; ignored without `CAN_COPY`).
    fn copy_kinds(&self) -> u32 {
        0
    }
    /// Enqueues on `stream` a copy of `len` bytes from `src` to `dst`, after
    /// the work before it and before the work after it; returns without
    /// waiting. The SDK has answered `len` 0 with `OK` and refused ranges
    /// that wrap or overlap ([`crate::check_copy_ranges`]), so `len > 0`
    /// and the ranges are disjoint; whether each lies in memory you can
    /// copy (inside one of your allocations or committed or mapped ranges:
    /// `OUT_OF_RANGE` past one; `UNSUPPORTED` in a space you do not
    /// publish) and the stream are yours to check, before enqueuing.
    fn copy(&self, _stream: u64, _dst: u64, _src: u64, _len: u64) -> PluginResult<()> {
        Err(PluginError::unsupported("copy is not published"))
    }
}

//! Optional capability: the `MemplugSync` table (streams, fences, host
//! functions and stream-ordered copies).

use super::*;
use core::ffi::c_void;

/// A function the host asks a stream to run, in order with the stream's other
/// work, on a thread of the plugin's choosing. It must not unwind.
pub type MemplugHostFn = Option<unsafe extern "C" fn(userdata: *mut c_void)>;

/// Optional capability: streams (ordered queues of device work) and fences
/// (points in a stream that complete when the work before them has run).
/// Streams and fences are opaque non-zero `uint64_t` handles.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugSync {
    /// `sizeof(MemplugSync)` as the plugin knows it.
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Required. Creates a stream owned by the plugin.
    pub stream_create: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            out_stream: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Optional (NULL when unsupported). Wraps a runtime's native stream
    /// (for CUDA a `CUstream`) without taking ownership of it.
    pub stream_adopt: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            native: *mut c_void,
            out_stream: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Destroys a stream after the work already submitted to it
    /// has run (blocks until then). Fences recorded on it stay valid: each
    /// completes (it already has, once this returns) and stays complete
    /// until destroyed. Called from one of the stream's own host functions
    /// it returns `MEMPLUG_STATUS_BUSY` and destroys nothing.
    pub stream_destroy: Option<
        unsafe extern "C" fn(ctx: *mut c_void, stream: u64, sink: *const MemplugMessageSink) -> MemplugStatus,
    >,
    /// Required. Runs `func(userdata)` on the stream after the work submitted
    /// before it, exactly once when this returns `MEMPLUG_STATUS_OK` and
    /// never when it returns a failure. A plugin for an API without host
    /// callbacks meets this with a thread that waits on an event recorded
    /// behind the work, then calls `func`.
    pub enqueue_host_fn: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            stream: u64,
            func: MemplugHostFn,
            userdata: *mut c_void,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Records a fence that completes when the work submitted to
    /// `stream` before it has run.
    pub fence_record: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            stream: u64,
            out_fence: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. `MEMPLUG_STATUS_OK` when complete, `MEMPLUG_STATUS_NOT_READY`
    /// when not; never blocks. Monotonic: once a fence has reported
    /// complete (here or through `fence_wait`) it reports complete until it
    /// is destroyed.
    pub fence_query: Option<
        unsafe extern "C" fn(ctx: *mut c_void, fence: u64, sink: *const MemplugMessageSink) -> MemplugStatus,
    >,
    /// Required. Blocks until the fence completes (`MEMPLUG_STATUS_OK`) or
    /// `timeout_ns` passes (`MEMPLUG_STATUS_TIMEOUT`). A `timeout_ns` of
    /// `UINT64_MAX` waits without limit: it never returns
    /// `MEMPLUG_STATUS_TIMEOUT`. Zero polls, as `fence_query` does.
    pub fence_wait: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            fence: u64,
            timeout_ns: u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Destroys a fence handle (complete or not).
    pub fence_destroy: Option<
        unsafe extern "C" fn(ctx: *mut c_void, fence: u64, sink: *const MemplugMessageSink) -> MemplugStatus,
    >,
    /// Since 1.2. Optional (NULL when unsupported). Work enqueued on
    /// `stream` after this call waits for `fence` (a fence of this
    /// mechanism, possibly of another of its streams) to complete, without
    /// blocking the caller.
    pub stream_wait_fence: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            stream: u64,
            fence: u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.2. Optional (NULL when unsupported). `stream_adopt` with the
    /// native stream's API named: `native_kind` is the `MEMPLUG_DEVICE_*`
    /// kind whose API made it (`MEMPLUG_DEVICE_CUDA` for a `CUstream`). A
    /// kind the plugin does not adopt is `MEMPLUG_STATUS_UNSUPPORTED`.
    pub stream_adopt_typed: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            native_kind: u32,
            native: *mut c_void,
            out_stream: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.3. Optional (NULL when unsupported; a host then answers
    /// `MEMPLUG_STATUS_UNSUPPORTED` itself). Enqueues on `stream` a copy of
    /// `len` bytes from address `src` to address `dst`, and returns without
    /// waiting for it. Ordering: the copy starts after the work submitted
    /// to `stream` before it has run (host functions included) and
    /// completes before any work submitted after it (a fence recorded after
    /// it completes only once the bytes are at `dst`). Each range lies in a
    /// space `MemplugProperties::copy_kinds` publishes; a range in the
    /// mechanism's own memory lies wholly inside one allocation or one
    /// committed or mapped part of a reservation. Checked before anything is
    /// enqueued, each refusal changing nothing: `len` 0 is `OK` and does
    /// nothing; ranges that overlap are `MEMPLUG_STATUS_INVALID_ARGUMENT`
    /// (there are no `memmove` semantics); a range that wraps around the
    /// address space, or that starts or ends outside the mechanism's memory
    /// it partly lies in (past the end of an allocation, into an
    /// uncommitted part of a reservation, in unmapped device memory), is
    /// `MEMPLUG_STATUS_OUT_OF_RANGE`; a range in a space the mechanism does
    /// not publish is `MEMPLUG_STATUS_UNSUPPORTED`; an unknown `stream`
    /// is `MEMPLUG_STATUS_UNKNOWN_ALLOCATION`. Like device work, a copy
    /// must finish before its memory is decommitted, unmapped or freed
    /// (the host orders that behind a fence recorded after it).
    pub copy: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            stream: u64,
            dst: u64,
            src: u64,
            len: u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
}

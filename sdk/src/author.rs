//! What a vendor writing a plugin in Rust implements: safe traits, one per
//! capability. The export layer ([`crate::export`]) turns them into vtables; no
//! vendor code is `unsafe extern "C"`.

use crate::abi::{self, MemplugDevice, MemplugObjectRef};
use crate::status::Status;
use core::ffi::c_void;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

/// A failure a plugin reports: a status code (never `Ok`) and a message the
/// host receives through its sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    pub status: Status,
    pub message: String,
}

impl PluginError {
    /// A failure with `status`; an `Ok` status is turned into `Internal`,
    /// because an error that says "success" is a contradiction.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        let status = if status == Status::Ok { Status::Internal } else { status };
        PluginError { status, message: message.into() }
    }
    pub fn unsupported(m: impl Into<String>) -> Self {
        Self::new(Status::Unsupported, m)
    }
    pub fn invalid_argument(m: impl Into<String>) -> Self {
        Self::new(Status::InvalidArgument, m)
    }
    pub fn out_of_memory(m: impl Into<String>) -> Self {
        Self::new(Status::OutOfMemory, m)
    }
    pub fn out_of_range(m: impl Into<String>) -> Self {
        Self::new(Status::OutOfRange, m)
    }
    pub fn invalid_state(m: impl Into<String>) -> Self {
        Self::new(Status::InvalidState, m)
    }
    pub fn unknown_allocation(m: impl Into<String>) -> Self {
        Self::new(Status::UnknownAllocation, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(Status::Internal, m)
    }
}

impl core::fmt::Display for PluginError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for PluginError {}

pub type PluginResult<T> = Result<T, PluginError>;

/// A request as the plugin sees it (the prefix the host sent, zero-extended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u32,
    pub size: u64,
    pub alignment: u64,
    pub object_id: u64,
    pub device: MemplugDevice,
    /// The raw `MEMPLUG_CLASS_*` tag (ABI 1.1); `MEMPLUG_CLASS_OTHER` when
    /// the host sent a 1.0 request. Read it through [`Request::class`],
    /// which maps values this SDK does not know to `Other`.
    pub class_tag: u32,
}

impl Request {
    /// What the memory is for; unknown tags are `Other` (ABI rule).
    #[inline]
    pub fn class(&self) -> RequestClass {
        RequestClass::from_tag(self.class_tag)
    }
}

/// The allocation class a host tagged a request with (ABI 1.1,
/// `MEMPLUG_CLASS_*`). A hint for placement and accounting; it never
/// changes whether a call succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestClass {
    /// `MEMPLUG_CLASS_OTHER`, and every tag this SDK does not know.
    Other,
    /// `MEMPLUG_CLASS_WEIGHTS`.
    Weights,
    /// `MEMPLUG_CLASS_KV`.
    Kv,
    /// `MEMPLUG_CLASS_ACTIVATIONS`.
    Activations,
    /// `MEMPLUG_CLASS_WORKSPACE`.
    Workspace,
}

impl RequestClass {
    /// Every class, in tag order (`ALL[c.tag()] == c`).
    pub const ALL: [RequestClass; 5] = [
        RequestClass::Other,
        RequestClass::Weights,
        RequestClass::Kv,
        RequestClass::Activations,
        RequestClass::Workspace,
    ];

    /// Decodes a tag; unknown values are `Other`, the most conservative
    /// meaning.
    #[inline]
    pub const fn from_tag(tag: u32) -> RequestClass {
        match tag {
            abi::MEMPLUG_CLASS_WEIGHTS => RequestClass::Weights,
            abi::MEMPLUG_CLASS_KV => RequestClass::Kv,
            abi::MEMPLUG_CLASS_ACTIVATIONS => RequestClass::Activations,
            abi::MEMPLUG_CLASS_WORKSPACE => RequestClass::Workspace,
            _ => RequestClass::Other,
        }
    }

    /// The `MEMPLUG_CLASS_*` value.
    #[inline]
    pub const fn tag(self) -> u32 {
        match self {
            RequestClass::Other => abi::MEMPLUG_CLASS_OTHER,
            RequestClass::Weights => abi::MEMPLUG_CLASS_WEIGHTS,
            RequestClass::Kv => abi::MEMPLUG_CLASS_KV,
            RequestClass::Activations => abi::MEMPLUG_CLASS_ACTIVATIONS,
            RequestClass::Workspace => abi::MEMPLUG_CLASS_WORKSPACE,
        }
    }
}

/// An object a plugin made: address (zero for a physical object), actual
/// size, and the plugin's own handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    pub handle: u64,
}

/// The host's name for an object the plugin made earlier. Untrusted: a
/// plugin checks mechanism, device and handle before believing it.
pub type ObjectRef = MemplugObjectRef;

/// Static properties of a mechanism.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Properties {
    pub min_alignment: u64,
    pub max_alignment: u64,
    pub granularity: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// Whether a fence has completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceState {
    Complete,
    Pending,
}

/// A host function to run on a stream. Sending it to another thread is what
/// the ABI asks for; the host promises `userdata` may be used from there.
#[derive(Clone, Copy, Debug)]
pub struct HostFn {
    func: unsafe extern "C" fn(*mut c_void),
    userdata: *mut c_void,
}

// SAFETY: the ABI requires a host function and its userdata to be callable
// from any plugin thread (DESIGN.md §3, Sync).
unsafe impl Send for HostFn {}

impl HostFn {
    /// # Safety
    /// `func(userdata)` must be callable once from any thread.
    pub unsafe fn new(func: unsafe extern "C" fn(*mut c_void), userdata: *mut c_void) -> Self {
        HostFn { func, userdata }
    }

    /// Runs the function. Host functions must not unwind (the ABI forbids
    /// it), so nothing is caught here.
    pub fn call(self) {
        // SAFETY: guaranteed by the constructor's contract.
        unsafe { (self.func)(self.userdata) }
    }
}

/// Required capability: plain allocations.
pub trait Allocator: Send + Sync + 'static {
    /// Whether `memory_info` is published; when false the slot is NULL and
    /// the host reports the absence.
    const HAS_MEMORY_INFO: bool = false;

    fn properties(&self) -> Properties;
    fn allocate(&self, request: &Request) -> PluginResult<Block>;
    fn deallocate(&self, object: &ObjectRef) -> PluginResult<()>;
    /// Called only when `HAS_MEMORY_INFO` is true.
    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        Err(PluginError::unsupported("memory_info is not published"))
    }
}

/// Optional capability: reserve, commit, decommit, release.
pub trait VirtualBacking: Send + Sync + 'static {
    fn reserve(&self, request: &Request) -> PluginResult<Block>;
    fn commit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    fn decommit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    fn committed_bytes(&self, reservation: &ObjectRef) -> PluginResult<u64>;
    fn release(&self, reservation: &ObjectRef) -> PluginResult<()>;
}

/// Access of a shared mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

impl Access {
    /// Decodes `MEMPLUG_ACCESS_*` bits; anything but read or read|write is
    /// refused rather than guessed at.
    pub fn from_bits(bits: u32) -> Option<Access> {
        match bits {
            abi::MEMPLUG_ACCESS_READ => Some(Access::ReadOnly),
            b if b == abi::MEMPLUG_ACCESS_READ | abi::MEMPLUG_ACCESS_WRITE => Some(Access::ReadWrite),
            _ => None,
        }
    }
    pub fn bits(self) -> u32 {
        match self {
            Access::ReadOnly => abi::MEMPLUG_ACCESS_READ,
            Access::ReadWrite => abi::MEMPLUG_ACCESS_READ | abi::MEMPLUG_ACCESS_WRITE,
        }
    }
}

/// Optional capability: physical objects mapped into reservations.
pub trait SharedMapping: Send + Sync + 'static {
    fn create(&self, request: &Request) -> PluginResult<Block>;
    #[allow(clippy::too_many_arguments)]
    fn map(
        &self,
        object: &ObjectRef,
        object_offset: u64,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
    ) -> PluginResult<()>;
    fn unmap(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    fn retain(&self, object: &ObjectRef) -> PluginResult<()>;
    fn release(&self, object: &ObjectRef) -> PluginResult<()>;

    /// Whether `export_fd` and `import_fd` are published (ABI 1.1,
    /// `MEMPLUG_CAP_SHARED_EXPORT`). When false the slots are NULL, the
    /// flag is clear, and the two methods below are never called. Hosts
    /// that agreed on 1.0 never see them either way.
    const CAN_EXPORT: bool = false;

    /// A new descriptor for the memory of a live physical object, owned by
    /// the caller (the host, which may pass it to another process). Called
    /// only when `CAN_EXPORT` is true.
    fn export_fd(&self, _object: &ObjectRef) -> PluginResult<OwnedFd> {
        Err(PluginError::unsupported("export_fd is not published"))
    }

    /// A physical object backed by the memory `fd` names, of
    /// `request.size` bytes (rounded up to the granularity), holding one
    /// reference as from `create`. `fd` stays the caller's: duplicate what
    /// you keep. Called only when `CAN_EXPORT` is true.
    fn import_fd(&self, _fd: BorrowedFd<'_>, _request: &Request) -> PluginResult<Block> {
        Err(PluginError::unsupported("import_fd is not published"))
    }
}

/// Optional capability: streams and fences. (Named `StreamSync` so it does
/// not shadow `std::marker::Sync`.)
pub trait StreamSync: Send + Sync + 'static {
    /// Whether `stream_adopt` is published.
    const CAN_ADOPT: bool = false;

    fn stream_create(&self) -> PluginResult<u64>;
    /// Called only when `CAN_ADOPT` is true.
    fn stream_adopt(&self, _native: *mut c_void) -> PluginResult<u64> {
        Err(PluginError::unsupported("stream_adopt is not published"))
    }
    fn stream_destroy(&self, stream: u64) -> PluginResult<()>;
    fn enqueue_host_fn(&self, stream: u64, f: HostFn) -> PluginResult<()>;
    fn fence_record(&self, stream: u64) -> PluginResult<u64>;
    fn fence_query(&self, fence: u64) -> PluginResult<FenceState>;
    fn fence_wait(&self, fence: u64, timeout: Duration) -> PluginResult<FenceState>;
    fn fence_destroy(&self, fence: u64) -> PluginResult<()>;
}

//! The values the capability traits take and give back: a request and its
//! class, a block, an object reference, properties, memory information, a
//! fence's state, a host function to run on a stream.

// The other capability items, for the documentation's links.
#[cfg(doc)]
use super::*;

use crate::abi::{self, MemplugDevice, MemplugObjectRef};
use core::ffi::c_void;

/// A request as the plugin sees it: the prefix the host sent, zero-extended,
/// after the SDK's checks.
///
/// By the time a trait method sees it, the SDK has refused (before calling
/// you) every request whose `flags` has a bit no ABI minor defines, whose
/// `size` is zero, or whose `device` is not the mechanism's, so `flags` is
/// zero, `size` is at least 1 and `device` is the one given to
/// [`MechanismBuilder::new`](crate::MechanismBuilder::new). For
/// [`Allocator::allocate`] the alignment is checked too (see
/// [`Request::alignment`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// `MEMPLUG_REQUEST` flags: none is defined up to ABI 1.1, and the SDK
    /// refuses unknown bits, so this is zero when you see it.
    pub flags: u32,
    /// Bytes wanted; never zero when you see it.
    pub size: u64,
    /// For [`Allocator::allocate`]: a power of two, at most the
    /// mechanism's `max_alignment` (both checked by the SDK) and at least
    /// its `min_alignment` — a smaller request is raised to `min_alignment`
    /// by the SDK, so aligning to exactly this value honours both the
    /// request and the promise `min_alignment` makes. For `reserve`,
    /// `create` and `import_fd` the ABI says the field is ignored (they
    /// align to the granularity): it is passed as the host sent it,
    /// unchecked.
    pub alignment: u64,
    /// Host-assigned identifier of the object to be made, unique for the
    /// life of the host process. Remember it: a later reference whose
    /// `object_id` differs is `UNKNOWN_ALLOCATION`.
    pub object_id: u64,
    /// The device the host believes it is talking to; always the
    /// mechanism's device when you see it.
    pub device: MemplugDevice,
    /// The raw `MEMPLUG_CLASS_*` tag (ABI 1.1); `MEMPLUG_CLASS_OTHER` when
    /// the host sent a 1.0 request. Read it through [`Request::class`],
    /// which maps values this SDK does not know to `Other`.
    pub class_tag: u32,
    /// `MEMPLUG_HINT_*` bits (ABI 1.2; zero from an older host). Hints
    /// never make a request fail: ignore bits you do not know.
    pub hints: u32,
    /// `MEMPLUG_HANDLE_*` kinds the caller will export the object as (ABI
    /// 1.2; zero from an older host). Refuse with `UNSUPPORTED` what you
    /// cannot make exportable that way.
    pub export_types: u32,
    /// The page size wanted (ABI 1.2): zero (your choice), or one your
    /// [`Descriptor::page_sizes`](crate::Descriptor) lists — the SDK has
    /// refused any other with `INVALID_ARGUMENT`.
    pub page_size: u64,
    /// Where the memory should live (ABI 1.2; `Location::ANY` from an
    /// older host). Refuse with `UNSUPPORTED` a place you cannot use.
    pub location: crate::Location,
}

impl Request {
    /// Whether the caller accepts uninitialised memory
    /// (`MEMPLUG_HINT_UNINITIALIZED_OK`): a zero-filling mechanism may skip
    /// the fill.
    #[inline]
    pub fn uninitialized_ok(&self) -> bool {
        self.hints & abi::MEMPLUG_HINT_UNINITIALIZED_OK != 0
    }

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
/// size, and the plugin's own handle. The SDK writes it into the host's
/// `MemplugBlock` only when the method returns `Ok`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Block {
    /// Device address of the first byte; zero for a physical object.
    pub addr: u64,
    /// Bytes actually obtained: at least the bytes requested (for
    /// reservations and physical objects, rounded up to the granularity).
    pub size: u64,
    /// Your handle for the object, opaque to the host, which sends it back
    /// in every [`ObjectRef`] to this object.
    pub handle: u64,
}

/// The host's name for an object the plugin made earlier.
///
/// Untrusted, but partly checked: before any trait method sees one, the
/// SDK has refused references whose `mechanism_id` is not the mechanism's
/// (`WRONG_MECHANISM`) or whose `device` is not the mechanism's
/// (`WRONG_DEVICE`), in that order. What only you can check is left to you:
/// that `handle` names a live object of yours of the kind the method takes
/// (an allocation passed as a reservation is `UNKNOWN_ALLOCATION`), and that
/// `object_id`, `addr` and `size` are those of that object. Compare `size`
/// with what you recorded, never trust it as a bound.
pub type ObjectRef = MemplugObjectRef;

/// Static properties of a mechanism, as [`Allocator::properties`] reports
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Properties {
    /// Alignment every allocation has at least (a power of two).
    pub min_alignment: u64,
    /// Largest alignment `allocate` honours (a power of two, at least
    /// `min_alignment`); the SDK refuses larger requests.
    pub max_alignment: u64,
    /// Granularity of virtual ranges and physical objects (a power of
    /// two); zero when the mechanism has neither capability. The SDK
    /// refuses ranges that are not multiples of it.
    pub granularity: u64,
}

/// Free and total memory of the device, as it reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    /// Bytes free on the device.
    pub free_bytes: u64,
    /// Bytes the device has in all (non-zero, at least `free_bytes`).
    pub total_bytes: u64,
}

/// Whether a fence has completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceState {
    /// The work recorded before the fence has run.
    Complete,
    /// It has not yet.
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
// from any plugin thread (ARCHITECTURE.md §3, Sync).
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

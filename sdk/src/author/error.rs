//! What a vendor's method returns on failure: a status code and a message
//! (`PluginError`, `PluginResult`).

// The other capability items, for the documentation's links.
#[cfg(doc)]
use super::*;

use crate::status::Status;

/// A failure a plugin reports: a status code (never `Ok`) and a message the
/// host receives through its sink.
///
/// Build one with the helper named after its code
/// ([`PluginError::unknown_allocation`], [`PluginError::wrong_device`], …);
/// there is one for every failure code of [`Status`]. The message is the
/// host's only explanation: say what was refused and why, with the values
/// involved. It is formatted only on the failure path, so a hot path that
/// succeeds pays nothing for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    /// The code the slot returns (never `Status::Ok`).
    pub status: Status,
    /// What the host's message sink receives (nothing is sent when empty).
    pub message: String,
}

impl PluginError {
    /// A failure with `status`; an `Ok` status is turned into `Internal`,
    /// because an error that says "success" is a contradiction.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        let status = if status == Status::Ok { Status::Internal } else { status };
        PluginError { status, message: message.into() }
    }
    /// `MEMPLUG_STATUS_UNSUPPORTED`: the operation is not provided (never
    /// for something that was done).
    pub fn unsupported(m: impl Into<String>) -> Self {
        Self::new(Status::Unsupported, m)
    }
    /// `MEMPLUG_STATUS_INVALID_ARGUMENT`: a malformed argument. The SDK
    /// already refuses the ones the ABI lists (NULL pointers, short
    /// structs, zero sizes, bad alignments, unknown flags and access bits,
    /// negative descriptors); use it for what only the mechanism knows, such
    /// as a descriptor it cannot use.
    pub fn invalid_argument(m: impl Into<String>) -> Self {
        Self::new(Status::InvalidArgument, m)
    }
    /// `MEMPLUG_STATUS_OUT_OF_MEMORY`: the device has no memory for the
    /// request, including sizes no object could have.
    pub fn out_of_memory(m: impl Into<String>) -> Self {
        Self::new(Status::OutOfMemory, m)
    }
    /// `MEMPLUG_STATUS_WRONG_MECHANISM`: the object was made by another
    /// mechanism. The SDK refuses references whose `mechanism_id` is not
    /// this mechanism's before your trait is called; you need this only for
    /// identities the SDK cannot see.
    pub fn wrong_mechanism(m: impl Into<String>) -> Self {
        Self::new(Status::WrongMechanism, m)
    }
    /// `MEMPLUG_STATUS_WRONG_DEVICE`: the object or request names a device
    /// this mechanism does not serve. The SDK refuses requests and
    /// references naming another device than the mechanism's before your
    /// trait is called.
    pub fn wrong_device(m: impl Into<String>) -> Self {
        Self::new(Status::WrongDevice, m)
    }
    /// `MEMPLUG_STATUS_UNKNOWN_ALLOCATION`: the handle names no live object
    /// of this mechanism and kind, or the reference's `object_id`, `addr`
    /// or `size` contradict the object's. Only the mechanism can tell: the
    /// SDK never checks handles.
    pub fn unknown_allocation(m: impl Into<String>) -> Self {
        Self::new(Status::UnknownAllocation, m)
    }
    /// `MEMPLUG_STATUS_DEVICE_UNAVAILABLE`: the device or its driver cannot
    /// be reached (absent, lost, not initialised).
    pub fn device_unavailable(m: impl Into<String>) -> Self {
        Self::new(Status::DeviceUnavailable, m)
    }
    /// `MEMPLUG_STATUS_INTERNAL`: the plugin failed internally. A panic in
    /// a trait method is reported with this code by the SDK.
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(Status::Internal, m)
    }
    /// `MEMPLUG_STATUS_OUT_OF_RANGE`: a range lies outside its object. The
    /// SDK refuses empty, unaligned and overflowing ranges; the bounds
    /// against your object's size are yours to check.
    pub fn out_of_range(m: impl Into<String>) -> Self {
        Self::new(Status::OutOfRange, m)
    }
    /// `MEMPLUG_STATUS_INVALID_STATE`: the object is in the wrong state
    /// (committing committed pages, mapping over a mapping, …).
    pub fn invalid_state(m: impl Into<String>) -> Self {
        Self::new(Status::InvalidState, m)
    }
    /// `MEMPLUG_STATUS_VERSION_MISMATCH`: the versions do not overlap. The
    /// SDK's negotiation reports it; a slot has no use for it.
    pub fn version_mismatch(m: impl Into<String>) -> Self {
        Self::new(Status::VersionMismatch, m)
    }
    /// `MEMPLUG_STATUS_NOT_READY`: a fence has not completed. A
    /// [`StreamSync::fence_query`] that returns [`FenceState::Pending`] gets
    /// this code with no message; you rarely need it directly.
    pub fn not_ready(m: impl Into<String>) -> Self {
        Self::new(Status::NotReady, m)
    }
    /// `MEMPLUG_STATUS_TIMEOUT`: a wait ran out of time. A
    /// [`StreamSync::fence_wait`] that returns [`FenceState::Pending`] gets
    /// this code with no message; you rarely need it directly.
    pub fn timeout(m: impl Into<String>) -> Self {
        Self::new(Status::Timeout, m)
    }
    /// `MEMPLUG_STATUS_BUSY`: the request cannot be carried out now without
    /// breaking something in use (for example a stream destroyed from one
    /// of its own host functions).
    pub fn busy(m: impl Into<String>) -> Self {
        Self::new(Status::Busy, m)
    }
    /// `MEMPLUG_STATUS_DEVICE_LOST` (ABI 1.2): the device or context is
    /// gone. Prefer [`HostLink::report_device_lost`](crate::HostLink),
    /// which also makes every later slot of the mechanism answer this and
    /// tells the host at once.
    pub fn device_lost(m: impl Into<String>) -> Self {
        Self::new(Status::DeviceLost, m)
    }
}

impl core::fmt::Display for PluginError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for PluginError {}

/// What every trait method returns.
pub type PluginResult<T> = Result<T, PluginError>;

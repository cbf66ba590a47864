//! What the host hands a plugin: the device a mechanism serves, the message
//! sink of a call, the host's information and services, and the negotiation
//! the entry writes back.

use super::*;
use core::ffi::{c_char, c_void};

/// A device: its kind and its ordinal among devices of that kind. Frozen:
/// this struct never grows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugDevice {
    /// One of the `MEMPLUG_DEVICE_*` values.
    pub kind: MemplugDeviceKind,
    /// Ordinal among devices of `kind`, from zero.
    pub ordinal: u32,
}

/// Where a plugin writes the explanation of a failure. Passed by the host to
/// every fallible slot; may be NULL, in which case the plugin writes nothing.
///
/// Ownership: host-owned, valid only for the duration of the call it is
/// passed to. The plugin calls `write` on the calling thread, before the slot
/// returns, at most a few times (the host keeps the last message, truncated
/// to `MEMPLUG_MESSAGE_MAX` bytes). `msg` need not be NUL-terminated; `len`
/// bytes are read. A write after the slot returned (through a kept copy or
/// pointer, or from a thread not joined before the return) breaks the
/// contract; a host drops it and never lets it reach another call's
/// message or its own memory. A `len` that runs past readable memory
/// breaks it too; a host keeps what it can read and never faults on the
/// rest. Frozen: this struct never grows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugMessageSink {
    /// Host context, passed back as the first argument of `write`.
    pub ctx: *mut c_void,
    /// Records `len` bytes of UTF-8 text (invalid UTF-8 is replaced).
    pub write: Option<unsafe extern "C" fn(ctx: *mut c_void, msg: *const c_char, len: usize)>,
}

/// What the host tells a plugin when negotiating. Host-owned, valid for the
/// duration of the entry call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostInfo {
    /// `sizeof(MemplugHostInfo)` as the host knows it.
    pub struct_size: u32,
    /// Always 1 for `memplug_plugin_v1`.
    pub abi_major: u32,
    /// Oldest minor of this major the host accepts.
    pub min_minor: u32,
    /// Newest minor of this major the host understands.
    pub max_minor: u32,
    /// Host name for diagnostics, NUL-terminated; may be NULL.
    pub host_name: *const c_char,
    /// Since 1.2 (present when `struct_size` is at least
    /// `MEMPLUG_HOST_INFO_SIZE_1_2`). The host's services: the plugin's only
    /// way to call the host. Host-owned; valid from the entry call until
    /// the host calls the descriptor's `unload` (for a load the host
    /// refused, it stays valid and answers every service with
    /// `MEMPLUG_STATUS_INVALID_STATE`). A plugin may keep the pointer, and
    /// calls services only when the agreed minor is at least 2. May be NULL.
    pub services: *const MemplugHostServices,
}

/// Since 1.2. What a plugin may ask of the host, at any time after
/// negotiation, from any thread (its own workers, a driver's callback
/// thread, inside a slot the host called). No service blocks: each records
/// what it was told and returns; the host acts on it later, on its own
/// threads. Host-owned and immutable; grows by appending slots (a plugin
/// calls a slot only when `struct_size` covers it and it is non-NULL).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostServices {
    /// `sizeof(MemplugHostServices)` as the host knows it.
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Host context, passed back as the first argument of every service.
    pub ctx: *mut c_void,
    /// Reports that the device or context behind mechanism `mechanism_id`
    /// (one of this plugin's) is lost. After reporting, every slot of that
    /// mechanism returns `MEMPLUG_STATUS_DEVICE_LOST`. `reason` is
    /// `reason_len` bytes of UTF-8 (need not be NUL-terminated; may be
    /// NULL when `reason_len` is 0). Returns `MEMPLUG_STATUS_OK` when the
    /// loss is recorded (a second report of the same loss is `OK` and
    /// changes nothing), `MEMPLUG_STATUS_WRONG_MECHANISM` for an id the
    /// plugin did not publish, and `MEMPLUG_STATUS_INVALID_STATE` during
    /// negotiation (no mechanism exists yet), after `unload`, or when the
    /// agreed minor is below 2.
    pub report_device_lost: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            mechanism_id: u64,
            reason: *const c_char,
            reason_len: usize,
        ) -> MemplugStatus,
    >,
}

impl Default for MemplugHostServices {
    fn default() -> Self {
        MemplugHostServices {
            struct_size: 0,
            reserved0: 0,
            ctx: core::ptr::null_mut(),
            report_device_lost: None,
        }
    }
}

// Zeroed, as a reader's local copy starts before a host's prefix is copied
// in (raw pointers have no derived `Default`).
impl Default for MemplugHostInfo {
    fn default() -> Self {
        MemplugHostInfo {
            struct_size: 0,
            abi_major: 0,
            min_minor: 0,
            max_minor: 0,
            host_name: core::ptr::null(),
            services: core::ptr::null(),
        }
    }
}

/// The plugin's answer to negotiation, written into host-owned memory.
/// The host sets `struct_size`; the plugin writes no byte past it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugNegotiation {
    /// `sizeof(MemplugNegotiation)` as the host knows it (set by the host).
    pub struct_size: u32,
    /// The minor both sides will speak: at most the smaller of the two
    /// maxima, at least the larger of the two minima.
    pub agreed_minor: u32,
    /// The plugin descriptor. Plugin-owned; valid until the library is
    /// unloaded (after the host has called `unload`, when published).
    /// It must be the descriptor of the agreed minor: no capability bit
    /// that a later minor defines is set (`MEMPLUG_CAP_SHARED_EXPORT` only
    /// when `agreed_minor` is at least 1), and the host reads no slot a
    /// later minor appends. A table may be longer than the agreed minor
    /// defines; the host ignores the rest.
    pub plugin: *const MemplugPlugin,
}

//! Errors of the host's plugin layer. Every error names the plugin, the
//! mechanism or the slot involved, and keeps the plugin's own message.

use memplug_sdk::Status;
use std::path::PathBuf;

/// A plugin slot returned a failure (or the host refused the call before
/// making it, for example for a foreign object).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{mechanism}: {slot} failed with {status}{}: {message}", unknown_code(*.raw))]
pub struct CallError {
    /// The status as the host understands it; an unknown code is `Internal`.
    pub status: Status,
    /// The code exactly as the plugin returned it.
    pub raw: u32,
    /// The slot, e.g. `allocator.allocate`.
    pub slot: &'static str,
    /// The mechanism, as `plugin/mechanism`.
    pub mechanism: String,
    /// The plugin's message, or the host's explanation when the plugin gave
    /// none.
    pub message: String,
}

fn unknown_code(raw: u32) -> String {
    match Status::from_raw(raw) {
        Some(_) => String::new(),
        None => format!(" (plugin returned unknown status code {raw})"),
    }
}

impl CallError {
    /// True when the plugin returned a code this host does not know.
    pub fn is_unknown_code(&self) -> bool {
        Status::from_raw(self.raw).is_none()
    }
}

/// Why a plugin could not be loaded. The host stays up in every case.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("plugin file {} does not exist", .0.display())]
    NotFound(PathBuf),
    #[error("{} is not a loadable library: {reason}", path.display())]
    NotALibrary { path: PathBuf, reason: String },
    #[error("{} exports no memplug entry symbol (looked for: {})", path.display(), symbols.join(", "))]
    MissingEntrySymbol { path: PathBuf, symbols: Vec<&'static str> },
    #[error("plugin {origin}: entry refused to negotiate with {status}: {message}")]
    EntryFailed { origin: String, status: Status, raw: u32, message: String },
    #[error("plugin {origin}: version mismatch: {message}")]
    VersionMismatch { origin: String, message: String },
    #[error(
        "plugin {origin}: {what} is {declared} bytes, shorter than the {required} bytes ABI 1.0 requires"
    )]
    ShortStruct { origin: String, what: String, declared: u32, required: u32 },
    #[error("plugin {origin}: required {what} is NULL")]
    NullRequired { origin: String, what: String },
    #[error("plugin {origin}: mechanism '{mechanism}': {detail}")]
    CapabilityMismatch { origin: String, mechanism: String, detail: String },
    #[error("plugin {origin}: {detail}")]
    Malformed { origin: String, detail: String },
    #[error("plugin {origin}: mechanism '{mechanism}': properties failed: {source}")]
    Properties {
        origin: String,
        mechanism: String,
        #[source]
        source: CallError,
    },
    #[error("plugin {origin}: {detail}")]
    Policy { origin: String, detail: String },
}

/// The kinds of objects the host counts per mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    Allocation,
    Reservation,
    PhysicalObject,
    Stream,
    Fence,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 5] = [
        ObjectKind::Allocation,
        ObjectKind::Reservation,
        ObjectKind::PhysicalObject,
        ObjectKind::Stream,
        ObjectKind::Fence,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Allocation => "allocations",
            ObjectKind::Reservation => "reservations",
            ObjectKind::PhysicalObject => "physical objects",
            ObjectKind::Stream => "streams",
            ObjectKind::Fence => "fences",
        }
    }
}

/// A release the plugin refused: the object comes back to the caller, still
/// alive and still counted, so it can be retried or quarantined
/// (ARCHITECTURE.md §2, invariant 7) — never silently forgotten.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ReleaseError<T: std::fmt::Debug> {
    pub object: T,
    #[source]
    pub error: CallError,
}

/// Whether a failed release failed because the context is lost (the host
/// refused the call, or the plugin answered DEVICE_LOST): the object went
/// with the device, and its charge is settled at termination, not
/// quarantined.
pub(crate) trait LostCheck {
    fn is_device_lost(&self) -> bool;
}

impl LostCheck for CallError {
    fn is_device_lost(&self) -> bool {
        self.status == Status::DeviceLost
    }
}

impl<T: std::fmt::Debug> LostCheck for ReleaseError<T> {
    fn is_device_lost(&self) -> bool {
        self.error.is_device_lost()
    }
}

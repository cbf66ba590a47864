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
///
/// Every variant that names an `origin` means the same thing by it: the
/// path as given to [`Plugin::load_with`](crate::Plugin::load_with), or the
/// label given to [`Plugin::from_entry`](crate::Plugin::from_entry) followed
/// by `(in-process)`. Plugin-supplied text in these errors (names, messages)
/// has been escaped: it is safe to print.
pub enum LoadError {
    /// Nothing exists at the path (or a directory on it is missing): the
    /// path as given. Raised before any byte of the file is read.
    #[error("plugin file {} does not exist", .0.display())]
    NotFound(PathBuf),
    /// The file exists but the dynamic loader refused it (not an ELF shared
    /// object, wrong architecture, an unresolved dependency, ...), or it is
    /// not a regular file.
    #[error("{} is not a loadable library: {reason}", path.display())]
    NotALibrary {
        /// The path as given.
        path: PathBuf,
        /// The loader's (`dlerror`) or the host's explanation.
        reason: String,
    },
    /// The library loaded but exports none of the entry symbols this host
    /// looks for (`memplug_plugin_v1`): it is no memplug plugin, or one of
    /// another major. The library has been closed again.
    #[error("{} exports no memplug entry symbol (looked for: {})", path.display(), symbols.join(", "))]
    MissingEntrySymbol {
        /// The path as given.
        path: PathBuf,
        /// Every symbol name that was tried, in the order tried.
        symbols: Vec<&'static str>,
    },
    /// The plugin's entry function returned a failure other than
    /// `VERSION_MISMATCH` (that one is [`LoadError::VersionMismatch`]).
    #[error("plugin {origin}: entry refused to negotiate with {status}: {message}")]
    EntryFailed {
        /// Which plugin (see the type's docs).
        origin: String,
        /// The code as the host reads it; a code the host does not know
        /// reads as [`Status::Internal`].
        status: Status,
        /// The code exactly as the entry function returned it.
        raw: u32,
        /// The plugin's message, or a note that it gave none.
        message: String,
    },
    /// Host and plugin share no minor version: the plugin said so
    /// (`VERSION_MISMATCH` from its entry), or the ranges each published do
    /// not overlap (the [`LoadOptions`](crate::LoadOptions) minor range
    /// included).
    #[error("plugin {origin}: version mismatch: {message}")]
    VersionMismatch {
        /// Which plugin (see the type's docs).
        origin: String,
        /// Both ranges, or the plugin's own message.
        message: String,
    },
    /// A growable plugin struct declares a `struct_size` smaller than its
    /// ABI 1.0 size, so the host cannot read even the fields every minor
    /// has.
    #[error(
        "plugin {origin}: {what} is {declared} bytes, shorter than the {required} bytes ABI 1.0 requires"
    )]
    ShortStruct {
        /// Which plugin (see the type's docs).
        origin: String,
        /// Which struct, e.g. `plugin descriptor` or `mechanism #0`.
        what: String,
        /// The plugin's `struct_size`, in bytes.
        declared: u32,
        /// The struct's ABI 1.0 size, in bytes.
        required: u32,
    },
    /// A pointer, string or function slot the ABI requires at the agreed
    /// minor is NULL.
    #[error("plugin {origin}: required {what} is NULL")]
    NullRequired {
        /// Which plugin (see the type's docs).
        origin: String,
        /// What is missing, e.g. `plugin.live_objects` or
        /// `mechanism 'cpu' allocator.allocate`.
        what: String,
    },
    /// A mechanism's capability bits disagree with what it publishes: a
    /// capability without its vtable or slots, slots without their
    /// capability, or a capability the agreed minor does not have.
    #[error("plugin {origin}: mechanism '{mechanism}': {detail}")]
    CapabilityMismatch {
        /// Which plugin (see the type's docs).
        origin: String,
        /// The mechanism's name (escaped).
        mechanism: String,
        /// Which bit and which table disagree.
        detail: String,
    },
    /// The plugin's descriptors break a rule of the ABI not covered by the
    /// variants above: a wrong major, an empty minor range, an agreed minor
    /// outside the common range, no mechanisms, a zero or repeated id, an
    /// unterminated or non-UTF-8 name, impossible properties.
    #[error("plugin {origin}: {detail}")]
    Malformed {
        /// Which plugin (see the type's docs).
        origin: String,
        /// The rule broken, naming the struct or mechanism.
        detail: String,
    },
    /// A mechanism's `properties` slot failed while the host validated it at
    /// load time.
    #[error("plugin {origin}: mechanism '{mechanism}': properties failed: {source}")]
    Properties {
        /// Which plugin (see the type's docs).
        origin: String,
        /// The mechanism's name (escaped).
        mechanism: String,
        /// The failed call, with the plugin's status and message.
        #[source]
        source: CallError,
    },
    /// The loading policy refused the file before it was loaded: a bare file
    /// name, a file or directory writable by others, a SHA-256 that does not
    /// match [`LoadOptions::expected_sha256`](crate::LoadOptions), or a
    /// check that could not be made. No code of the file has run.
    #[error("plugin {origin}: {detail}")]
    Policy {
        /// The path as given.
        origin: String,
        /// Which rule refused it and why.
        detail: String,
    },
}

/// The kinds of objects the host counts per mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A block from `allocator.allocate` ([`Allocation`](crate::Allocation)).
    Allocation,
    /// An address range from `virtual_backing.reserve`
    /// ([`Reservation`](crate::Reservation)).
    Reservation,
    /// A mappable object from `shared_mapping.create` or an import
    /// ([`PhysicalObject`](crate::PhysicalObject)).
    PhysicalObject,
    /// A stream created or adopted through `sync` ([`Stream`](crate::Stream)).
    Stream,
    /// A fence recorded on a stream ([`Fence`](crate::Fence)).
    Fence,
}

impl ObjectKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [ObjectKind; 5] = [
        ObjectKind::Allocation,
        ObjectKind::Reservation,
        ObjectKind::PhysicalObject,
        ObjectKind::Stream,
        ObjectKind::Fence,
    ];
    /// The kind's plural name as reports print it, e.g. `physical objects`.
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
    /// The object whose release was refused, still owned by the caller and
    /// still counted as live by its mechanism (dropping it tries again).
    pub object: T,
    /// The refused call, with the plugin's status and message.
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

//! How a plugin is loaded: the minor range this host speaks and the
//! options of a load. Its own module because both the loader
//! (`plugin.rs`) and the loading policy (`policy.rs`) read it, and neither
//! should import the other for it.

use memplug_sdk::abi::MEMPLUG_ABI_MINOR;

/// The oldest minor of major 1 this host build still speaks: 0, since every
/// released minor stays served.
pub const HOST_MIN_MINOR: u32 = 0;
/// The newest minor of major 1 this host build speaks: the minor of the
/// `memplug.h` it was built from. A plugin agreeing on more is refused.
pub const HOST_MAX_MINOR: u32 = MEMPLUG_ABI_MINOR;

/// How to load. The defaults accept any minor this host understands and
/// apply the full loading policy (`policy.rs`).
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Oldest minor accepted (default 0).
    pub min_minor: u32,
    /// Newest minor spoken (default: this build's newest; a larger value is
    /// capped there, since the host cannot speak a minor it does not know).
    pub max_minor: u32,
    /// Load even if the file or a directory on its path is writable by
    /// others than its owner (default: refuse).
    pub allow_writable_by_others: bool,
    /// Refuse unless the file's SHA-256 (hex) is this (default: no pin).
    pub expected_sha256: Option<String>,
    /// Check every allocation and reservation a mechanism returns against
    /// the live ones of the same mechanism, and refuse one whose address
    /// range overlaps a live block (or wraps around the address space) as
    /// the plugin's internal failure, naming both objects; the refused
    /// block is not counted, charged, used or freed. Default: on in debug
    /// builds (`cfg!(debug_assertions)`), off in release builds: the
    /// index's lock and `BTreeMap` lookups cost about 650 instructions per
    /// allocate/free pair, which would more than double the host's own
    /// path and add about three quarters to a governed binding's
    /// (`scripts/callgrind.sh`; see `mechanism/blocks.rs`). Turn it on for
    /// plugins under test or not fully trusted.
    pub check_overlaps: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            min_minor: HOST_MIN_MINOR,
            max_minor: HOST_MAX_MINOR,
            allow_writable_by_others: false,
            expected_sha256: None,
            check_overlaps: cfg!(debug_assertions),
        }
    }
}

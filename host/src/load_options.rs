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
    /// Which blocks a mechanism returns are checked against its live ones
    /// of the same mechanism: a block whose address range overlaps a live
    /// block (or wraps around the address space) is refused as the
    /// plugin's internal failure, naming both objects, and is then not
    /// counted, charged, used or freed. Aliasing memory is the most
    /// dangerous lie a plugin can tell, so the default checks wherever the
    /// check is cheap beside the call it guards; see [`OverlapCheck`] for
    /// the figures. Default: [`OverlapCheck::All`] in debug builds,
    /// [`OverlapCheck::Auto`] in release builds.
    pub check_overlaps: OverlapCheck,
}

/// Which blocks are checked for overlaps (`LoadOptions::check_overlaps`).
///
/// The check keeps an index of live blocks per mechanism (a lock and a
/// `BTreeMap`, `mechanism/blocks.rs`): about 660 instructions per
/// block made and given back (`HOTPATH_CHECK_OVERLAPS=0|1
/// scripts/callgrind.sh binding reserve`). Beside a 2 MiB reservation
/// (reserve + release: ~2200 instructions in the host and the plugin plus
/// two system calls) that is small; beside a 64-byte allocation of the CPU
/// plugin (a ~1100-instruction pair, no system call) it is +60 %; beside a
/// device allocation (a driver call of microseconds) it is noise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OverlapCheck {
    /// Nothing is checked.
    Off,
    /// Reservations only.
    Reservations,
    /// Reservations, and allocations of every mechanism whose device is
    /// not the CPU (device and pinned memory: allocations there are driver
    /// calls, and the check is small beside them); CPU allocations, where
    /// the check would cost more than half the pair, are not.
    #[default]
    Auto,
    /// Every allocation and reservation.
    All,
}

impl OverlapCheck {
    /// The build's default: `All` in debug builds, `Auto` in release.
    pub const fn build_default() -> OverlapCheck {
        if cfg!(debug_assertions) {
            OverlapCheck::All
        } else {
            OverlapCheck::Auto
        }
    }

    /// Whether reservations are checked.
    pub fn reservations(self) -> bool {
        self != OverlapCheck::Off
    }

    /// Whether allocations of a mechanism on a device of `device_kind`
    /// (`MEMPLUG_DEVICE_*`) are checked.
    pub fn allocations(self, device_kind: u32) -> bool {
        match self {
            OverlapCheck::All => true,
            OverlapCheck::Auto => device_kind != memplug_sdk::abi::MEMPLUG_DEVICE_CPU,
            OverlapCheck::Off | OverlapCheck::Reservations => false,
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            min_minor: HOST_MIN_MINOR,
            max_minor: HOST_MAX_MINOR,
            allow_writable_by_others: false,
            expected_sha256: None,
            check_overlaps: OverlapCheck::build_default(),
        }
    }
}

//! What an allocation is for.

use std::fmt;

/// What a charge is for. Every grant and lease carries one; every
/// statistic is kept per class.
///
/// `#[repr(u8)]` with fixed discriminants so the C API can pass it as a
/// byte; a byte this version does not know maps to [`AllocationClass::Other`]
/// through [`AllocationClass::from_u8_lossy`] (the conservative meaning, as
/// ARCHITECTURE.md §3 asks of unknown enum values).
///
/// Thread-safety: a plain `Copy` value.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllocationClass {
    /// Model parameters: long-lived, rarely evictable.
    Weights = 0,
    /// Key/value cache: large, evictable by its holder.
    Kv = 1,
    /// Activations of in-flight work.
    Activations = 2,
    /// Short-lived scratch space.
    Workspace = 3,
    /// Anything else.
    Other = 4,
}

impl AllocationClass {
    /// Number of classes.
    pub const COUNT: usize = 5;

    /// Every class, in discriminant order (`ALL[c.index()] == c`).
    pub const ALL: [AllocationClass; Self::COUNT] = [
        AllocationClass::Weights,
        AllocationClass::Kv,
        AllocationClass::Activations,
        AllocationClass::Workspace,
        AllocationClass::Other,
    ];

    /// Stable lower-case name: `weights`, `kv`, `activations`, `workspace`, `other`.
    pub const fn name(self) -> &'static str {
        match self {
            AllocationClass::Weights => "weights",
            AllocationClass::Kv => "kv",
            AllocationClass::Activations => "activations",
            AllocationClass::Workspace => "workspace",
            AllocationClass::Other => "other",
        }
    }

    /// Index into per-class arrays (the discriminant).
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The class with this discriminant, if there is one.
    pub const fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(AllocationClass::Weights),
            1 => Some(AllocationClass::Kv),
            2 => Some(AllocationClass::Activations),
            3 => Some(AllocationClass::Workspace),
            4 => Some(AllocationClass::Other),
            _ => None,
        }
    }

    /// Like [`from_u8`](Self::from_u8), mapping unknown values to `Other`.
    pub const fn from_u8_lossy(value: u8) -> Self {
        match Self::from_u8(value) {
            Some(c) => c,
            None => AllocationClass::Other,
        }
    }
}

impl fmt::Display for AllocationClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

//! The 64-bit handle codec: what the bits of a handle mean.
//!
//! Every object the C API hands out is named by a 64-bit value:
//!
//! ```text
//!  63    60 59        50 49                28 27                 0
//! +--------+------------+--------------------+--------------------+
//! |  kind  |  manager   |     generation     |       index        |
//! +--------+------------+--------------------+--------------------+
//! ```
//!
//! * `kind` (4 bits, never 0) says what the handle names, so a pool handle
//!   passed where a binding is expected is refused;
//! * `manager` (10 bits) is the seat of the owning manager (its index in the
//!   process-wide manager table): a handle given to another manager's call
//!   is refused as `WRONG_MANAGER`;
//! * `index` (28 bits) is a slot of the manager's table of that kind
//!   ([`crate::slot_table`]);
//! * `generation` (22 bits, never 0) must equal the slot's: a freed handle
//!   is `STALE_HANDLE`, a made-up one `INVALID_HANDLE`.
//!
//! The zero handle is never issued. This module only packs and unpacks
//! bits; it knows nothing of tables or errors ([`crate::error`] turns a
//! `WrongKind` into a status and a message).

use crate::slot_table::{Key, GEN_BITS, INDEX_BITS};
pub(crate) use crate::slot_table::{MAX_GEN, MAX_INDEX};

const MANAGER_BITS: u32 = 10;
const GEN_SHIFT: u32 = INDEX_BITS;
const MANAGER_SHIFT: u32 = GEN_SHIFT + GEN_BITS;
const KIND_SHIFT: u32 = MANAGER_SHIFT + MANAGER_BITS;

/// Manager seats: managers alive at once.
pub(crate) const MAX_MANAGERS: u32 = 1 << MANAGER_BITS;

// kind (4 bits) + manager + generation + index fill the 64 bits exactly.
const _: () = assert!(KIND_SHIFT == 60 && Kind::Node as u32 <= 0xf);

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Manager = 1,
    Mechanism = 2,
    Pool = 3,
    Holder = 4,
    Binding = 5,
    Allocation = 6,
    Region = 7,
    Prefix = 8,
    Stream = 9,
    Fence = 10,
    Subscription = 11,
    Cache = 12,
    CachedAllocation = 13,
    /// A node link or a node authority (API 1.3, `node.rs`): one kind for
    /// both, so the four bits keep a number free; `node.rs` tells them
    /// apart and names the one expected.
    Node = 14,
}

impl Kind {
    const ALL: [Kind; 14] = [
        Kind::Manager,
        Kind::Mechanism,
        Kind::Pool,
        Kind::Holder,
        Kind::Binding,
        Kind::Allocation,
        Kind::Region,
        Kind::Prefix,
        Kind::Stream,
        Kind::Fence,
        Kind::Subscription,
        Kind::Cache,
        Kind::CachedAllocation,
        Kind::Node,
    ];

    /// The kind whose number is `bits` (the kind field of a handle).
    pub(crate) fn from_bits(bits: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == bits)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Manager => "manager",
            Kind::Mechanism => "mechanism",
            Kind::Pool => "pool",
            Kind::Holder => "holder",
            Kind::Binding => "binding",
            Kind::Allocation => "allocation",
            Kind::Region => "region",
            Kind::Prefix => "shared prefix",
            Kind::Stream => "stream",
            Kind::Fence => "fence",
            Kind::Subscription => "subscription",
            Kind::Cache => "cache",
            Kind::CachedAllocation => "cached allocation",
            Kind::Node => "node link or authority",
        }
    }

    /// The name with its indefinite article ("a pool", "an allocation").
    pub(crate) fn with_article(self) -> &'static str {
        match self {
            Kind::Manager => "a manager",
            Kind::Mechanism => "a mechanism",
            Kind::Pool => "a pool",
            Kind::Holder => "a holder",
            Kind::Binding => "a binding",
            Kind::Allocation => "an allocation",
            Kind::Region => "a region",
            Kind::Prefix => "a shared prefix",
            Kind::Stream => "a stream",
            Kind::Fence => "a fence",
            Kind::Subscription => "a subscription",
            Kind::Cache => "a cache",
            Kind::CachedAllocation => "a cached allocation",
            Kind::Node => "a node link or authority",
        }
    }
}

/// A decoded handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Raw {
    pub kind: u8,
    /// The seat of the owning manager.
    pub manager: u32,
    pub gen: u32,
    pub index: u32,
}

impl Raw {
    /// What the handle's table looks the object up by.
    #[inline]
    pub(crate) fn key(self) -> Key {
        Key { index: self.index, gen: self.gen }
    }
}

/// A handle refused by [`expect`]: the zero handle, or one whose kind
/// field is not the kind asked for (or whose generation is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WrongKind {
    pub bits: u64,
    pub expected: Kind,
}

#[inline]
pub(crate) fn encode(kind: Kind, manager: u32, gen: u32, index: u32) -> u64 {
    debug_assert!(manager < MAX_MANAGERS && gen <= MAX_GEN && index <= MAX_INDEX);
    ((kind as u64) << KIND_SHIFT)
        | ((manager as u64) << MANAGER_SHIFT)
        | ((gen as u64) << GEN_SHIFT)
        | index as u64
}

#[inline]
pub(crate) fn decode(bits: u64) -> Raw {
    Raw {
        kind: (bits >> KIND_SHIFT) as u8,
        manager: ((bits >> MANAGER_SHIFT) & (MAX_MANAGERS as u64 - 1)) as u32,
        gen: ((bits >> GEN_SHIFT) & MAX_GEN as u64) as u32,
        index: (bits & MAX_INDEX as u64) as u32,
    }
}

/// Decodes `bits` as a handle of `kind`; the zero handle and a handle of
/// another kind are refused (the caller treats zero first where it is a
/// no-op).
#[inline]
pub(crate) fn expect(bits: u64, kind: Kind) -> Result<Raw, WrongKind> {
    // Tested on the bits, each test its own branch to a cold refusal: on
    // the decoded fields, joined with `||`, the compiler combined both
    // tests with flag moves on every call (callgrind).
    if bits >> KIND_SHIFT != kind as u64 {
        return Err(wrong_kind(bits, kind));
    }
    if bits & ((MAX_GEN as u64) << GEN_SHIFT) == 0 {
        return Err(wrong_kind(bits, kind));
    }
    Ok(decode(bits))
}

#[cold]
fn wrong_kind(bits: u64, expected: Kind) -> WrongKind {
    WrongKind { bits, expected }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let bits = encode(Kind::Region, MAX_MANAGERS - 1, MAX_GEN, MAX_INDEX);
        assert_eq!(
            decode(bits),
            Raw { kind: Kind::Region as u8, manager: MAX_MANAGERS - 1, gen: MAX_GEN, index: MAX_INDEX }
        );
        assert!(expect(bits, Kind::Binding).is_err());
        assert!(expect(0, Kind::Binding).is_err());
    }

    #[test]
    fn kinds_round_trip_through_their_bits() {
        for k in Kind::ALL {
            assert_eq!(Kind::from_bits(k as u8), Some(k));
            assert!(k.with_article().ends_with(k.name()));
        }
        assert_eq!(Kind::from_bits(0), None);
        assert_eq!(Kind::from_bits(15), None);
    }
}

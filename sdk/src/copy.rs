//! The stream-ordered copy of ABI 1.3 (`MemplugSync::copy`): the address
//! spaces it copies between, and the checks of its ranges that need nothing
//! but the three numbers (a range wrapping around the address space,
//! overlapping ranges). The SDK's slot and the host both make these checks
//! before anything is enqueued; this is the one place they are written.

use crate::abi;
use crate::author::{PluginError, PluginResult};
use crate::status::Status;
use core::fmt;

/// `MEMPLUG_COPY_*` bits: the address spaces a mechanism's copy copies
/// between (`MemplugProperties::copy_kinds`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CopyKinds(pub u32);

impl CopyKinds {
    /// No copy slot.
    pub const NONE: CopyKinds = CopyKinds(0);

    /// The mechanism's own memory.
    pub fn device(self) -> bool {
        self.0 & abi::MEMPLUG_COPY_DEVICE != 0
    }
    /// Host memory that is not the mechanism's.
    pub fn host(self) -> bool {
        self.0 & abi::MEMPLUG_COPY_HOST != 0
    }
    /// Another device's memory the mechanism's device can reach.
    pub fn peer(self) -> bool {
        self.0 & abi::MEMPLUG_COPY_PEER != 0
    }
    /// Bits of a minor newer than 1.3 (kept, not understood).
    pub fn unknown_bits(self) -> u32 {
        self.0 & !abi::MEMPLUG_COPY_ALL_1_3
    }
    /// The names of the known kinds present (`device`, `host`, `peer`).
    pub fn names(self) -> Vec<&'static str> {
        [(self.device(), "device"), (self.host(), "host"), (self.peer(), "peer")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect()
    }
}

impl fmt::Debug for CopyKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        if names.is_empty() && self.0 == 0 {
            return write!(f, "none");
        }
        write!(f, "{}", names.join("|"))?;
        if self.unknown_bits() != 0 {
            write!(f, "{}unknown({:#x})", if names.is_empty() { "" } else { "|" }, self.unknown_bits())?;
        }
        Ok(())
    }
}

/// What is wrong with a copy's ranges, judged from the numbers alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyRangeError {
    /// `addr + len` (the end, exclusive) does not fit in 64 bits.
    Wraps {
        /// `"dst"` or `"src"`.
        which: &'static str,
        /// The range's first byte.
        addr: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// The two ranges share at least one byte.
    Overlap {
        /// The destination's first byte.
        dst: u64,
        /// The source's first byte.
        src: u64,
        /// The length of both, in bytes.
        len: u64,
    },
}

impl CopyRangeError {
    /// The status the ABI gives the refusal.
    pub fn status(self) -> Status {
        match self {
            CopyRangeError::Wraps { .. } => Status::OutOfRange,
            CopyRangeError::Overlap { .. } => Status::InvalidArgument,
        }
    }
}

impl fmt::Display for CopyRangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CopyRangeError::Wraps { which, addr, len } => write!(
                f,
                "the {which} range {addr:#x} + {len:#x} runs past the end of the 64-bit address space"
            ),
            CopyRangeError::Overlap { dst, src, len } => write!(
                f,
                "the ranges overlap: dst {dst:#x}..{:#x} and src {src:#x}..{:#x} ({len:#x} bytes each); a copy \
                 has no memmove semantics",
                dst.wrapping_add(len),
                src.wrapping_add(len)
            ),
        }
    }
}

/// For a plugin judging a copy's range against one of its objects that
/// the range meets: `Ok` when `[start, end)` lies wholly inside
/// `[addr, addr + size)`, else `OUT_OF_RANGE` saying which range (`which`,
/// `"dst"` or `"src"`) and which object (`what`).
pub fn copy_range_inside(
    which: &str,
    start: u64,
    end: u64,
    what: &str,
    addr: u64,
    size: u64,
) -> PluginResult<()> {
    if start >= addr && end <= addr + size {
        return Ok(());
    }
    Err(PluginError::out_of_range(format!(
        "copy: the {which} range [{start:#x}, {end:#x}) is not wholly inside the {what} [{addr:#x}, {:#x}) it \
         meets; nothing was enqueued",
        addr + size
    )))
}

/// For a plugin: the `OUT_OF_RANGE` of a copy's range inside a
/// reservation (at `reservation`) that is not all committed or mapped.
#[cold]
pub fn copy_range_unbacked(which: &str, start: u64, end: u64, reservation: u64) -> PluginError {
    PluginError::out_of_range(format!(
        "copy: the {which} range [{start:#x}, {end:#x}) of the reservation at {reservation:#x} is not all \
         committed or mapped; nothing was enqueued"
    ))
}

/// Checks a copy of `len` bytes from `src` to `dst` as every side must
/// before enqueuing it: `Ok(false)` for `len` 0 (nothing to do), `Ok(true)`
/// when there is a copy to make, and the refusal when a range wraps around
/// the address space or the two overlap. Whether the ranges lie in memory
/// the mechanism can copy is the plugin's to judge.
#[inline]
pub fn check_copy_ranges(dst: u64, src: u64, len: u64) -> Result<bool, CopyRangeError> {
    if len == 0 {
        return Ok(false);
    }
    let Some(dst_end) = dst.checked_add(len) else {
        return Err(CopyRangeError::Wraps { which: "dst", addr: dst, len });
    };
    let Some(src_end) = src.checked_add(len) else {
        return Err(CopyRangeError::Wraps { which: "src", addr: src, len });
    };
    if dst < src_end && src < dst_end {
        return Err(CopyRangeError::Overlap { dst, src, len });
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_copies_are_nothing_to_do_even_at_the_same_address() {
        assert_eq!(check_copy_ranges(0x1000, 0x1000, 0), Ok(false));
        assert_eq!(check_copy_ranges(u64::MAX, u64::MAX, 0), Ok(false));
    }

    #[test]
    fn adjacent_ranges_are_fine_and_one_shared_byte_is_overlap() {
        assert_eq!(check_copy_ranges(0x1000, 0x1010, 0x10), Ok(true));
        assert_eq!(check_copy_ranges(0x1010, 0x1000, 0x10), Ok(true));
        for (dst, src) in [(0x1000, 0x100f), (0x100f, 0x1000), (0x1000, 0x1000), (0x1004, 0x1008)] {
            let e = check_copy_ranges(dst, src, 0x10).unwrap_err();
            assert_eq!(e.status(), Status::InvalidArgument, "{dst:#x} {src:#x}");
            assert!(e.to_string().contains("overlap"), "{e}");
        }
    }

    #[test]
    fn an_end_that_fits_in_64_bits_is_fine_and_one_more_wraps() {
        assert_eq!(check_copy_ranges(0, u64::MAX - 0x10, 0x10), Ok(true));
        let e = check_copy_ranges(0, u64::MAX - 0xf, 0x10).unwrap_err();
        assert_eq!(e, CopyRangeError::Wraps { which: "src", addr: u64::MAX - 0xf, len: 0x10 });
        assert_eq!(e.status(), Status::OutOfRange);
        let e = check_copy_ranges(u64::MAX, 0, 2).unwrap_err();
        assert!(e.to_string().starts_with("the dst range"), "{e}");
    }

    #[test]
    fn kinds_name_their_bits() {
        let k = CopyKinds(abi::MEMPLUG_COPY_DEVICE | abi::MEMPLUG_COPY_HOST | 1 << 9);
        assert_eq!(k.names(), ["device", "host"]);
        assert_eq!(format!("{k:?}"), "device|host|unknown(0x200)");
        assert_eq!(format!("{:?}", CopyKinds::NONE), "none");
    }
}

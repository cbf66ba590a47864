//! Checks shared by every capability: whether a range fits its object, and
//! the refusal of a reference no table accepts.
//!
//! The SDK has already checked what the mechanism's facts decide before any
//! trait method runs: request flags, sizes and devices, the alignment of
//! allocations, every reference's mechanism id and device, and that ranges
//! are non-empty, granularity-aligned and do not overflow. What is left
//! here needs this plugin's tables: handles and bounds.
//!
//! Failure messages are formatted here, on the failure path only; the
//! success path of every check is a few comparisons.

use memplug_sdk::{ObjectRef, PluginError, PluginResult};

/// The `UNKNOWN_ALLOCATION` failure for a reference no table accepted.
/// Inlined, so the reference's fields are passed in registers: taking the
/// reference itself would make the hot callers keep a copy of it in memory.
#[inline(always)]
pub fn unknown(obj: &ObjectRef, what: &str) -> PluginError {
    unknown_object(what, obj.handle, obj.object_id, obj.addr, obj.size)
}

#[cold]
pub fn unknown_object(what: &str, handle: u64, object_id: u64, addr: u64, size: u64) -> PluginError {
    PluginError::unknown_allocation(format!(
        "{what} (handle {handle}, object_id {object_id}, addr {addr:#x}, size {size}) does not name a live \
         {what} of this mechanism: never made, already freed, or altered"
    ))
}

/// `size` rounded up to the granularity, or `OUT_OF_MEMORY` when the
/// rounded size does not fit in 64 bits (no such object can exist).
pub fn round_up(size: u64, granularity: u64, what: &str) -> PluginResult<u64> {
    size.checked_next_multiple_of(granularity).ok_or_else(|| {
        PluginError::out_of_memory(format!("{what}: {size} bytes cannot be rounded to whole pages"))
    })
}

/// Checks a range `[offset, offset + len)` inside an object of `limit`
/// bytes: in bounds (and, as the SDK already did, non-empty,
/// granularity-aligned, no overflow, kept so the check is whole on its
/// own). Returns the end of the range.
#[inline]
pub fn check_range(offset: u64, len: u64, limit: u64, granularity: u64, what: &str) -> PluginResult<u64> {
    // The success path is these comparisons only; the message is built
    // out of line (commit and decommit run this on every call).
    match offset.checked_add(len) {
        Some(end) if len != 0 && offset % granularity == 0 && len % granularity == 0 && end <= limit => {
            Ok(end)
        }
        _ => Err(range_refused(offset, len, limit, granularity, what)),
    }
}

/// Why `check_range` refused its range.
#[cold]
#[inline(never)]
fn range_refused(offset: u64, len: u64, limit: u64, granularity: u64, what: &str) -> PluginError {
    let why = if len == 0 {
        "is empty".to_owned()
    } else if offset % granularity != 0 || len % granularity != 0 {
        format!("is not aligned to the granularity of {granularity:#x} bytes")
    } else if offset.checked_add(len).is_none() {
        "overflows: offset + len exceeds 2^64".to_owned()
    } else {
        format!("ends past the {limit:#x} bytes of the object")
    };
    PluginError::out_of_range(format!("{what} range (offset {offset:#x}, len {len:#x}) {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplug_sdk::Status;

    #[test]
    fn ranges_are_checked_in_full() {
        let g = 4096;
        assert_eq!(check_range(0, g, 2 * g, g, "r"), Ok(g));
        assert_eq!(check_range(g, g, 2 * g, g, "r"), Ok(2 * g));
        for (o, l) in [(0, 0), (1, g), (0, 1), (g, 2 * g), (u64::MAX - g + 1, 2 * g)] {
            let e = check_range(o, l, 2 * g, g, "r").unwrap_err();
            assert_eq!(e.status, Status::OutOfRange, "{o:#x} {l:#x}");
        }
    }

    #[test]
    fn rounding_overflow_is_out_of_memory() {
        assert_eq!(round_up(1, 4096, "x"), Ok(4096));
        assert_eq!(round_up(u64::MAX, 4096, "x").unwrap_err().status, Status::OutOfMemory);
    }
}

//! Checks shared by every capability: who an object reference belongs to,
//! whether a request is well-formed, whether a range fits its object.
//!
//! Failure messages are formatted here, on the failure path only; the
//! success path of every check is a few comparisons.

use crate::mechanism::{DEVICE, MECHANISM_ID, MECHANISM_NAME};
use memplug_sdk::abi::MemplugDevice;
use memplug_sdk::{ObjectRef, PluginError, PluginResult, Request, Status};

/// Whether `d` is the device this mechanism serves, as one 64-bit compare
/// rather than two: it runs on every allocate and every free.
#[inline(always)]
fn is_ours(d: &MemplugDevice) -> bool {
    const OURS: u64 = (DEVICE.ordinal as u64) << 32 | DEVICE.kind as u64;
    (u64::from(d.ordinal) << 32 | u64::from(d.kind)) == OURS
}

/// Refuses a reference made by another mechanism (`WRONG_MECHANISM`) or for
/// another device (`WRONG_DEVICE`), in that order. The handle is checked by
/// the table that owns the object kind.
#[inline(always)]
pub fn check_owner(obj: &ObjectRef, what: &str) -> PluginResult<()> {
    if obj.mechanism_id != MECHANISM_ID {
        return Err(wrong_mechanism(what, obj.mechanism_id));
    }
    if !is_ours(&obj.device) {
        return Err(wrong_device(what, obj.device.kind, obj.device.ordinal));
    }
    Ok(())
}

#[cold]
fn wrong_mechanism(what: &str, id: u64) -> PluginError {
    PluginError::new(
        Status::WrongMechanism,
        format!("{what} belongs to mechanism {id}, not to \"{MECHANISM_NAME}\" (id {MECHANISM_ID})"),
    )
}

/// The `UNKNOWN_ALLOCATION` failure for a reference no table accepted.
/// Inlined, so the reference's fields are passed in registers: taking the
/// reference itself would make the hot callers keep a copy of it in memory.
#[inline(always)]
pub fn unknown(obj: &ObjectRef, what: &str) -> PluginError {
    unknown_object(what, obj.handle, obj.object_id, obj.addr, obj.size)
}

#[cold]
fn unknown_object(what: &str, handle: u64, object_id: u64, addr: u64, size: u64) -> PluginError {
    PluginError::unknown_allocation(format!(
        "{what} (handle {handle}, object_id {object_id}, addr {addr:#x}, size {size}) does not name a live \
         {what} of mechanism \"{MECHANISM_NAME}\": never made, already freed, or altered"
    ))
}

#[cold]
fn wrong_device(what: &str, kind: u32, ordinal: u32) -> PluginError {
    PluginError::new(
        Status::WrongDevice,
        format!(
            "{what} names device (kind {kind}, ordinal {ordinal}); mechanism \"{MECHANISM_NAME}\" serves only \
             CPU 0 (kind {}, ordinal {})",
            DEVICE.kind, DEVICE.ordinal
        ),
    )
}

/// Checks what `allocate`, `reserve` and `create` have in common: the
/// device, no flag bits (ABI 1.0 defines none) and a non-zero size.
#[inline(always)]
pub fn check_request(r: &Request, what: &str) -> PluginResult<()> {
    if !is_ours(&r.device) {
        return Err(wrong_device(what, r.device.kind, r.device.ordinal));
    }
    if r.flags != 0 {
        return Err(unknown_flags(what, r.flags));
    }
    if r.size == 0 {
        return Err(zero_size(what));
    }
    Ok(())
}

#[cold]
fn zero_size(what: &str) -> PluginError {
    PluginError::invalid_argument(format!("{what}: size is zero"))
}

#[cold]
fn unknown_flags(what: &str, flags: u32) -> PluginError {
    PluginError::invalid_argument(format!(
        "{what}: request flags {flags:#x} are unknown (ABI 1.0 defines none)"
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
/// bytes: non-empty, granularity-aligned, no overflow, in bounds. Returns
/// the end of the range.
pub fn check_range(offset: u64, len: u64, limit: u64, granularity: u64, what: &str) -> PluginResult<u64> {
    let fail = |why: &str| {
        Err(PluginError::out_of_range(format!("{what} range (offset {offset:#x}, len {len:#x}) {why}")))
    };
    if len == 0 {
        return fail("is empty");
    }
    if offset % granularity != 0 || len % granularity != 0 {
        return fail(&format!("is not aligned to the granularity of {granularity:#x} bytes"));
    }
    let Some(end) = offset.checked_add(len) else {
        return fail("overflows: offset + len exceeds 2^64");
    };
    if end > limit {
        return fail(&format!("ends past the {limit:#x} bytes of the object"));
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

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

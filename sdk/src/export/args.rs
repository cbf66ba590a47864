//! The arguments of a slot as its thunk sees them: host structs read as
//! untrusted prefixes ([`crate::prefix`]), out-params checked before
//! anything is made and written never past the host's `struct_size`, and
//! every refusal worded for the host's message sink.

use crate::abi::{self, *};
use crate::author::*;
use crate::prefix::{self, PrefixError, Prefixed};
use core::ptr::addr_of_mut;

/// The refusal of the host struct `what` that the prefix protocol turned
/// down, worded for the host's sink. Inlined: at each failure path the
/// error is known, and only its own out-of-line constructor is called.
#[inline(always)]
fn refusal(what: &str, e: PrefixError) -> PluginError {
    match e {
        PrefixError::Null => null_argument(what),
        PrefixError::Short { declared, min } => short_struct(what, declared, min),
    }
}

#[cold]
fn null_argument(what: &str) -> PluginError {
    PluginError::invalid_argument(format!("{what} is NULL"))
}

#[cold]
fn short_struct(what: &str, declared: u32, min: u32) -> PluginError {
    PluginError::invalid_argument(format!(
        "{what}.struct_size is {declared}, shorter than the {min} bytes of ABI 1.0"
    ))
}

/// Reads the host struct `what` as a prefix ([`prefix::read`]).
///
/// # Safety
/// As for [`prefix::read`].
#[inline(always)]
pub(super) unsafe fn read_in<T: Prefixed>(p: *const T, what: &str) -> PluginResult<T> {
    prefix::read(p).map_err(|e| refusal(what, e))
}

/// Writes the host out-struct `what` ([`prefix::write`]).
///
/// # Safety
/// As for [`prefix::write`].
#[inline(always)]
pub(super) unsafe fn write_out<T: Prefixed>(out: *mut T, value: &T, what: &str) -> PluginResult<()> {
    prefix::write(out, value).map_err(|e| refusal(what, e))
}

// Both run on every allocate and free, and callers live in other crates (the
// thunks are instantiated in the plugin), so they must be inlined there. Each
// field is loaded once, straight from the host's struct where it is long
// enough: the plugin sees one snapshot, and nothing is copied through the
// stack.
#[inline(always)]
pub(super) unsafe fn request_of(p: *const MemplugRequest) -> PluginResult<Request> {
    let declared = prefix::declared_size(p).map_err(|e| refusal("request", e))?;
    // Every 1.0 field lies inside the 1.0 prefix the host sent; the 1.1
    // field is read only when the host's struct reaches it (a 1.0 host's
    // request is OTHER). No copy either way: one compare more than 1.0.
    macro_rules! field {
        ($f:ident: $t:ty) => {
            p.cast::<u8>().add(core::mem::offset_of!(MemplugRequest, $f)).cast::<$t>().read_unaligned()
        };
    }
    let class_tag =
        if declared >= abi::size_1_1::REQUEST { field!(class_tag: u32) } else { abi::MEMPLUG_CLASS_OTHER };
    // The 1.2 fields, likewise, only when the host's struct reaches them.
    let (hints, export_types, page_size, location) = if declared >= abi::size_1_2::REQUEST {
        let location = crate::Location { kind: field!(location_kind: u32), id: field!(location_id: u32) };
        (field!(hints: u32), field!(export_types: u32), field!(page_size: u64), location)
    } else {
        (0, 0, 0, crate::Location::ANY)
    };
    Ok(Request {
        flags: field!(flags: u32),
        size: field!(size: u64),
        alignment: field!(alignment: u64),
        object_id: field!(object_id: u64),
        device: field!(device: MemplugDevice),
        class_tag,
        hints,
        export_types,
        page_size,
        location,
    })
}

#[inline(always)]
pub(super) unsafe fn object_of(p: *const MemplugObjectRef, what: &str) -> PluginResult<ObjectRef> {
    read_in(p, what)
}

#[inline(always)]
pub(super) unsafe fn block_capacity(out: *mut MemplugBlock) -> PluginResult<usize> {
    prefix::out_capacity(out).map_err(|e| refusal("out block", e))
}

#[inline(always)]
pub(super) unsafe fn write_block(out: *mut MemplugBlock, b: Block, capacity: usize) {
    // `capacity` is at least the 1.0 size (`block_capacity` checked it), so
    // while the struct has not grown since 1.0 the test folds away.
    let full = core::mem::size_of::<MemplugBlock>();
    if capacity == full || abi::size_1_0::BLOCK as usize == full {
        // What `prefix::write_checked` writes (every byte but
        // `struct_size`), as four stores rather than a copy through the
        // stack.
        addr_of_mut!((*out).reserved0).write_unaligned(0);
        addr_of_mut!((*out).addr).write_unaligned(b.addr);
        addr_of_mut!((*out).size).write_unaligned(b.size);
        addr_of_mut!((*out).handle).write_unaligned(b.handle);
    } else {
        let v = MemplugBlock { struct_size: 0, reserved0: 0, addr: b.addr, size: b.size, handle: b.handle };
        prefix::write_checked(out, &v, capacity);
    }
}

pub(super) unsafe fn write_u64(out: *mut u64, v: u64, what: &str) -> PluginResult<()> {
    if out.is_null() {
        return Err(PluginError::invalid_argument(format!("{what} is NULL")));
    }
    out.write(v);
    Ok(())
}

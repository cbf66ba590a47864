//! The `struct_size` convention of the C API's growable structs: each
//! one's first size (its `Prefixed` impl), reading and writing a caller's
//! struct by its `struct_size`, and the frozen layouts that keep later
//! minors append-only (ARCHITECTURE.md §3).

use crate::*;
use memplug_sdk::prefix::{self, PrefixError, Prefixed};

// `T => FIRST` or `T => FIRST, now NOW`: FIRST is the size the struct
// had when it appeared (the shortest a reader accepts: `SIZE_1_0` of
// `Prefixed`, which is the API 1.0 size for the 1.0 structs and the 1.1
// size for those that appeared in 1.1); NOW its size in this version when
// it has grown since.
macro_rules! prefixed {
    ($($t:ty => $c:ident $(, now $now:ident)?);* $(;)?) => {
        // SAFETY: each is a `#[repr(C)]` struct whose first field is
        // `struct_size: u32`, made of integers, handles (integers), a
        // `MemplugDevice` and integer arrays: valid when zeroed.
        $(unsafe impl Prefixed for $t { const SIZE_1_0: u32 = $c; })*
        #[cfg(test)]
        #[test]
        fn sizes_match_the_constants() {
            $(
                let now = [$c $(, $now)?];
                assert_eq!(std::mem::size_of::<$t>() as u32, now[now.len() - 1], stringify!($t));
                assert!($c <= now[now.len() - 1], stringify!($t));
            )*
        }
    };
}

prefixed! {
    MemplugHostVersion => MEMPLUG_HOST_VERSION_SIZE_1_0;
    MemplugHostMechanismInfo => MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0;
    MemplugHostBindingOptions => MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0, now MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_1;
    MemplugHostAllocationInfo => MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0;
    MemplugHostRegionInfo => MEMPLUG_HOST_REGION_INFO_SIZE_1_0;
    MemplugHostPrefixInfo => MEMPLUG_HOST_PREFIX_INFO_SIZE_1_0;
    MemplugHostPressureTicket => MEMPLUG_HOST_PRESSURE_TICKET_SIZE_1_0;
    MemplugHostClassStats => MEMPLUG_HOST_CLASS_STATS_SIZE_1_0;
    MemplugHostPoolStats => MEMPLUG_HOST_POOL_STATS_SIZE_1_0;
    MemplugHostPoolInfo => MEMPLUG_HOST_POOL_INFO_SIZE_1_0;
    MemplugHostHolderStats => MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0;
    MemplugHostPollReport => MEMPLUG_HOST_POLL_REPORT_SIZE_1_0;
    MemplugHostSettlement => MEMPLUG_HOST_SETTLEMENT_SIZE_1_0;
    MemplugHostDescriptor => MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1;
    MemplugHostDeviceIdentity => MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1;
    MemplugHostMemoryNeeds => MEMPLUG_HOST_MEMORY_NEEDS_SIZE_1_1;
    MemplugHostHandle => MEMPLUG_HOST_HANDLE_SIZE_1_1;
}

// The structs that grew, and the new ones: every field where it is said to
// be (1.0 fields never move; 1.1 fields only appended).
#[cfg(test)]
#[test]
fn api_1_1_layouts_are_frozen() {
    use std::mem::offset_of;
    type B = MemplugHostBindingOptions;
    assert_eq!(offset_of!(B, wait_ns), 16);
    assert_eq!(offset_of!(B, hints), MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0 as usize);
    assert_eq!((offset_of!(B, export_types), offset_of!(B, page_size)), (28, 32));
    assert_eq!((offset_of!(B, location_kind), offset_of!(B, location_id)), (40, 44));
    type D = MemplugHostDescriptor;
    assert_eq!((offset_of!(D, recommended_granularity), offset_of!(D, page_sizes)), (8, 16));
    assert_eq!((offset_of!(D, attributes), offset_of!(D, export_types)), (24, 28));
    assert_eq!((offset_of!(D, location_kind), offset_of!(D, location_id)), (32, 36));
    assert_eq!(offset_of!(D, maps_at_offsets), 40);
    type I = MemplugHostDeviceIdentity;
    assert_eq!((offset_of!(I, uuid), offset_of!(I, pci_domain), offset_of!(I, numa_node)), (8, 24, 44));
    type N = MemplugHostMemoryNeeds;
    assert_eq!((offset_of!(N, location_kind), offset_of!(N, page_size)), (8, 16));
    // The typed handle is the plugin ABI's `MemplugHandle`, field for field.
    type H = MemplugHostHandle;
    type A = memplug_sdk::abi::MemplugHandle;
    assert_eq!(std::mem::size_of::<H>(), std::mem::size_of::<A>());
    assert_eq!((offset_of!(H, kind), offset_of!(H, fd)), (offset_of!(A, handle_type), offset_of!(A, fd)));
    assert_eq!(
        (offset_of!(H, win32), offset_of!(H, blob_len)),
        (offset_of!(A, win32), offset_of!(A, blob_len))
    );
    assert_eq!((offset_of!(H, win32), offset_of!(H, blob)), (16, 32));
    assert_eq!(std::mem::size_of::<[u8; 64]>(), memplug_sdk::abi::MEMPLUG_HANDLE_BLOB_MAX as usize);
}

// The structs the library hands to callbacks (never read from the
// caller; their `struct_size` is the library's `sizeof`): frozen layouts on
// 64-bit targets, so that a later minor can only append.
#[cfg(all(test, target_pointer_width = "64"))]
#[test]
fn callback_struct_layouts_are_frozen() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<MemplugHostLossNotice>(), 56);
    assert_eq!(offset_of!(MemplugHostLossNotice, pool_name), 40);
    assert_eq!(size_of::<MemplugHostLifecycleEvent>(), 88);
    assert_eq!(offset_of!(MemplugHostLifecycleEvent, subscription), 16);
    assert_eq!(offset_of!(MemplugHostLifecycleEvent, notices), 56);
    assert_eq!(offset_of!(MemplugHostLifecycleEvent, settlement), 80);
    assert_eq!(size_of::<MemplugHostLifeState>(), 4);
}

/// The C API's refusal of a caller's struct `what`.
fn refusal(what: &str, e: PrefixError) -> crate::error::Error {
    let message = match e {
        PrefixError::Null => format!("{what} is NULL"),
        PrefixError::Short { declared, min } => {
            format!("{what}: struct_size is {declared}, its first size is {min} (set it to sizeof)")
        }
    };
    crate::error::Error::new(crate::status::MemplugHostStatus::InvalidArgument, message)
}

/// Writes `value` into a caller's struct whose `struct_size` says how big
/// it is, by the C API's convention ([`prefix::write_setting_size`]):
/// refuses one shorter than its first size (`Prefixed::SIZE_1_0`), writes `min(struct_size, sizeof)`
/// bytes and sets `struct_size` to that.
///
/// # Safety
/// `out` must be non-NULL and writable for its `struct_size` bytes.
pub(crate) unsafe fn write_sized<T: Prefixed>(out: *mut T, value: T, what: &str) -> crate::error::Result<()> {
    // SAFETY: the caller's contract, as above.
    unsafe { prefix::write_setting_size(out, &value) }.map_err(|e| refusal(what, e))
}

/// Refuses a caller's out-struct `write_sized` would refuse, before
/// anything is made that a refusal would have to undo (a descriptor).
///
/// # Safety
/// `out` must be non-NULL and readable for its `struct_size` field.
pub(crate) unsafe fn check_out_sized<T: Prefixed>(out: *mut T, what: &str) -> crate::error::Result<()> {
    // SAFETY: the caller's contract, as above.
    unsafe { prefix::out_capacity(out) }.map(drop).map_err(|e| refusal(what, e))
}

/// Reads a caller's struct of type `T` of `struct_size` bytes into a zeroed
/// local (fields it lacks stay zero; [`prefix::read`]); refuses one shorter
/// than its first size.
///
/// # Safety
/// `p` must be non-NULL and readable for its `struct_size` bytes.
pub(crate) unsafe fn read_sized<T: Prefixed>(p: *const T, what: &str) -> crate::error::Result<T> {
    // SAFETY: the caller's contract, as above.
    unsafe { prefix::read(p) }.map_err(|e| refusal(what, e))
}

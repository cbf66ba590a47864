//! The `struct_size` prefix protocol of the ABI, in one place: every reader
//! and writer of a growable struct and of a plugin string — the SDK's slot
//! thunks, the host's loader, the conformance kit, the C API — goes
//! through these functions.
//!
//! The rules (ARCHITECTURE.md §3, `abi/`):
//!
//! * A growable struct starts with `uint32_t struct_size`, the size its
//!   writer knows. Minors only append fields.
//! * A reader refuses NULL and a struct shorter than its 1.0 size, and
//!   copies `min(struct_size, sizeof)` bytes into a zeroed local: fields the
//!   writer did not know read as zero, bytes past them are never touched.
//! * A writer into memory the other side owns (an out-param) writes no byte
//!   past the `struct_size` that side set, and leaves that `struct_size`
//!   as it is. The C API's structs follow a variant of their own
//!   ([`write_setting_size`]): the library also sets `struct_size` to the
//!   bytes it wrote.
//! * A plugin string is NUL-terminated UTF-8 and is read byte by byte, at
//!   most [`MAX_NAME`] bytes, never past its terminator.
//!
//! Errors carry no text of their caller's: each caller turns a
//! [`PrefixError`] or [`StringError`] into its own refusal, naming the
//! struct in its own words.

use crate::abi::{self, *};
use core::ffi::c_char;
use core::fmt;
use core::mem::{size_of, MaybeUninit};

/// A growable ABI struct: `#[repr(C)]`, its first field the `u32
/// struct_size`, and valid when every byte is zero.
///
/// # Safety
/// An implementation promises all three: the functions of this module read
/// the first four bytes as the declared size, build values by copying bytes
/// into an all-zero `Self`, and write every byte but the first four of a
/// `Self` into memory the other side owns. `SIZE_1_0` is at least 4 and at
/// most `size_of::<Self>()`.
pub unsafe trait Prefixed: Copy {
    /// The frozen size the struct had when it first appeared (ABI 1.0, or
    /// API 1.0 for the C API's structs): a reader refuses a struct that
    /// declares less.
    const SIZE_1_0: u32;
}

/// Why a growable struct was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixError {
    /// The pointer is NULL.
    Null,
    /// `struct_size` is below the 1.0 size.
    Short {
        /// The `struct_size` the writer set.
        declared: u32,
        /// The 1.0 size of the struct.
        min: u32,
    },
}

impl fmt::Display for PrefixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefixError::Null => f.write_str("the pointer is NULL"),
            PrefixError::Short { declared, min } => {
                write!(f, "struct_size is {declared}, shorter than the {min} bytes of ABI 1.0")
            }
        }
    }
}

impl std::error::Error for PrefixError {}

// Every failure path calls one of these: a branch whose block calls a
// `#[cold]` function is weighted as unlikely, so the hot path falls
// through. Inlined, so the caller knows which error it got and maps it
// with no test of its own.
#[cold]
#[inline(always)]
fn refused_null() -> PrefixError {
    PrefixError::Null
}

#[cold]
#[inline(always)]
fn refused_short(declared: u32, min: u32) -> PrefixError {
    PrefixError::Short { declared, min }
}

/// The `struct_size` at `p`, once it is known to be acceptable: refuses
/// NULL and a size below `T::SIZE_1_0`.
///
/// # Safety
/// `p` is NULL or points to a readable `u32` (at any alignment).
#[inline(always)]
pub unsafe fn declared_size<T: Prefixed>(p: *const T) -> Result<u32, PrefixError> {
    if p.is_null() {
        return Err(refused_null());
    }
    let declared = p.cast::<u32>().read_unaligned();
    if declared < T::SIZE_1_0 {
        return Err(refused_short(declared, T::SIZE_1_0));
    }
    Ok(declared)
}

/// Reads an untrusted struct as a prefix: `min(struct_size, sizeof T)`
/// bytes copied into a zeroed `T`. Refuses NULL and a struct shorter than
/// `T::SIZE_1_0`.
///
/// # Safety
/// `p` is NULL or points to at least `struct_size` readable bytes (at any
/// alignment), where `struct_size` is the `u32` at offset 0.
#[inline(always)]
pub unsafe fn read<T: Prefixed>(p: *const T) -> Result<T, PrefixError> {
    // Written only when the prefix is short; read only through the view.
    let mut local = MaybeUninit::<T>::uninit();
    let v = view_into(p, local.as_mut_ptr())?;
    Ok(v.read_unaligned())
}

/// [`read`], and the `struct_size` the writer declared (a reader that
/// judges what a table of a newer or older minor publishes needs it).
///
/// # Safety
/// As for [`read`].
#[inline]
pub unsafe fn read_with_size<T: Prefixed>(p: *const T) -> Result<(T, u32), PrefixError> {
    let declared = declared_size(p)?;
    let mut local = zeroed::<T>();
    let n = whole_words(declared).min(size_of::<T>());
    core::ptr::copy_nonoverlapping(p.cast::<u8>(), (&mut local as *mut T).cast::<u8>(), n);
    Ok((local, declared))
}

/// [`read`] without the copy: a pointer to `size_of::<T>()` readable bytes
/// holding the prefix, zero-extended. That is `p` itself for a writer of
/// this minor or newer (the common case, so its fields are loaded straight
/// from the writer's struct, each once), or `local` holding the copy of a
/// shorter prefix.
///
/// # Safety
/// As for [`read`]; the answer may be unaligned and is valid while both
/// `*p` and `local` are.
#[inline(always)]
pub unsafe fn view<T: Prefixed>(p: *const T, local: &mut T) -> Result<*const T, PrefixError> {
    view_into(p, local)
}

/// [`view`] into a local that need not be initialised: it is written
/// (whole) exactly when the answer points to it.
#[inline(always)]
unsafe fn view_into<T: Prefixed>(p: *const T, local: *mut T) -> Result<*const T, PrefixError> {
    if p.is_null() {
        return Err(refused_null());
    }
    let declared = p.cast::<u32>().read_unaligned();
    if declared as usize >= size_of::<T>() {
        return Ok(p);
    }
    local.write(copy_short(p, declared)?);
    Ok(local)
}

/// The part of [`view`] for a writer that knows an older, shorter struct.
#[cold]
unsafe fn copy_short<T: Prefixed>(p: *const T, declared: u32) -> Result<T, PrefixError> {
    if declared < T::SIZE_1_0 {
        return Err(refused_short(declared, T::SIZE_1_0));
    }
    let mut local = zeroed::<T>();
    core::ptr::copy_nonoverlapping(
        p.cast::<u8>(),
        (&mut local as *mut T).cast::<u8>(),
        whole_words(declared),
    );
    Ok(local)
}

/// The bytes of a short prefix that hold whole fields: every ABI struct's
/// fields are at most 8 bytes and every size any minor defines is a
/// multiple of 8, so a `struct_size` that is not one (a writer that is
/// wrong) ends inside a field — a pointer cut in half — and the partial
/// word is not read: it stays zero, as a field the writer did not publish.
#[inline(always)]
fn whole_words(declared: u32) -> usize {
    declared as usize & !7
}

/// How many bytes of an out-struct the other side owns may be written:
/// `min(struct_size, sizeof T)`. Checks NULL and the 1.0 size before
/// anything is made, so a bad out-param never strands an object its caller
/// cannot receive.
///
/// # Safety
/// `out` is NULL or points to a readable `u32` `struct_size`.
#[inline(always)]
pub unsafe fn out_capacity<T: Prefixed>(out: *mut T) -> Result<usize, PrefixError> {
    let declared = declared_size(out.cast_const())?;
    Ok((declared as usize).min(size_of::<T>()))
}

/// Writes `value` into an out-struct whose capacity [`out_capacity`]
/// returned: every byte but `struct_size`, which stays as its owner set it.
///
/// # Safety
/// `out` points to at least `capacity` writable bytes, and `capacity` is
/// between `T::SIZE_1_0` and `size_of::<T>()`.
#[inline(always)]
pub unsafe fn write_checked<T: Prefixed>(out: *mut T, value: &T, capacity: usize) {
    if capacity == size_of::<T>() {
        // Fixed length: compiles to a few moves. The shorter, variable
        // length lives in its own function so the two copies cannot be
        // merged into one call to `memcpy`.
        let src = (value as *const T).cast::<u8>().add(4);
        let dst = out.cast::<u8>().add(4);
        core::ptr::copy_nonoverlapping(src, dst, size_of::<T>() - 4);
    } else {
        write_short(out, value, capacity);
    }
}

/// The part of [`write_checked`] for an owner that knows an older, shorter
/// struct.
#[cold]
#[inline(never)]
unsafe fn write_short<T: Prefixed>(out: *mut T, value: &T, capacity: usize) {
    let src = (value as *const T).cast::<u8>().add(4);
    let dst = out.cast::<u8>().add(4);
    core::ptr::copy_nonoverlapping(src, dst, capacity - 4);
}

/// Writes `value` into an out-struct the other side owns, never past its
/// `struct_size` (which stays as that side set it). Refuses NULL and a
/// struct shorter than `T::SIZE_1_0`, writing nothing then.
///
/// # Safety
/// `out` is NULL or points to at least `struct_size` writable bytes.
#[inline(always)]
pub unsafe fn write<T: Prefixed>(out: *mut T, value: &T) -> Result<(), PrefixError> {
    let capacity = out_capacity(out)?;
    write_checked(out, value, capacity);
    Ok(())
}

/// The C API's convention (`memplug_host.h`): writes `value` as [`write()`]
/// does, then sets `struct_size` to the bytes written, `min(struct_size,
/// sizeof T)`, so the caller learns how much of its struct the library
/// filled. Refuses NULL and a struct shorter than `T::SIZE_1_0`, writing
/// nothing then.
///
/// # Safety
/// `out` is NULL or points to at least `struct_size` writable bytes.
pub unsafe fn write_setting_size<T: Prefixed>(out: *mut T, value: &T) -> Result<(), PrefixError> {
    let capacity = out_capacity(out)?;
    write_checked(out, value, capacity);
    out.cast::<u32>().write_unaligned(capacity as u32);
    Ok(())
}

/// An all-zero `T`.
#[inline(always)]
fn zeroed<T: Prefixed>() -> T {
    // SAFETY: a `Prefixed` type is valid when zeroed (the trait's contract).
    unsafe { core::mem::zeroed() }
}

/// Longest plugin string, terminator included, read before giving up on
/// finding its terminator.
pub const MAX_NAME: usize = 256;

/// Why a plugin string was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StringError {
    /// The pointer is NULL.
    Null,
    /// No NUL terminator within [`MAX_NAME`] bytes.
    Unterminated,
    /// The string is empty.
    Empty,
    /// The string is not UTF-8.
    NotUtf8,
}

/// Written to follow the string's name: "name is empty".
impl fmt::Display for StringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StringError::Null => f.write_str("is NULL"),
            StringError::Unterminated => write!(f, "has no NUL terminator within {MAX_NAME} bytes"),
            StringError::Empty => f.write_str("is empty"),
            StringError::NotUtf8 => f.write_str("is not UTF-8"),
        }
    }
}

impl std::error::Error for StringError {}

/// Reads a NUL-terminated, non-empty UTF-8 string the other side publishes,
/// byte by byte and never past its terminator (it may end right before
/// unmapped memory), at most [`MAX_NAME`] bytes.
///
/// # Safety
/// `p` is NULL or readable up to its terminator or [`MAX_NAME`] bytes,
/// whichever comes first.
pub unsafe fn read_bounded_str(p: *const c_char) -> Result<String, StringError> {
    if p.is_null() {
        return Err(StringError::Null);
    }
    let mut bytes = Vec::new();
    loop {
        let b = p.add(bytes.len()).cast::<u8>().read();
        if b == 0 {
            break;
        }
        bytes.push(b);
        if bytes.len() == MAX_NAME {
            return Err(StringError::Unterminated);
        }
    }
    if bytes.is_empty() {
        return Err(StringError::Empty);
    }
    String::from_utf8(bytes).map_err(|_| StringError::NotUtf8)
}

macro_rules! prefixed {
    ($($t:ty => $min:expr),* $(,)?) => {
        // SAFETY: each is a `#[repr(C)]` ABI struct whose first field is
        // `struct_size: u32` and whose fields are integers, raw pointers,
        // `Option<extern fn>` and `MemplugDevice`: all valid as zero.
        $(unsafe impl Prefixed for $t { const SIZE_1_0: u32 = $min; })*
    };
}

prefixed! {
    MemplugHostInfo => abi::size_1_0::HOST_INFO,
    MemplugNegotiation => abi::size_1_0::NEGOTIATION,
    MemplugPlugin => abi::size_1_0::PLUGIN,
    MemplugMechanism => abi::size_1_0::MECHANISM,
    MemplugProperties => abi::size_1_0::PROPERTIES,
    MemplugMemoryInfo => abi::size_1_0::MEMORY_INFO,
    MemplugRequest => abi::size_1_0::REQUEST,
    MemplugBlock => abi::size_1_0::BLOCK,
    MemplugObjectRef => abi::size_1_0::OBJECT_REF,
    MemplugAllocator => abi::size_1_0::ALLOCATOR,
    MemplugVirtualBacking => abi::size_1_0::VIRTUAL_BACKING,
    MemplugSharedMapping => abi::size_1_0::SHARED_MAPPING,
    MemplugSync => abi::size_1_0::SYNC,
    // New in 1.2: its smallest size is its 1.2 size.
    MemplugHostServices => abi::size_1_2::HOST_SERVICES,
    MemplugDeviceIdentity => abi::size_1_2::DEVICE_IDENTITY,
    MemplugHandle => abi::size_1_2::HANDLE,
    MemplugPeerAccess => abi::size_1_2::PEER_ACCESS,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1.1 request cut to `declared` bytes (what a writer of that
    /// `struct_size` publishes; at least its `struct_size`), the rest of the
    /// buffer 0xee.
    fn request_bytes(declared: u32) -> Vec<u8> {
        let full = MemplugRequest {
            struct_size: declared,
            flags: 1,
            size: 2,
            alignment: 3,
            object_id: 4,
            device: MemplugDevice { kind: 5, ordinal: 6 },
            class_tag: 7,
            reserved0: 0,
            ..Default::default()
        };
        let mut b = vec![0xee; 128];
        // SAFETY: plain data, copied whole into a larger buffer.
        let src = unsafe {
            core::slice::from_raw_parts(
                (&full as *const MemplugRequest).cast::<u8>(),
                size_of::<MemplugRequest>(),
            )
        };
        let n = (declared as usize).clamp(4, src.len());
        b[..n].copy_from_slice(&src[..n]);
        b
    }

    #[test]
    fn null_and_short_are_refused() {
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read::<MemplugRequest>(core::ptr::null()) }.err(), Some(PrefixError::Null));
        for declared in [0, 4, abi::size_1_0::REQUEST - 1] {
            let b = request_bytes(declared);
            // SAFETY: the buffer holds at least the declared bytes.
            let got = unsafe { read::<MemplugRequest>(b.as_ptr().cast()) }.map(|r| r.size);
            assert_eq!(got, Err(PrefixError::Short { declared, min: abi::size_1_0::REQUEST }));
            // SAFETY: as above.
            let got = unsafe { read_with_size::<MemplugRequest>(b.as_ptr().cast()) }.map(|(r, _)| r.size);
            assert_eq!(got, Err(PrefixError::Short { declared, min: abi::size_1_0::REQUEST }));
        }
    }

    #[test]
    fn a_short_prefix_is_zero_extended_and_a_long_one_cut() {
        for (declared, class_tag) in [(abi::size_1_0::REQUEST, 0), (abi::size_1_1::REQUEST, 7), (100, 7)] {
            let b = request_bytes(declared);
            // SAFETY: the buffer holds at least the declared bytes.
            let r = unsafe { read::<MemplugRequest>(b.as_ptr().cast()) }.unwrap();
            assert_eq!((r.struct_size, r.size, r.device.ordinal, r.class_tag), (declared, 2, 6, class_tag));
            // SAFETY: as above.
            let (r2, d) = unsafe { read_with_size::<MemplugRequest>(b.as_ptr().cast()) }.unwrap();
            assert_eq!((d, r2.class_tag, r2.object_id), (declared, class_tag, 4));
        }
    }

    #[test]
    fn a_struct_size_that_cuts_a_field_reads_no_part_of_it() {
        // 44 bytes end inside the 8-byte word holding class_tag and
        // reserved0: that word stays zero (class OTHER), nothing half-read.
        let b = request_bytes(44);
        // SAFETY: the buffer holds the declared bytes and more.
        let r = unsafe { read::<MemplugRequest>(b.as_ptr().cast()) }.unwrap();
        assert_eq!((r.object_id, r.class_tag), (4, 0));
        let (r, d) = unsafe { read_with_size::<MemplugRequest>(b.as_ptr().cast()) }.unwrap();
        assert_eq!((d, r.class_tag), (44, 0));
    }

    #[test]
    fn a_view_is_the_struct_itself_when_it_is_long_enough() {
        let b = request_bytes(abi::size_1_2::REQUEST);
        let mut local = zeroed::<MemplugRequest>();
        // SAFETY: the buffer holds the whole struct.
        let v = unsafe { view::<MemplugRequest>(b.as_ptr().cast(), &mut local) }.unwrap();
        assert_eq!(v.cast::<u8>(), b.as_ptr());
        let b = request_bytes(abi::size_1_0::REQUEST);
        // SAFETY: as above.
        let v = unsafe { view::<MemplugRequest>(b.as_ptr().cast(), &mut local) }.unwrap();
        assert_eq!(v, &local as *const MemplugRequest);
        assert_eq!(local.class_tag, 0);
    }

    #[test]
    fn writes_stop_at_struct_size_and_keep_it_or_set_it() {
        let value =
            MemplugRequest { struct_size: 999, size: 0x1111, class_tag: 0x2222, ..Default::default() };
        let sizes = [(abi::size_1_0::REQUEST, 40), (abi::size_1_1::REQUEST, 48), (64, 64), (88, 72)];
        for (declared, written) in sizes {
            let mut b = [0xeeu8; 96];
            b[..4].copy_from_slice(&declared.to_ne_bytes());
            // SAFETY: the buffer holds at least the declared bytes.
            unsafe { write::<MemplugRequest>(b.as_mut_ptr().cast(), &value) }.unwrap();
            assert_eq!(b[..4], declared.to_ne_bytes(), "struct_size stays the owner's");
            assert!(b[written..].iter().all(|&x| x == 0xee), "nothing past {written}");
            assert_eq!(b[8], 0x11, "the fields are written");

            let mut c = [0xeeu8; 96];
            c[..4].copy_from_slice(&declared.to_ne_bytes());
            // SAFETY: as above.
            unsafe { write_setting_size::<MemplugRequest>(c.as_mut_ptr().cast(), &value) }.unwrap();
            assert_eq!(c[..4], (written as u32).to_ne_bytes(), "struct_size is what was written");
            assert_eq!(b[4..], c[4..]);
        }
        let mut b = [0xeeu8; 80];
        b[..4].copy_from_slice(&39u32.to_ne_bytes());
        // SAFETY: as above; nothing is written.
        let e = unsafe { write_setting_size::<MemplugRequest>(b.as_mut_ptr().cast(), &value) };
        assert_eq!(e, Err(PrefixError::Short { declared: 39, min: 40 }));
        assert!(b[4..].iter().all(|&x| x == 0xee));
        // SAFETY: NULL is allowed.
        let e = unsafe { write::<MemplugRequest>(core::ptr::null_mut(), &value) };
        assert_eq!(e, Err(PrefixError::Null));
    }

    #[test]
    fn bounded_strings() {
        let read = |b: &[u8]| unsafe { read_bounded_str(b.as_ptr().cast()) };
        assert_eq!(read(b"cpu\0"), Ok("cpu".to_string()));
        assert_eq!(read(b"\0"), Err(StringError::Empty));
        assert_eq!(read(b"n\xff\0"), Err(StringError::NotUtf8));
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read_bounded_str(core::ptr::null()) }, Err(StringError::Null));
        let mut longest = vec![b'a'; MAX_NAME - 1];
        longest.push(0);
        assert_eq!(read(&longest).map(|s| s.len()), Ok(MAX_NAME - 1));
        // Exactly MAX_NAME bytes without a terminator: read to the last one
        // and no further.
        assert_eq!(read(&vec![b'a'; MAX_NAME]), Err(StringError::Unterminated));
        assert_eq!(StringError::Unterminated.to_string(), "has no NUL terminator within 256 bytes");
    }

    #[test]
    fn error_text() {
        assert_eq!(PrefixError::Null.to_string(), "the pointer is NULL");
        assert_eq!(
            PrefixError::Short { declared: 3, min: 40 }.to_string(),
            "struct_size is 3, shorter than the 40 bytes of ABI 1.0"
        );
    }
}

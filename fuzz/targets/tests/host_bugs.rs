//! Host bugs the fuzz targets found, one test each, ignored until fixed
//! (run them with `cargo test -p memplug-fuzz-targets --test host_bugs --
//! --ignored`). When a fix lands: drop the `#[ignore]`, and re-enable the
//! input class in the target (named in each test).
//!
//! This binary caps every single allocation at 1 GiB (the global allocator
//! below refuses larger ones), so an allocation sized by an untrusted count
//! fails the same way on every machine, whatever it could overcommit.

use memplug_host::{LoadError, LoadOptions, Plugin};
use memplug_sdk::abi::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_char, c_void};
use std::ptr;

struct Capped;

const CAP: usize = 1 << 30;

// SAFETY: forwards to the system allocator, refusing (null) requests above
// the cap, which `GlobalAlloc` allows.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > CAP {
            return ptr::null_mut();
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;

unsafe extern "C" fn live_zero(_: *mut c_void) -> u64 {
    0
}

/// A `MemplugPlugin` that is well-formed except for its mechanism array:
/// `count` claimed, one NULL entry present.
struct Published {
    plugin: MemplugPlugin,
    array: [*const MemplugMechanism; 1],
}

thread_local! {
    static PUBLISHED: std::cell::Cell<*const MemplugPlugin> = const { std::cell::Cell::new(ptr::null()) };
}

unsafe extern "C" fn entry(
    _: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    _: *const MemplugMessageSink,
) -> MemplugStatus {
    (*out).agreed_minor = MEMPLUG_ABI_MINOR;
    (*out).plugin = PUBLISHED.with(|p| p.get());
    MEMPLUG_STATUS_OK
}

fn load_with_count(count: u32) -> Result<Plugin, LoadError> {
    // SAFETY: every ABI struct is valid zeroed.
    let mut p: Box<Published> =
        Box::new(Published { plugin: unsafe { std::mem::zeroed() }, array: [ptr::null()] });
    p.plugin.struct_size = std::mem::size_of::<MemplugPlugin>() as u32;
    p.plugin.abi_major = MEMPLUG_ABI_MAJOR;
    p.plugin.min_minor = 0;
    p.plugin.max_minor = MEMPLUG_ABI_MINOR;
    p.plugin.name = c"count-plugin".as_ptr().cast::<c_char>();
    p.plugin.version = c"1".as_ptr().cast::<c_char>();
    p.plugin.live_objects = Some(live_zero);
    p.plugin.mechanism_count = count;
    p.plugin.mechanisms = p.array.as_ptr();
    PUBLISHED.with(|c| c.set(&p.plugin));
    // SAFETY: `entry` publishes `p`, alive until after the call; the host
    // reads at most the array's one entry if it stops at the NULL there.
    let r = unsafe { Plugin::from_entry(entry, "count", &LoadOptions::default()) };
    PUBLISHED.with(|c| c.set(ptr::null()));
    r
}

fn assert_refused_at_entry_0(r: Result<Plugin, LoadError>) {
    match r {
        Err(LoadError::NullRequired { what, .. }) => assert_eq!(what, "mechanism #0"),
        other => panic!("expected NullRequired for mechanism #0, got {other:?}"),
    }
}

/// The same plugin with an honest count is refused at the NULL entry: the
/// test's premise.
#[test]
fn a_null_first_mechanism_is_refused() {
    assert_refused_at_entry_0(load_with_count(1));
    assert_refused_at_entry_0(load_with_count(1 << 20));
}

/// Found by `plugin_descriptor` (input class `ABSURD_COUNT` in
/// `src/plugin_descriptor.rs`, disabled until this is fixed).
///
/// `Plugin::negotiate` (host/src/plugin.rs) reserves
/// `Vec::with_capacity(desc.mechanism_count as usize)` before it has read a
/// single entry: a plugin that claims `mechanism_count = u32::MAX` makes the
/// host ask for 32 GiB, and the process aborts ("memory allocation of
/// 34359738360 bytes failed") — although the first entry is NULL and a
/// careful reader refuses there without reading further. An untrusted
/// count must not size an allocation.
///
/// Fix: `let mut mechanisms = Vec::new();` (or a small cap, e.g.
/// `Vec::with_capacity((desc.mechanism_count as usize).min(16))`); the
/// vector grows with the entries actually validated.
#[test]
fn an_absurd_mechanism_count_is_refused_not_fatal() {
    assert_refused_at_entry_0(load_with_count(u32::MAX));
}

unsafe extern "C" fn properties(
    _: *mut c_void,
    out: *mut MemplugProperties,
    _: *const MemplugMessageSink,
) -> MemplugStatus {
    (*out).min_alignment = 16;
    (*out).max_alignment = 4096;
    MEMPLUG_STATUS_OK
}

unsafe extern "C" fn allocate(
    _: *mut c_void,
    _: *const MemplugRequest,
    _: *mut MemplugBlock,
    _: *const MemplugMessageSink,
) -> MemplugStatus {
    MEMPLUG_STATUS_UNSUPPORTED
}

unsafe extern "C" fn deallocate(
    _: *mut c_void,
    _: *const MemplugObjectRef,
    _: *const MemplugMessageSink,
) -> MemplugStatus {
    MEMPLUG_STATUS_UNSUPPORTED
}

/// A 1.2 plugin of one allocator-only mechanism whose `struct_size` is
/// `mech_size`, with its `identity` pointer set (to a valid identity).
struct WithIdentity {
    identity: MemplugDeviceIdentity,
    allocator: MemplugAllocator,
    mechanism: MemplugMechanism,
    array: [*const MemplugMechanism; 1],
    plugin: MemplugPlugin,
}

fn load_with_identity(mech_size: u32) -> Plugin {
    // SAFETY: every ABI struct is valid zeroed.
    let mut p: Box<WithIdentity> = Box::new(unsafe { std::mem::zeroed() });
    p.identity = MemplugDeviceIdentity {
        struct_size: MEMPLUG_DEVICE_IDENTITY_SIZE_1_2,
        valid: MEMPLUG_IDENTITY_NUMA_NODE,
        ..Default::default()
    };
    p.allocator.struct_size = MEMPLUG_ALLOCATOR_SIZE_1_0;
    p.allocator.properties = Some(properties);
    p.allocator.allocate = Some(allocate);
    p.allocator.deallocate = Some(deallocate);
    p.mechanism.struct_size = mech_size;
    p.mechanism.capabilities = MEMPLUG_CAP_ALLOCATOR;
    p.mechanism.mechanism_id = 1;
    p.mechanism.name = c"m".as_ptr();
    p.mechanism.device = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    p.mechanism.allocator = &p.allocator;
    p.mechanism.identity = &p.identity;
    p.array = [&p.mechanism];
    p.plugin.struct_size = std::mem::size_of::<MemplugPlugin>() as u32;
    p.plugin.abi_major = MEMPLUG_ABI_MAJOR;
    p.plugin.max_minor = MEMPLUG_ABI_MINOR;
    p.plugin.name = c"identity-plugin".as_ptr();
    p.plugin.version = c"1".as_ptr();
    p.plugin.live_objects = Some(live_zero);
    p.plugin.mechanism_count = 1;
    p.plugin.mechanisms = p.array.as_ptr();
    PUBLISHED.with(|c| c.set(&p.plugin));
    // SAFETY: `entry` publishes `p`, leaked below so it outlives the plugin.
    let r = unsafe { Plugin::from_entry(entry, "identity", &LoadOptions::default()) };
    PUBLISHED.with(|c| c.set(ptr::null()));
    Box::leak(p);
    r.expect("a well-formed plugin loads")
}

/// The premise: with a 1.2-sized mechanism (88 bytes) the identity is
/// read; with a 1.1-sized one (the pointer wholly past `struct_size`) it is not.
#[test]
fn an_identity_is_read_only_from_a_mechanism_that_holds_it() {
    let p = load_with_identity(MEMPLUG_MECHANISM_SIZE_1_2);
    assert_eq!(p.mechanisms()[0].identity().map(|i| i.valid), Some(MEMPLUG_IDENTITY_NUMA_NODE));
    let p = load_with_identity(MEMPLUG_MECHANISM_SIZE_1_1);
    assert_eq!(p.mechanisms()[0].identity(), None);
}

/// Found by `plugin_descriptor` (input class `PARTIAL_IDENTITY` in
/// `src/plugin_descriptor.rs`, re-enabled with the fix).
///
/// `MemplugMechanism::identity` lies at offset 72..80 (the 1.2 struct,
/// `MEMPLUG_MECHANISM_SIZE_1_2`, is 88 bytes since `peer_access` follows
/// it). The loader (`Reader::identity`, host/src/plugin/v1_2.rs) read the
/// mechanism as a prefix — the bytes up to `struct_size`, the rest zero —
/// and followed `identity` whenever that was non-NULL: for a `struct_size`
/// of 73 to 79 the pointer was assembled from its first bytes (the
/// plugin's) and zeros, and the host dereferenced an address the plugin
/// never published (here the real one, as an x86-64 user address has a
/// zero top byte; in general anything).
///
/// Fixed by reading prefixes in whole 8-byte words (`memplug_sdk::prefix`):
/// a `struct_size` that cuts a field leaves it zero.
#[test]
fn a_mechanism_too_short_for_its_identity_pointer_has_none() {
    for size in MEMPLUG_MECHANISM_SIZE_1_1 + 1..80 {
        let p = load_with_identity(size);
        assert_eq!(p.mechanisms()[0].identity(), None, "struct_size {size}");
    }
}

/// The other side of the whole-word rule: from 80 bytes the mechanism
/// holds the whole identity pointer (its 1.2 `peer_access` pointer, at
/// 80..88, cut or absent) and the identity is read.
#[test]
fn a_mechanism_holding_the_whole_identity_pointer_has_it() {
    for size in 80..=MEMPLUG_MECHANISM_SIZE_1_2 {
        let p = load_with_identity(size);
        assert_eq!(
            p.mechanisms()[0].identity().map(|i| i.valid),
            Some(MEMPLUG_IDENTITY_NUMA_NODE),
            "struct_size {size}"
        );
    }
}

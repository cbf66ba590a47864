//! The host against every misbehaving plugin of `abi-tests/c/bad_plugin.c`:
//! one assertion of the host's response per variant, as
//! `abi-tests/MISBEHAVIOURS.md` states it (that table also names the
//! conformance check that catches each; `cli/tests/conformance.rs` asserts
//! those verdicts). A Rust SDK plugin panicking in every slot kind is the
//! one misbehaviour not built from this C source: see
//! `host/tests/in_process_plugins.rs`.
//!
//! Each test loads its own variant: a library opened twice by one path is
//! one library, with one set of counters.
//!
//! The containment variants (`contained/mod.rs`: faults at run time the host
//! must survive without a use-after-free, an alias or a closed descriptor)
//! are loaded with `check_overlaps` on explicitly; their descriptor faults
//! are in `tests/descriptors.rs`, which runs them one at a time.

mod contained;

use contained::{checked, contained_plugin, contained_plugin_copy, load_contained, CONTAINMENT_VARIANTS};
use memplug_host::governor::AllocationClass;
use memplug_host::mechanism::stray_host_fn_calls;
use memplug_host::{
    inside_plugin_call, Access, BindingError, BindingSpec, DeferredFreeQueue, FnFence, LoadError,
    LoadOptions, ObjectKind, OverlapCheck, Plugin, PluginFence, ProcessMemoryManager, Requirements, Retire,
    RetireOutcome, Status,
};
use memplug_sdk::abi::{
    MemplugDevice, MEMPLUG_DEVICE_CPU, MEMPLUG_DEVICE_CUDA, MEMPLUG_DEVICE_CUDA_HOST, MEMPLUG_DEVICE_ROCM,
    MEMPLUG_MESSAGE_MAX,
};
use memplug_test_support::{bad_plugin, repo_root, BAD_PLUGIN_VARIANTS};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

fn load(variant: &str) -> Plugin {
    Plugin::load(bad_plugin(Some(variant))).unwrap_or_else(|e| panic!("{variant} was refused: {e}"))
}

fn refused(variant: &str) -> LoadError {
    match Plugin::load(bad_plugin(Some(variant))) {
        Ok(p) => panic!("{variant} loaded: {p:?}"),
        Err(e) => e,
    }
}

fn mentions(e: &impl std::fmt::Display, parts: &[&str]) {
    let text = e.to_string();
    for p in parts {
        assert!(text.contains(p), "{text:?} does not mention {p:?}");
    }
}

/// Allocates and frees through the host, then unloads: the plugin works.
fn works_and_unloads(p: Plugin) {
    let m = p.mechanisms()[0].clone();
    let a = unsafe { m.ungoverned() }.allocator().allocate(100, 16).unwrap();
    assert_eq!(a.addr() % 16, 0);
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    drop(m);
    p.unload().unwrap();
}

// ---------------------------------------------------------------------------
// Refused at load, with a message naming the problem
// ---------------------------------------------------------------------------

/// `(variant, what the message mentions, whether the refusal is of the
/// right kind)`.
type Refusal = (&'static str, &'static [&'static str], fn(&LoadError) -> bool);

#[test]
fn malformed_plugins_are_refused_naming_the_problem() {
    let cases: &[Refusal] = &[
        ("BAD_NO_ENTRY", &["memplug_plugin_v1"], |e| matches!(e, LoadError::MissingEntrySymbol { .. })),
        ("BAD_WRONG_MAJOR", &["major 2"], |e| matches!(e, LoadError::Malformed { .. })),
        ("BAD_VERSION_REFUSE", &["bad_plugin refuses"], |e| matches!(e, LoadError::VersionMismatch { .. })),
        ("BAD_AGREED_MINOR", &["agreed on minor 7"], |e| matches!(e, LoadError::Malformed { .. })),
        ("BAD_SHORT_PLUGIN", &["plugin descriptor"], |e| {
            matches!(e, LoadError::ShortStruct { declared: 16, required: 72, .. })
        }),
        ("BAD_SHORT_MECHANISM", &["mechanism #0"], |e| {
            matches!(e, LoadError::ShortStruct { declared: 8, required: 72, .. })
        }),
        ("BAD_SHORT_ALLOCATOR", &["allocator"], |e| {
            matches!(e, LoadError::ShortStruct { declared: 12, required: 40, .. })
        }),
        ("BAD_NULL_ALLOCATE", &["allocator.allocate"], |e| matches!(e, LoadError::NullRequired { .. })),
        ("BAD_NULL_ALLOCATOR", &["allocator pointer is NULL"], |e| {
            matches!(e, LoadError::CapabilityMismatch { .. })
        }),
        (
            "BAD_FLAG_WITHOUT_POINTER",
            &["MEMPLUG_CAP_VIRTUAL_BACKING is set", "virtual_backing pointer is NULL"],
            |e| matches!(e, LoadError::CapabilityMismatch { .. }),
        ),
        ("BAD_POINTER_WITHOUT_FLAG", &["sync pointer is set", "MEMPLUG_CAP_SYNC is not"], |e| {
            matches!(e, LoadError::CapabilityMismatch { .. })
        }),
        ("BAD_ZERO_MECHANISMS", &["no mechanism"], |e| matches!(e, LoadError::Malformed { .. })),
        ("BAD_NULL_NAME", &["name"], |e| matches!(e, LoadError::NullRequired { .. })),
        ("BAD_DUPLICATE_ID", &["share id 7"], |e| matches!(e, LoadError::Malformed { .. })),
        ("BAD_ENTRY_FAILS", &["init failed: no device"], |e| {
            matches!(e, LoadError::EntryFailed { status: Status::Internal, .. })
        }),
        ("BAD_NO_LIVE_OBJECTS", &["live_objects"], |e| matches!(e, LoadError::NullRequired { .. })),
        ("BAD_NULL_PLUGIN", &["plugin descriptor"], |e| matches!(e, LoadError::NullRequired { .. })),
        // A 1.0 plugin claiming bit 4 (MEMPLUG_CAP_SHARED_EXPORT, ABI 1.1):
        // this host knows the bit, so the claim contradicts the agreed minor.
        ("BAD_CAPS_ABOVE_MINOR", &["MEMPLUG_CAP_SHARED_EXPORT", "above the agreed minor"], |e| {
            matches!(e, LoadError::CapabilityMismatch { .. })
        }),
        ("BAD_DUPLICATE_NAME", &["share the name 'bad-plugin'"], |e| {
            matches!(e, LoadError::Malformed { .. })
        }),
    ];
    for (variant, parts, kind) in cases {
        let e = refused(variant);
        assert!(kind(&e), "{variant}: unexpected kind of refusal: {e}");
        mentions(&e, parts);
    }
}

// ---------------------------------------------------------------------------
// Loaded: the host reads only what it knows and keeps its own counts
// ---------------------------------------------------------------------------

#[test]
fn over_long_structs_load_and_only_the_prefix_is_read() {
    let p = load("BAD_LONG_STRUCTS");
    assert_eq!(p.abi_version(), (1, 0));
    let m = &p.mechanisms()[0];
    assert_eq!(m.name(), "bad-plugin");
    assert_eq!(m.capabilities().unknown_bits(), 0);
    // Past the 1.0 prefix the mechanism's `identity` pointer is garbage
    // (it points at bytes that are no identity): a host that agreed on 1.0
    // never reads it, nor the 1.2 descriptor of the properties.
    assert_eq!(m.identity(), None);
    assert_eq!(m.properties().descriptor, memplug_host::Descriptor::default());
    works_and_unloads(p);
}

#[test]
fn unknown_capability_bits_and_device_kinds_are_kept_conservative() {
    let p = load("BAD_UNKNOWN_CAPS");
    let m = &p.mechanisms()[0];
    assert_eq!(m.capabilities().unknown_bits(), 1 << 31);
    assert!(
        unsafe { m.ungoverned() }.virtual_backing().is_none()
            && unsafe { m.ungoverned() }.shared_mapping().is_none()
            && m.sync().is_none()
    );
    let p = load("BAD_UNKNOWN_DEVICE_KIND");
    assert_eq!(p.mechanisms()[0].device().to_string(), "unknown(99):0");
}

#[test]
fn an_unknown_status_is_mapped_to_internal_and_kept() {
    let p = load("BAD_UNKNOWN_STATUS");
    let e = unsafe { p.mechanisms()[0].ungoverned() }.allocator().allocate(64, 16).unwrap_err();
    assert_eq!((e.status, e.raw), (Status::Internal, 777));
    assert!(e.message.contains("777"), "{e}");
    assert_eq!(p.mechanisms()[0].live(ObjectKind::Allocation), 0);
}

#[test]
fn a_plugin_that_never_lets_go_is_never_unloaded() {
    let p = load("BAD_LIVE_FOREVER");
    let refused = p.unload().unwrap_err();
    assert_eq!(refused.report.plugin_reported, 3);
    mentions(&refused, &["reports 3 live object"]);
}

#[test]
fn a_plugin_reporting_zero_while_holding_objects_is_kept_by_the_hosts_counts() {
    let p = load("BAD_LIVE_ZERO");
    let m = p.mechanisms()[0].clone();
    let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
    assert_eq!(p.plugin_live_objects(), 0, "the fixture lies");
    drop(m);
    let refused = p.unload().unwrap_err();
    mentions(&refused, &["1 allocations of mechanism 'bad-plugin'"]);
    let p = refused.plugin;
    unsafe { p.mechanisms()[0].ungoverned() }.allocator().deallocate(a).unwrap();
    p.unload().unwrap();
}

// ---------------------------------------------------------------------------
// Messages: bounded, read exactly, sanitised
// ---------------------------------------------------------------------------

#[test]
fn a_message_without_terminator_is_read_exactly_and_sanitised() {
    // The message ends where readable memory ends: reading one byte more
    // than `len` would crash this test.
    let p = load("BAD_MESSAGE_UNTERMINATED");
    let e = unsafe { p.mechanisms()[0].ungoverned() }.allocator().allocate(0, 16).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.starts_with("bad_plugin: "), "{:?}", e.message);
    // 0xff is not UTF-8 and ESC is a control character: both replaced.
    assert!(e.message.ends_with("\u{fffd}\u{fffd}"), "{:?}", e.message);
    assert!(!e.message.contains('\u{1b}'));
}

#[test]
fn an_overlong_message_is_cut_to_the_maximum() {
    let p = load("BAD_MESSAGE_OVERLONG");
    let e = unsafe { p.mechanisms()[0].ungoverned() }.allocator().allocate(0, 16).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert_eq!(e.message.len(), MEMPLUG_MESSAGE_MAX as usize);
    assert!(e.message.starts_with("bad_plugin: "), "{:?}", &e.message[..40]);
}

#[test]
fn a_sink_written_twice_keeps_the_last_message() {
    let p = load("BAD_SINK_TWICE");
    let e = unsafe { p.mechanisms()[0].ungoverned() }.allocator().allocate(0, 16).unwrap_err();
    assert!(!e.message.contains("superseded"), "{:?}", e.message);
    assert!(e.message.contains("zero size"), "{:?}", e.message);
    works_and_unloads(p);
}

#[test]
fn a_message_from_another_thread_joined_before_return_is_kept() {
    let p = load("BAD_SINK_OTHER_THREAD");
    let e = unsafe { p.mechanisms()[0].ungoverned() }.allocator().allocate(0, 16).unwrap_err();
    assert!(e.message.contains("zero size"), "{:?}", e.message);
}

#[test]
fn a_slot_that_reenters_the_plugins_entry_does_not_disturb_the_host() {
    let p = load("BAD_REENTRANT_ENTRY");
    let m = p.mechanisms()[0].clone();
    let blocks: Vec<_> =
        (0..8).map(|_| unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap()).collect();
    for b in blocks {
        unsafe { m.ungoverned() }.allocator().deallocate(b).unwrap();
    }
    drop(m);
    p.unload().unwrap();
}

// ---------------------------------------------------------------------------
// Blocks a plugin claims to have made
// ---------------------------------------------------------------------------

#[test]
fn a_null_block_on_success_is_refused_and_not_counted() {
    let p = load("BAD_NULL_BLOCK");
    let m = &p.mechanisms()[0];
    let e = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap_err();
    assert_eq!(e.status, Status::Internal);
    mentions(&e, &["reported success but returned addr 0x0"]);
    assert_eq!(m.live(ObjectKind::Allocation), 0);
}

#[test]
fn a_misaligned_block_is_refused_never_freed_and_keeps_the_plugin_loaded() {
    let p = load("BAD_MISALIGNED_BLOCK");
    let m = p.mechanisms()[0].clone();
    let e = unsafe { m.ungoverned() }.allocator().allocate(64, 64).unwrap_err();
    assert_eq!(e.status, Status::Internal);
    mentions(&e, &["aligned to 64"]);
    assert_eq!(m.live(ObjectKind::Allocation), 0);
    // The plugin still holds the block the host would not trust.
    assert_eq!(p.plugin_live_objects(), 1);
    // Alignments the plugin gets right still work.
    let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    drop(m);
    let refused = p.unload().unwrap_err();
    mentions(&refused, &["reports 1 live object"]);
}

#[test]
fn output_written_by_a_failed_call_is_ignored() {
    let p = load("BAD_WRITES_OUT_ON_FAILURE");
    let m = p.mechanisms()[0].clone();
    for (size, align) in [(0, 16), (64, 3), (64, 1 << 20)] {
        let e = unsafe { m.ungoverned() }.allocator().allocate(size, align).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        assert_eq!(m.live(ObjectKind::Allocation), 0);
    }
    drop(m);
    works_and_unloads(p);
}

// ---------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------

#[test]
fn a_foreign_object_is_refused_by_the_host_before_a_careless_plugin_sees_it() {
    let careless = load("BAD_DEALLOC_ANY");
    let other = Plugin::load(bad_plugin(None)).unwrap();
    let a = unsafe { other.mechanisms()[0].ungoverned() }.allocator().allocate(64, 16).unwrap();
    let e = unsafe { careless.mechanisms()[0].ungoverned() }.allocator().deallocate(a).unwrap_err();
    assert_eq!(e.error.status, Status::WrongMechanism, "{}", e.error);
    // Still live where it was made, and freed there.
    assert_eq!(other.plugin_live_objects(), 1);
    unsafe { other.mechanisms()[0].ungoverned() }.allocator().deallocate(e.object).unwrap();
    assert_eq!(other.plugin_live_objects(), 0);
}

#[test]
fn the_host_never_sends_a_second_free() {
    // The plugin says OK to a second free (or to a free of a handle whose
    // slot was reused since) and remembers it: its live count keeps a ghost
    // for each, and every later allocate fails naming the handle. So a host
    // that sent one, on any of its free paths, fails here. (From safe code
    // it cannot: deallocate consumes the Allocation.)
    let p = load_contained("BAD_DOUBLE_FREE_WITNESS");
    let m = p.mechanisms()[0].clone();
    let raw = unsafe { m.ungoverned() }.allocator();
    // Direct frees, with slots reused between them.
    for _ in 0..4 {
        let a = raw.allocate(64, 16).unwrap();
        let b = raw.allocate(128, 16).unwrap();
        raw.deallocate(a).unwrap();
        raw.deallocate(b).unwrap();
    }
    // A free the host refuses (a foreign object) is not sent; the object
    // comes back and is freed once, where it was made.
    let other = Plugin::load(contained_plugin_copy("BAD_DOUBLE_FREE_WITNESS", "foreign")).unwrap();
    let foreign = unsafe { other.mechanisms()[0].ungoverned() }.allocator().allocate(64, 16).unwrap();
    let back = raw.deallocate(foreign).unwrap_err();
    assert_eq!(back.error.status, Status::WrongMechanism);
    unsafe { other.mechanisms()[0].ungoverned() }.allocator().deallocate(back.object).unwrap();
    assert_eq!((m.live(ObjectKind::Allocation), p.plugin_live_objects()), (0, 0));
    // Owned allocations of a binding: dropped, and released after a fence
    // through the deferred-free queue.
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(p).unwrap();
    let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let context = manager.select(cpu0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = manager.create_pool("second-free", 1 << 20).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let done = FnFence::new("done", || true, |_| true);
    for i in 0..8 {
        let a = binding.allocate(256, 16).unwrap();
        if i % 2 == 0 {
            drop(a);
        } else {
            a.release_after([done.clone()]);
        }
    }
    let report = manager.drain(Duration::from_secs(5));
    assert!(report.left.is_empty(), "{report:?}");
    assert_eq!(pool.used(), 0);
    let reported: Vec<u64> =
        manager.registry().live_reports().iter().map(|(_, r)| r.plugin_reported).collect();
    assert_eq!(reported, [0], "the plugin counts a ghost for each second free it received");
    let a = raw.allocate(64, 16).unwrap_or_else(|e| panic!("{e}"));
    raw.deallocate(a).unwrap();
}

// ---------------------------------------------------------------------------
// Negotiation
// ---------------------------------------------------------------------------

#[test]
fn a_lax_entry_is_held_to_the_ranges_by_the_host() {
    let p = load("BAD_NEGOTIATE_LAX");
    assert_eq!(p.abi_version(), (1, 0));
    drop(p);
    // The entry says OK to a host speaking only 1.1; the host checks the
    // ranges itself and refuses.
    let opts = LoadOptions { min_minor: 1, max_minor: 1, ..LoadOptions::default() };
    let e = Plugin::load_with(bad_plugin(Some("BAD_NEGOTIATE_LAX")), &opts).unwrap_err();
    assert!(matches!(e, LoadError::VersionMismatch { .. }), "{e}");
}

// ---------------------------------------------------------------------------
// Optional capabilities ([full] variants)
// ---------------------------------------------------------------------------

#[test]
fn the_host_sends_only_the_access_values_abi_1_0_defines() {
    // The plugin would accept any access bits; the host's Access is closed.
    for bits in [0, 2, 0x81, 0x103] {
        assert!(Access::from_bits(bits).is_none(), "{bits:#x}");
    }
    assert_eq!(Access::ReadOnly.bits(), 1);
    assert_eq!(Access::ReadWrite.bits(), 3);
    let p = load("BAD_UNKNOWN_ACCESS");
    let m = &p.mechanisms()[0];
    let (vb, sm) = (
        unsafe { m.ungoverned() }.virtual_backing().unwrap(),
        unsafe { m.ungoverned() }.shared_mapping().unwrap(),
    );
    let g = m.properties().granularity;
    let o = sm.create(g).unwrap();
    let r = vb.reserve(g).unwrap();
    sm.map(&o, 0, &r, 0, g, Access::ReadOnly).unwrap();
    sm.unmap(&r, 0, g).unwrap();
    sm.release(o).unwrap();
    vb.release(r).unwrap();
    assert_eq!(p.plugin_live_objects(), 0);
}

#[test]
fn ranges_outside_the_reservation_are_refused_by_the_host() {
    let p = load("BAD_RANGE_UNCHECKED");
    let m = &p.mechanisms()[0];
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let g = m.properties().granularity;
    let r = vb.reserve(4 * g).unwrap();
    let size = r.size();
    for (offset, len) in [(size, g), (size - g, 2 * g), (u64::MAX - g + 1, 2 * g)] {
        let e = vb.commit(&r, offset, len).unwrap_err();
        assert_eq!(e.status, Status::OutOfRange, "commit +{offset:#x} {len:#x}: {e}");
        let e = vb.decommit(&r, offset, len).unwrap_err();
        assert_eq!(e.status, Status::OutOfRange, "decommit +{offset:#x} {len:#x}: {e}");
    }
    // The plugin never saw them: it would have counted them.
    assert_eq!(vb.committed_bytes(&r).unwrap(), 0);
    vb.release(r).unwrap();
}

#[test]
fn charges_follow_the_bytes_the_host_committed_not_the_plugins_count() {
    let p = load("BAD_COMMITTED_LIES");
    let g = p.mechanisms()[0].properties().granularity;
    {
        let m = &p.mechanisms()[0];
        let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
        let r = vb.reserve(4 * g).unwrap();
        vb.commit(&r, 0, 2 * g).unwrap();
        // The raw count is the plugin's, passed on as it is.
        assert_eq!(vb.committed_bytes(&r).unwrap(), 3 * g);
        vb.release(r).unwrap();
    }
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(p).unwrap();
    let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let req = Requirements { virtual_backing: true, ..Requirements::ALLOCATOR_ONLY };
    let context = manager.select(cpu0, req).unwrap();
    let pool = manager.create_pool("lies", 1 << 30).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let mut region = binding.reserve_virtual(16 * g).unwrap();
    region.grow_to(4 * g, |_| Ok::<(), ()>(())).unwrap();
    assert_eq!(region.committed(), 4 * g);
    assert_eq!(pool.used(), 4 * g, "the charge is what the host committed");
}

/// A job that records whether it ran.
struct Flag(Arc<AtomicBool>);

impl Retire for Flag {
    fn retire(self: Box<Self>) -> RetireOutcome {
        self.0.store(true, Ordering::SeqCst);
        RetireOutcome::Freed { bytes: 0 }
    }
    fn describe(&self) -> String {
        "test job".into()
    }
}

#[test]
fn a_fence_that_never_completes_times_out_and_is_reported_by_drain() {
    let p = load("BAD_FENCE_NEVER");
    let m = p.mechanisms()[0].clone();
    let sync = m.sync().unwrap();
    let stream = sync.stream_create().unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    sync.enqueue(&stream, move || r.store(true, Ordering::SeqCst)).unwrap();
    let fence = PluginFence::record(&m, &stream).unwrap();
    assert!(!fence.wait(Duration::from_millis(20)).unwrap(), "the wait must time out");
    let queue = DeferredFreeQueue::new();
    let freed = Arc::new(AtomicBool::new(false));
    queue.release(vec![fence.clone()], Box::new(Flag(freed.clone())));
    let report = queue.drain(Duration::from_millis(50));
    assert_eq!(report.left.len(), 1, "{report:?}");
    assert!(
        report.left[0].contains("test job") && report.left[0].contains("memplug-bad-plugin/bad-plugin"),
        "{:?}",
        report.left
    );
    assert!(!freed.load(Ordering::SeqCst), "nothing is freed on a guess");
    drop(fence);
    sync.stream_destroy(stream).unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

#[test]
fn a_forged_completion_is_believed_the_plugin_is_the_only_witness() {
    // What the host sees: the fence says complete while the work before it
    // is still blocked. The host cannot tell; `memplug conformance` can
    // (sync.fence_orders, sync.unknown_fence).
    let p = load("BAD_FORGED_FENCE");
    let m = p.mechanisms()[0].clone();
    let sync = m.sync().unwrap();
    let stream = sync.stream_create().unwrap();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    sync.enqueue(&stream, move || {
        let (open, cv) = &*g;
        let mut o = open.lock().unwrap();
        while !*o {
            o = cv.wait(o).unwrap();
        }
    })
    .unwrap();
    let fence = sync.fence_record(&stream).unwrap();
    assert!(sync.fence_query(&fence).unwrap(), "the forged completion reaches the host");
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    sync.fence_destroy(fence).unwrap();
    sync.stream_destroy(stream).unwrap();
}

#[test]
fn a_read_only_view_made_writable_is_not_visible_to_the_host() {
    // The host maps read-only and never writes through it; only
    // `memplug conformance` (shared_mapping.read_only) sees the lie.
    let p = load("BAD_READ_ONLY_WRITABLE");
    let m = &p.mechanisms()[0];
    let (vb, sm) = (
        unsafe { m.ungoverned() }.virtual_backing().unwrap(),
        unsafe { m.ungoverned() }.shared_mapping().unwrap(),
    );
    let g = m.properties().granularity;
    let o = sm.create(g).unwrap();
    let r = vb.reserve(g).unwrap();
    sm.map(&o, 0, &r, 0, g, Access::ReadOnly).unwrap();
    sm.unmap(&r, 0, g).unwrap();
    sm.release(o).unwrap();
    vb.release(r).unwrap();
    assert_eq!(p.plugin_live_objects(), 0);
}

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

#[test]
fn misbehaviours_md_has_a_row_for_every_variant() {
    let table = std::fs::read_to_string(repo_root().join("abi-tests/MISBEHAVIOURS.md")).unwrap();
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| `")).collect();
    for v in BAD_PLUGIN_VARIANTS {
        let n = rows.iter().filter(|r| r.starts_with(&format!("| `{v}`"))).count();
        assert_eq!(n, 1, "MISBEHAVIOURS.md must have exactly one row for {v}");
    }
    assert!(
        rows.iter().any(|r| r.contains("in_process_plugins.rs")),
        "the Rust panicking plugin must have its row"
    );
    assert!(rows.len() >= 25, "at least 25 distinct misbehaviours");
}

// ---------------------------------------------------------------------------
// Containment: host functions a plugin runs twice, or after refusing them
// ---------------------------------------------------------------------------

/// Serialises the tests that read the process-wide stray count, so each
/// sees only its own plugin's stray runs (no other test here makes any).
static STRAY_COUNT: Mutex<()> = Mutex::new(());

/// What a host function's closure reports: how often it ran, whether its
/// captured state was alive then, how often that state was dropped.
#[derive(Clone, Default)]
struct Witness {
    runs: Arc<AtomicUsize>,
    drops: Arc<AtomicUsize>,
    ran_after_drop: Arc<AtomicBool>,
    ran_inside_plugin_call: Arc<AtomicBool>,
}

/// Captured by the closure: counts its own drop.
struct Captured(Witness);

impl Drop for Captured {
    fn drop(&mut self) {
        self.0.drops.fetch_add(1, Ordering::SeqCst);
    }
}

impl Witness {
    fn closure(&self) -> impl FnOnce() + Send + 'static {
        let captured = Captured(self.clone());
        move || {
            let w = &captured.0;
            if w.drops.load(Ordering::SeqCst) != 0 {
                w.ran_after_drop.store(true, Ordering::SeqCst);
            }
            w.ran_inside_plugin_call.store(inside_plugin_call(), Ordering::SeqCst);
            w.runs.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn counts(&self) -> (usize, usize) {
        (self.runs.load(Ordering::SeqCst), self.drops.load(Ordering::SeqCst))
    }
}

#[test]
fn a_host_function_run_twice_runs_once_and_the_second_run_is_stray() {
    let _one = STRAY_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let p = load_contained("BAD_HOST_FN_TWICE");
    let m = p.mechanisms()[0].clone();
    let sync = m.sync().unwrap();
    let stream = sync.stream_create().unwrap();
    let before = stray_host_fn_calls();
    let witnesses: Vec<Witness> = (0..5).map(|_| Witness::default()).collect();
    for w in &witnesses {
        sync.enqueue(&stream, w.closure()).unwrap();
    }
    // The worker runs what was submitted before it leaves.
    sync.stream_destroy(stream).unwrap();
    for w in &witnesses {
        assert_eq!(w.counts(), (1, 1), "ran once, freed once");
        assert!(!w.ran_after_drop.load(Ordering::SeqCst));
        assert!(!w.ran_inside_plugin_call.load(Ordering::SeqCst), "a worker thread is not inside a call");
    }
    assert_eq!(stray_host_fn_calls() - before, 5, "every second run is counted and ignored");
}

#[test]
fn a_host_function_run_inside_a_refused_enqueue_runs_once_and_never_again() {
    let _one = STRAY_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let p = load_contained("BAD_HOST_FN_REFUSED_RUNS");
    let m = p.mechanisms()[0].clone();
    let sync = m.sync().unwrap();
    let stream = sync.stream_create().unwrap();
    let before = stray_host_fn_calls();
    let w = Witness::default();
    let e = sync.enqueue(&stream, w.closure()).unwrap_err();
    assert_eq!(e.status, Status::Internal);
    mentions(&e, &["refused (after running the function)"]);
    // It ran inside the failing call (one safe reading of a refusal), and
    // the host dropped it as the call returned.
    assert_eq!(w.counts(), (1, 1));
    assert!(w.ran_inside_plugin_call.load(Ordering::SeqCst), "it ran inside enqueue_host_fn");
    sync.stream_destroy(stream).unwrap();
    assert_eq!(w.counts(), (1, 1));
    assert_eq!(stray_host_fn_calls(), before, "its one run found its entry");
    assert!(!inside_plugin_call());
}

#[test]
fn a_host_function_run_late_after_a_refused_enqueue_is_ignored() {
    let _one = STRAY_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let p = load_contained("BAD_HOST_FN_LATE");
    let m = p.mechanisms()[0].clone();
    let sync = m.sync().unwrap();
    let stream = sync.stream_create().unwrap();
    let before = stray_host_fn_calls();
    let w = Witness::default();
    let e = sync.enqueue(&stream, w.closure()).unwrap_err();
    assert_eq!(e.status, Status::Internal);
    mentions(&e, &["kept for later"]);
    assert_eq!(w.counts(), (0, 1), "a refused enqueue drops the function, unrun");
    // Destroying the stream makes the worker run the kept function, from
    // its own thread, long after the refusal.
    sync.stream_destroy(stream).unwrap();
    assert_eq!(w.counts(), (0, 1), "the late run finds nothing");
    assert!(!w.ran_after_drop.load(Ordering::SeqCst));
    assert_eq!(stray_host_fn_calls() - before, 1, "the late run is counted and ignored");
}

#[test]
fn host_function_misuse_is_clean_under_valgrind() {
    // The same three tests under memcheck: a use-after-free of a closure
    // would be an invalid read there even where the counters look right.
    const CHILD: &str = "MEMPLUG_MISBEHAVIOURS_UNDER_VALGRIND";
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Ok(v) = std::process::Command::new("valgrind").arg("--version").output() else {
        eprintln!("valgrind is not installed; skipped (scripts/setup.sh installs it)");
        return;
    };
    assert!(v.status.success());
    // The variants are compiled here, outside valgrind.
    for variant in ["BAD_HOST_FN_TWICE", "BAD_HOST_FN_REFUSED_RUNS", "BAD_HOST_FN_LATE"] {
        contained_plugin(variant);
    }
    let _one = STRAY_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::process::Command::new("valgrind")
        .args(["--tool=memcheck", "--error-exitcode=97", "--leak-check=no", "-q"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "--test-threads=1",
            "a_host_function_run_twice_runs_once_and_the_second_run_is_stray",
            "a_host_function_run_inside_a_refused_enqueue_runs_once_and_never_again",
            "a_host_function_run_late_after_a_refused_enqueue_is_ignored",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "under valgrind ({}):\n{text}", out.status);
    assert!(text.contains("3 passed"), "{text}");
}

// ---------------------------------------------------------------------------
// Containment: blocks overlapping live ones
// ---------------------------------------------------------------------------

#[test]
fn a_block_overlapping_a_live_one_is_refused_naming_both_never_used_or_freed() {
    let p = load_contained("BAD_OVERLAPPING_BLOCKS");
    let m = p.mechanisms()[0].clone();
    assert!(m.checks_overlaps(ObjectKind::Allocation) && m.checks_overlaps(ObjectKind::Reservation));
    let raw = unsafe { m.ungoverned() }.allocator();
    let first = raw.allocate(64, 16).unwrap();
    // The plugin reports the second allocation at the first one's address.
    let e = raw.allocate(64, 16).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    mentions(
        &e,
        &[
            "allocation object ",
            &format!(
                "overlaps live allocation object {} at {:#x} (64 bytes)",
                first.object_id(),
                first.addr()
            ),
            "not used, not charged and not freed",
        ],
    );
    assert_eq!(m.live(ObjectKind::Allocation), 1, "the refused block is not counted");
    assert_eq!(p.plugin_live_objects(), 2, "nor freed: the plugin still holds it");
    raw.deallocate(first).unwrap();
    assert_eq!(p.plugin_live_objects(), 1);

    // Reservations are checked the same way.
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let g = m.properties().granularity;
    let r = vb.reserve(2 * g).unwrap();
    let e = vb.reserve(g).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    mentions(
        &e,
        &[
            "reservation object ",
            &format!("overlaps live reservation object {} at {:#x}", r.object_id(), r.addr()),
        ],
    );
    assert_eq!(m.live(ObjectKind::Reservation), 1);
    vb.release(r).unwrap();
    assert_eq!(p.plugin_live_objects(), 2, "the two refused blocks");
    drop(m);
    mentions(&p.unload().unwrap_err(), &["reports 2 live object"]);
}

#[test]
fn a_correct_plugin_reusing_a_freed_address_at_once_is_not_refused() {
    // The CPU plugin's slab hands a freed block's address out again on the
    // next allocation: the block left the index before the free was sent.
    let p = Plugin::load_with(
        memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN"),
        &checked(),
    )
    .unwrap();
    let m = p.mechanism("cpu").unwrap().clone();
    assert!(m.checks_overlaps(ObjectKind::Allocation));
    let raw = unsafe { m.ungoverned() }.allocator();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        let a = raw.allocate(64, 16).unwrap();
        seen.insert(a.addr());
        raw.deallocate(a).unwrap();
    }
    assert!(seen.len() < 64, "the address was reused, and accepted");
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    for _ in 0..8 {
        let r = vb.reserve(1 << 20).unwrap();
        vb.release(r).unwrap();
    }
}

#[test]
fn an_overlapping_block_is_not_charged_to_the_pool() {
    let p =
        Plugin::load_with(contained_plugin_copy("BAD_OVERLAPPING_BLOCKS", "binding"), &checked()).unwrap();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(p).unwrap();
    let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let context = manager.select(cpu0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = manager.create_pool("overlaps", 1 << 20).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    let live = binding.allocate(4096, 16).unwrap();
    let used = pool.used();
    match binding.allocate(4096, 16) {
        Err(BindingError::Plugin(e)) => {
            assert_eq!(e.status, Status::Internal);
            mentions(&e, &[&format!("at {:#x}", live.addr()), "overlaps live allocation object"]);
        }
        other => panic!("the alias was accepted: {other:?}"),
    }
    assert_eq!(pool.used(), used, "nothing charged for the refused block");
    drop(live);
    assert_eq!(pool.used(), 0);
}

#[test]
fn without_the_check_an_overlapping_block_is_not_caught() {
    // What `OverlapCheck::Off` gives up: the alias is taken. Shows the
    // refusals above come from the check.
    let opts = LoadOptions { check_overlaps: OverlapCheck::Off, ..LoadOptions::default() };
    let p = Plugin::load_with(contained_plugin_copy("BAD_OVERLAPPING_BLOCKS", "unchecked"), &opts).unwrap();
    let m = p.mechanisms()[0].clone();
    assert!(!m.checks_overlaps(ObjectKind::Allocation) && !m.checks_overlaps(ObjectKind::Reservation));
    let raw = unsafe { m.ungoverned() }.allocator();
    let first = raw.allocate(64, 16).unwrap();
    let alias = raw.allocate(64, 16).unwrap();
    assert_eq!(alias.addr(), first.addr());
    // Not freed: the plugin's own records name another address, so the
    // alias's free would be refused; the tokens are leaked with the plugin.
    let _ = (first.into_raw(), alias.into_raw());
}

#[test]
fn the_release_default_checks_reservations_and_device_allocations() {
    // `Auto` (the release builds' default): a reservation overlapping a
    // live one is refused; an allocation of a CPU mechanism is not checked
    // (the check would cost more than half of its pair).
    let opts = LoadOptions { check_overlaps: OverlapCheck::Auto, ..LoadOptions::default() };
    let p = Plugin::load_with(contained_plugin_copy("BAD_OVERLAPPING_BLOCKS", "auto"), &opts).unwrap();
    let m = p.mechanisms()[0].clone();
    assert_eq!(m.device().0.kind, MEMPLUG_DEVICE_CPU);
    assert!(m.checks_overlaps(ObjectKind::Reservation) && !m.checks_overlaps(ObjectKind::Allocation));
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let r = vb.reserve(2 * m.properties().granularity).unwrap();
    let e = vb.reserve(m.properties().granularity).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    mentions(&e, &[&format!("overlaps live reservation object {} at {:#x}", r.object_id(), r.addr())]);
    vb.release(r).unwrap();
    // Allocations of any other device kind are checked under `Auto`.
    for kind in [MEMPLUG_DEVICE_CUDA, MEMPLUG_DEVICE_CUDA_HOST, MEMPLUG_DEVICE_ROCM] {
        assert!(OverlapCheck::Auto.allocations(kind), "{kind}");
    }
    assert!(!OverlapCheck::Auto.allocations(MEMPLUG_DEVICE_CPU));
}

#[test]
fn the_overlap_check_defaults_to_all_in_debug_builds_and_auto_in_release() {
    let expected = if cfg!(debug_assertions) { OverlapCheck::All } else { OverlapCheck::Auto };
    assert_eq!(LoadOptions::default().check_overlaps, expected);
    assert_eq!(OverlapCheck::build_default(), expected);
}

// ---------------------------------------------------------------------------
// Containment: control characters in names
// ---------------------------------------------------------------------------

#[test]
fn control_characters_in_names_and_versions_are_escaped_at_the_loader() {
    let p = load_contained("BAD_ESCAPES_IN_NAMES");
    assert_eq!(p.name(), "memplug-bad-\\x1b[2J\\x1b]0;owned\\x07plugin\\r");
    assert_eq!(p.version(), "0.0.0\\x1b[31m\\u{9b}\\u{202e}");
    let m = p.mechanisms()[0].clone();
    assert_eq!(m.name(), "bad-\\x1b[1mplugin\\n\\x7f");
    assert!(p.mechanism("bad-\\x1b[1mplugin\\n\\x7f").is_some());
    // Errors name the mechanism by its label: escaped there too.
    let e = unsafe { m.ungoverned() }.allocator().allocate(0, 16).unwrap_err();
    let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
    drop(m);
    let refused = p.unload().unwrap_err();
    for text in [e.to_string(), format!("{e:?}"), refused.to_string(), format!("{:?}", refused.plugin)] {
        assert!(!text.chars().any(|c| c.is_control()), "a control character reached {text:?}");
        assert!(text.contains("\\x1b"), "{text:?}");
    }
    let p = refused.plugin;
    unsafe { p.mechanisms()[0].ungoverned() }.allocator().deallocate(a).unwrap();
    p.unload().unwrap();
}

// ---------------------------------------------------------------------------
// Containment: the table
// ---------------------------------------------------------------------------

#[test]
fn misbehaviours_md_has_a_row_for_every_containment_variant() {
    let table = std::fs::read_to_string(repo_root().join("abi-tests/MISBEHAVIOURS.md")).unwrap();
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| `")).collect();
    for v in CONTAINMENT_VARIANTS {
        let n = rows.iter().filter(|r| r.starts_with(&format!("| `{v}`"))).count();
        assert_eq!(n, 1, "MISBEHAVIOURS.md must have exactly one row for {v}");
        assert!(!BAD_PLUGIN_VARIANTS.contains(v), "{v} is listed twice");
    }
}

// ---------------------------------------------------------------------------
// Containment: the message sink used past its call, lying message lengths
// ---------------------------------------------------------------------------

#[test]
fn a_sink_kept_and_written_after_its_call_is_dropped_and_counted() {
    // Each refusal first writes into the previous call's sink (a copy of
    // it and the pointer), then its own message, then leaves a detached
    // thread writing into it after the slot returned. Before the sink was
    // bound to its call, the first write went to a dead stack frame.
    let p = load_contained("BAD_SINK_LATE");
    let m = p.mechanisms()[0].clone();
    let before = memplug_host::late_sink_writes();
    for _ in 0..200 {
        let e = unsafe { m.ungoverned() }.allocator().allocate(0, 16).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        assert!(e.message.contains("zero size"), "the call's own message: {:?}", e.message);
        let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
        unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    }
    // The detached writers (20 writes, 0.2 ms apart, each) end well within
    // this; the library must not be unloaded under them.
    std::thread::sleep(Duration::from_millis(500));
    let late = memplug_host::late_sink_writes() - before;
    assert!(late >= 199, "every write through a copy of an earlier call's sink is dropped: {late}");
    // In every manager's statistics too.
    let faults = ProcessMemoryManager::new().stats().plugin_faults.expect("a manager's report has them");
    assert!(faults.late_sink_writes >= before + late, "{faults:?}");
    drop(m);
    works_and_unloads(p);
}

#[test]
fn a_message_whose_length_runs_past_readable_memory_is_cut_and_counted() {
    let p = load_contained("BAD_MESSAGE_LEN_LIES");
    let before = memplug_host::unreadable_plugin_messages();
    let e = unsafe { p.mechanisms()[0].ungoverned() }.allocator().allocate(0, 16).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.starts_with("bad_plugin: unknown flags or zero size ["), "{:?}", e.message);
    assert!(e.message.contains("message cut by the host"), "{:?}", e.message);
    assert_eq!(memplug_host::unreadable_plugin_messages(), before + 1);
    assert_eq!(memplug_host::plugin_faults().unreadable_messages, before + 1);
    works_and_unloads(p);
}

// ---------------------------------------------------------------------------
// Containment: blocks larger than asked
// ---------------------------------------------------------------------------

#[test]
fn a_block_far_larger_than_asked_is_refused_with_both_sizes_never_charged() {
    const CLAIM: &str = "4611686018427387904"; // 2^62
    let p = load_contained("BAD_OVERSIZED_BLOCK");
    let m = p.mechanisms()[0].clone();
    let e = unsafe { m.ungoverned() }.allocator().allocate(4096, 16).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    mentions(&e, &["allocator.allocate", CLAIM, "request of 4096 bytes", "rounding"]);
    assert_eq!(m.live(ObjectKind::Allocation), 0);
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let e = vb.reserve(4 * g).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    mentions(&e, &["virtual_backing.reserve", CLAIM, &format!("request of {} bytes", 4 * g)]);
    assert_eq!(m.live(ObjectKind::Reservation), 0);
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let e = sm.create(g).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    mentions(&e, &["shared_mapping.create", CLAIM]);
    assert_eq!(m.live(ObjectKind::PhysicalObject), 0);
    assert!(memplug_host::plugin_faults().refused_block_sizes >= 3);
    // Not freed on a guess: the plugin still holds all three.
    assert_eq!(p.plugin_live_objects(), 3);
    drop(m);
    mentions(&p.unload().unwrap_err(), &["reports 3 live object"]);
}

#[test]
fn a_block_far_larger_than_asked_is_a_misbehaviour_not_out_of_budget() {
    let p = Plugin::load_with(contained_plugin_copy("BAD_OVERSIZED_BLOCK", "binding"), &checked()).unwrap();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(p).unwrap();
    let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let context = manager.select(cpu0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = manager.create_pool("small", 1 << 20).unwrap();
    let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
    match binding.allocate(4096, 16) {
        Err(BindingError::Plugin(e)) => {
            assert_eq!(e.status, Status::Internal);
            mentions(&e, &["4611686018427387904", "request of 4096 bytes"]);
        }
        other => panic!("the oversized block was not refused as the plugin's: {other:?}"),
    }
    assert_eq!(pool.used(), 0, "nothing charged for the refused block");
}

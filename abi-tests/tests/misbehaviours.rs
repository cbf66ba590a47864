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

use memplug_host::governor::AllocationClass;
use memplug_host::{
    Access, BindingSpec, DeferredFreeQueue, LoadError, LoadOptions, ObjectKind, Plugin, PluginFence,
    ProcessMemoryManager, Requirements, Retire, RetireOutcome, Status,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU, MEMPLUG_MESSAGE_MAX};
use memplug_test_support::{bad_plugin, repo_root, BAD_PLUGIN_VARIANTS};
use std::sync::atomic::{AtomicBool, Ordering};
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
    let m = &p.mechanisms()[0];
    assert_eq!(m.name(), "bad-plugin");
    assert_eq!(m.capabilities().unknown_bits(), 0);
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
    // The plugin would say OK to a double free; the host cannot send one:
    // deallocate consumes the Allocation.
    let p = load("BAD_DOUBLE_FREE_OK");
    let m = &p.mechanisms()[0];
    let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    assert_eq!((m.live(ObjectKind::Allocation), p.plugin_live_objects()), (0, 0));
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

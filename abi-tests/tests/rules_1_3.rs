//! The load-time rules of ABI 1.3's stream-ordered copy, broken one at a
//! time: the copy spaces (`MemplugProperties::copy_kinds`) and the sync
//! table's `copy` slot agree (spaces without a slot, a slot without
//! spaces, and a table too short to hold the slot are refused), and below
//! 1.3 neither is read (a plugin that publishes both anyway is used as 1.2,
//! its slot never called).
//!
//! The plugin is a correct SDK plugin; a wrapping entry copies the
//! descriptor the SDK negotiated and changes one thing before the host
//! reads it. Unchanged, it loads at 1.3 with the copy and at 1.2 without.

use memplug_host::{CopyKinds, LoadOptions, Plugin, Status};
use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

const CPU3: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 3 };

/// Copies made (none is made: the stub only counts them); the tests that
/// count take turns.
static COPIES: AtomicU64 = AtomicU64::new(0);
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Stub;

impl Allocator for Stub {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }
    fn allocate(&self, _: &Request) -> PluginResult<Block> {
        Err(PluginError::out_of_memory("stub"))
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

impl StreamSync for Stub {
    fn stream_create(&self) -> PluginResult<u64> {
        Ok(1)
    }
    fn stream_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn enqueue_host_fn(&self, _: u64, f: HostFn) -> PluginResult<()> {
        f.call();
        Ok(())
    }
    fn fence_record(&self, _: u64) -> PluginResult<u64> {
        Ok(1)
    }
    fn fence_query(&self, _: u64) -> PluginResult<FenceState> {
        Ok(FenceState::Complete)
    }
    fn fence_wait(&self, _: u64, _: Duration) -> PluginResult<FenceState> {
        Ok(FenceState::Complete)
    }
    fn fence_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    const CAN_COPY: bool = true;
    fn copy_kinds(&self) -> u32 {
        MEMPLUG_COPY_DEVICE
    }
    fn copy(&self, _: u64, _: u64, _: u64, _: u64) -> PluginResult<()> {
        COPIES.fetch_add(1, SeqCst);
        Ok(())
    }
}

fn stub_plugin() -> ExportedPlugin {
    let b = MechanismBuilder::new("rules13", 6, CPU3, Stub).sync();
    PluginBuilder::new("rules13", "1").mechanism(b.build()).live_objects(|| 0).build()
}
memplug_sdk::declare_entry!(sdk_entry, stub_plugin);

/// What one load changes in the SDK's descriptor.
#[derive(Clone, Copy)]
enum Change {
    None,
    /// The copy slot set to NULL (the spaces still said).
    NoSlot,
    /// The sync table cut to its 1.2 size (the slot past it).
    ShortTable,
    /// The properties say no space (the slot still published).
    NoSpaces,
    /// The 1.3 table and spaces handed to a host that agreed on less.
    TablesOfTheNewerMinor,
}

thread_local! {
    static CHANGE: Cell<Change> = const { Cell::new(Change::None) };
}

/// The SDK's `properties` slot, kept by the wrapper that zeroes the spaces.
static INNER_PROPERTIES: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn no_spaces(
    ctx: *mut core::ffi::c_void,
    out: *mut MemplugProperties,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    type F = unsafe extern "C" fn(
        *mut core::ffi::c_void,
        *mut MemplugProperties,
        *const MemplugMessageSink,
    ) -> MemplugStatus;
    // SAFETY: the SDK's slot, stored below before the host can call this.
    let inner: F = unsafe { std::mem::transmute::<usize, F>(INNER_PROPERTIES.load(SeqCst) as usize) };
    let st = unsafe { inner(ctx, out, sink) };
    // SAFETY: the host's struct, `struct_size` first.
    if st == MEMPLUG_STATUS_OK && unsafe { (*out).struct_size } >= MEMPLUG_PROPERTIES_SIZE_1_3 {
        unsafe { (*out).copy_kinds = 0 };
    }
    st
}

unsafe extern "C" fn changed_entry(
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let change = CHANGE.with(|c| c.get());
    // The newer minor's tables for an older host: negotiate as 1.3, then
    // answer with the minor the host asked for.
    let asked = unsafe { (*host).max_minor };
    let mut h = unsafe { *host };
    if let Change::TablesOfTheNewerMinor = change {
        h.max_minor = 3;
    }
    // SAFETY: the host's arguments (or a copy of its host info), passed on.
    let st = unsafe { sdk_entry(&h, out, sink) };
    if st != MEMPLUG_STATUS_OK {
        return st;
    }
    // SAFETY: on success the SDK wrote a descriptor with one mechanism,
    // whose tables are full current structs, live until unload.
    unsafe {
        let mut plugin = *(*out).plugin;
        let mut m = **plugin.mechanisms;
        let mut sync = *m.sync;
        let mut alloc = *m.allocator;
        match change {
            Change::None => {}
            Change::NoSlot => sync.copy = None,
            Change::ShortTable => sync.struct_size = MEMPLUG_SYNC_SIZE_1_2,
            Change::NoSpaces => {
                INNER_PROPERTIES.store(alloc.properties.unwrap() as usize as u64, SeqCst);
                alloc.properties = Some(no_spaces);
            }
            Change::TablesOfTheNewerMinor => (*out).agreed_minor = asked,
        }
        m.sync = Box::leak(Box::new(sync));
        m.allocator = Box::leak(Box::new(alloc));
        let list: &'static [*const MemplugMechanism; 1] =
            Box::leak(Box::new([Box::leak(Box::new(m)) as *const _]));
        plugin.mechanisms = list.as_ptr();
        (*out).plugin = Box::leak(Box::new(plugin));
    }
    MEMPLUG_STATUS_OK
}

fn load(max_minor: u32, change: Change) -> Result<Plugin, String> {
    CHANGE.with(|c| c.set(change));
    let opts = LoadOptions { max_minor, ..LoadOptions::default() };
    // SAFETY: the SDK's plugin, its descriptor copied and changed.
    let r = unsafe { Plugin::from_entry(changed_entry, "rules13", &opts) };
    CHANGE.with(|c| c.set(Change::None));
    r.map_err(|e| e.to_string())
}

fn refused(change: Change, parts: &[&str]) {
    match load(3, change) {
        Ok(p) => panic!("loaded at 1.3 ({:?}); expected a refusal saying {parts:?}", p.abi_version()),
        Err(msg) => {
            for part in parts {
                assert!(msg.contains(part), "the refusal does not say {part:?}: {msg}");
            }
        }
    }
}

#[test]
fn unchanged_it_copies_at_1_3_and_not_at_1_2() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let p = load(3, Change::None).unwrap();
    let m = &p.mechanisms()[0];
    assert_eq!(m.properties().copy_kinds, CopyKinds(MEMPLUG_COPY_DEVICE));
    let sync = m.sync().unwrap();
    let s = sync.stream_create().unwrap();
    let before = COPIES.load(SeqCst);
    // SAFETY: the stub touches no memory.
    unsafe { sync.copy(&s, 0x2000, 0x1000, 64) }.unwrap();
    assert_eq!(COPIES.load(SeqCst), before + 1);
    sync.stream_destroy(s).unwrap();
    let p = load(2, Change::None).unwrap();
    assert_eq!(p.abi_version(), (1, 2));
    assert_eq!(p.mechanisms()[0].properties().copy_kinds, CopyKinds::NONE);
    assert!(!p.mechanisms()[0].sync().unwrap().can_copy());
}

#[test]
fn the_host_refuses_copy_spaces_and_slot_that_disagree() {
    refused(Change::NoSlot, &["copy_kinds is 0x1", "publishes no copy slot"]);
    // The slot past a 1.2-sized table is not published: the same refusal.
    refused(Change::ShortTable, &["copy_kinds is 0x1", "at least 96 bytes"]);
    refused(Change::NoSpaces, &["publishes copy but copy_kinds names no MEMPLUG_COPY_* space"]);
}

#[test]
fn below_1_3_the_copy_slot_and_spaces_are_never_read() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let p = load(2, Change::TablesOfTheNewerMinor).unwrap();
    assert_eq!(p.abi_version(), (1, 2));
    let m = &p.mechanisms()[0];
    assert_eq!(m.properties().copy_kinds, CopyKinds::NONE, "the properties are asked at 72 bytes");
    let sync = m.sync().unwrap();
    assert!(!sync.can_copy());
    let s = sync.stream_create().unwrap();
    let before = COPIES.load(SeqCst);
    let e = unsafe { sync.copy(&s, 0x2000, 0x1000, 64) }.unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    assert_eq!(COPIES.load(SeqCst), before, "the 1.3 slot was called at 1.2");
    sync.stream_destroy(s).unwrap();
}

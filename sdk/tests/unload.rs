//! The built plugin's lifetime: the entry's cell builds it on the first
//! negotiation, every successful negotiation holds it, every `unload` gives
//! a hold back, the last one frees it (the vendor's implementation
//! included), and the next negotiation builds it again.

use memplug_sdk::abi::*;
use memplug_sdk::export::{negotiate, PluginCell};
use memplug_sdk::*;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// Counts its builds and drops; one counter pair per test (tests run in
/// parallel).
struct Counted(&'static Counters);

struct Counters {
    built: AtomicU64,
    dropped: AtomicU64,
}

impl Counters {
    const fn new() -> Self {
        Counters { built: AtomicU64::new(0), dropped: AtomicU64::new(0) }
    }
    fn get(&self) -> (u64, u64) {
        (self.built.load(SeqCst), self.dropped.load(SeqCst))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, SeqCst);
    }
}

impl Allocator for Counted {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 8, max_alignment: 8, granularity: 0 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        Ok(Block { addr: 0x1000, size: r.size, handle: 1 })
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

fn build(c: &'static Counters, leak: bool) -> ExportedPlugin {
    c.built.fetch_add(1, SeqCst);
    let m = MechanismBuilder::new("counted", 1, CPU0, Counted(c));
    let state = m.state();
    if leak {
        let _: &'static Counted = m.implementation();
    }
    PluginBuilder::new("counted", "1")
        .mechanism(m.build())
        // Holds a state, as a real plugin's counter does; it must not keep
        // the implementation alive past unload.
        .live_objects(move || {
            let _counts_from: &Counted = &state;
            0
        })
        .build()
}

fn host(min: u32, max: u32) -> MemplugHostInfo {
    MemplugHostInfo {
        struct_size: MEMPLUG_HOST_INFO_SIZE_1_0,
        abi_major: 1,
        min_minor: min,
        max_minor: max,
        host_name: std::ptr::null(),
        services: core::ptr::null(),
    }
}

/// Negotiates through `cell`; the descriptor on success.
fn load(
    cell: &'static PluginCell,
    init: fn() -> ExportedPlugin,
    h: MemplugHostInfo,
) -> Option<MemplugPlugin> {
    let mut out = MemplugNegotiation {
        struct_size: MEMPLUG_NEGOTIATION_SIZE_1_0,
        agreed_minor: 0,
        plugin: std::ptr::null(),
    };
    // SAFETY: valid pointers; `cell` is a static used with one init.
    let st = unsafe { negotiate(cell, init, &h, &mut out, std::ptr::null()) };
    // SAFETY: a successful negotiation hands out a live descriptor.
    (st == MEMPLUG_STATUS_OK).then(|| unsafe { *out.plugin })
}

fn unload(d: &MemplugPlugin) {
    let f = d.unload.expect("the SDK publishes unload");
    // SAFETY: the descriptor's own slot and context, called once per load.
    unsafe { f(d.ctx) }
}

#[test]
fn unload_frees_the_plugin_and_a_reload_builds_it_again() {
    static C: Counters = Counters::new();
    static CELL: PluginCell = PluginCell::new();
    fn init() -> ExportedPlugin {
        build(&C, false)
    }
    assert!(!CELL.is_built());
    let d = load(&CELL, init, host(0, 1)).unwrap();
    assert!(CELL.is_built());
    assert_eq!(C.get(), (1, 0));
    // SAFETY: the live_objects slot of a live descriptor.
    assert_eq!(unsafe { d.live_objects.unwrap()(d.ctx) }, 0);
    unload(&d);
    assert!(!CELL.is_built());
    assert_eq!(C.get(), (1, 1), "unload frees the implementation");
    for cycle in 2..=5 {
        let d = load(&CELL, init, host(0, 1)).unwrap();
        assert_eq!(C.get(), (cycle, cycle - 1), "a load after unload builds the plugin again");
        unload(&d);
        assert_eq!(C.get(), (cycle, cycle));
    }
}

#[test]
fn each_load_holds_the_plugin_until_its_own_unload() {
    static C: Counters = Counters::new();
    static CELL: PluginCell = PluginCell::new();
    fn init() -> ExportedPlugin {
        build(&C, false)
    }
    let a = load(&CELL, init, host(0, 1)).unwrap();
    let b = load(&CELL, init, host(0, 0)).unwrap();
    assert_eq!(C.get(), (1, 0), "both loads share one instance");
    assert_eq!(a.ctx, b.ctx);
    unload(&a);
    assert_eq!(C.get(), (1, 0), "the second load still holds it");
    assert!(CELL.is_built());
    // SAFETY: still live: `b` holds it.
    assert_eq!(unsafe { b.live_objects.unwrap()(b.ctx) }, 0);
    unload(&b);
    assert_eq!(C.get(), (1, 1));
}

#[test]
fn a_failed_negotiation_holds_nothing() {
    static C: Counters = Counters::new();
    static CELL: PluginCell = PluginCell::new();
    fn init() -> ExportedPlugin {
        build(&C, false)
    }
    // No common minor: built to answer, refused, freed at once.
    assert!(load(&CELL, init, host(MEMPLUG_ABI_MINOR + 1, MEMPLUG_ABI_MINOR + 5)).is_none());
    assert_eq!(C.get(), (1, 1));
    assert!(!CELL.is_built());
    // While a load holds it, a refused negotiation leaves it alone.
    let d = load(&CELL, init, host(0, 1)).unwrap();
    assert!(load(&CELL, init, host(7, 9)).is_none());
    assert_eq!(C.get(), (2, 1));
    unload(&d);
    assert_eq!(C.get(), (2, 2));
}

#[test]
fn an_implementation_handed_out_as_static_is_never_freed() {
    static C: Counters = Counters::new();
    static CELL: PluginCell = PluginCell::new();
    fn init() -> ExportedPlugin {
        build(&C, true)
    }
    let d = load(&CELL, init, host(0, 1)).unwrap();
    unload(&d);
    assert!(!CELL.is_built(), "the descriptors are freed");
    assert_eq!(C.get(), (1, 0), "the &'static implementation stays valid");
}

#[test]
fn a_panicking_init_is_reported_and_retried() {
    static CELL: PluginCell = PluginCell::new();
    static TRIES: AtomicU64 = AtomicU64::new(0);
    static C: Counters = Counters::new();
    fn init() -> ExportedPlugin {
        if TRIES.fetch_add(1, SeqCst) == 0 {
            panic!("first init fails");
        }
        build(&C, false)
    }
    assert!(load(&CELL, init, host(0, 1)).is_none());
    assert!(!CELL.is_built());
    let d = load(&CELL, init, host(0, 1)).unwrap();
    assert_eq!(TRIES.load(SeqCst), 2);
    unload(&d);
    assert_eq!(C.get(), (1, 1));
}

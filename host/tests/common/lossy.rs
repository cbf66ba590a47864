//! "lossy": an in-process test plugin (not a fake of a device: a plain
//! heap allocator) whose controls a test holds, for the lifecycle tests.
//! It can report the loss of its mechanism through the SDK's `HostLink`,
//! answer DEVICE_LOST from a slot without reporting, refuse frees, and hold
//! a thread inside `allocate` until the test lets it go. It counts every
//! slot call, so a test can prove the host stopped calling.
//!
//! One instance per test: each `instance!` line below is an entry with its
//! own plugin cell and its own controls.

#![allow(dead_code)]

use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_sdk::*;
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

pub const MECHANISM_ID: u64 = 41;
const CPU1: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 };

/// What a test controls and observes of one instance.
#[derive(Default)]
pub struct Controls {
    pub link: HostLink,
    /// Slot calls that reached the vendor code.
    pub calls: AtomicU64,
    pub live: AtomicU64,
    /// `deallocate` answers INTERNAL (the host quarantines).
    pub refuse_free: AtomicBool,
    /// The next `allocate` answers DEVICE_LOST (without reporting).
    pub answer_lost: AtomicBool,
    /// `allocate` waits here while set.
    hold: Mutex<bool>,
    held: Condvar,
    /// Threads waiting in `allocate` now.
    pub inside: AtomicU64,
    /// Minor range to speak (default 0..=2).
    pub max_minor: AtomicU64,
}

impl Controls {
    pub fn hold_allocations(&self, on: bool) {
        *self.hold.lock().unwrap() = on;
        self.held.notify_all();
    }
    pub fn report_loss(&self, why: &str) -> LossReport {
        self.link.report_device_lost(MECHANISM_ID, why)
    }
}

static CONTROLS: OnceLock<Mutex<HashMap<&'static str, Arc<Controls>>>> = OnceLock::new();

/// The controls of instance `name` (made on first use).
pub fn controls(name: &'static str) -> Arc<Controls> {
    let map = CONTROLS.get_or_init(Default::default);
    let mut m = map.lock().unwrap();
    m.entry(name)
        .or_insert_with(|| Arc::new(Controls { max_minor: AtomicU64::new(2), ..Default::default() }))
        .clone()
}

struct Lossy {
    c: Arc<Controls>,
    blocks: Mutex<HashMap<u64, Layout>>,
}

impl Allocator for Lossy {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        self.c.calls.fetch_add(1, SeqCst);
        {
            let mut g = self.c.hold.lock().unwrap();
            self.c.inside.fetch_add(1, SeqCst);
            while *g {
                g = self.c.held.wait(g).unwrap();
            }
            self.c.inside.fetch_sub(1, SeqCst);
        }
        if self.c.answer_lost.swap(false, SeqCst) {
            return Err(PluginError::device_lost("the test said the device is gone"));
        }
        let layout = Layout::from_size_align(r.size as usize, r.alignment as usize)
            .map_err(|e| PluginError::invalid_argument(e.to_string()))?;
        // SAFETY: non-zero size (the SDK refuses zero).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(PluginError::out_of_memory("heap exhausted"));
        }
        self.blocks.lock().unwrap().insert(p as u64, layout);
        self.c.live.fetch_add(1, SeqCst);
        Ok(Block { addr: p as u64, size: r.size, handle: p as u64 })
    }
    fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
        self.c.calls.fetch_add(1, SeqCst);
        if self.c.refuse_free.load(SeqCst) {
            return Err(PluginError::internal("the test refuses this free"));
        }
        let layout = self
            .blocks
            .lock()
            .unwrap()
            .remove(&o.handle)
            .ok_or_else(|| PluginError::unknown_allocation("not mine"))?;
        // SAFETY: allocated above with this layout, removed once.
        unsafe { std::alloc::dealloc(o.handle as *mut u8, layout) };
        self.c.live.fetch_sub(1, SeqCst);
        Ok(())
    }
}

pub fn build(name: &'static str) -> ExportedPlugin {
    let c = controls(name);
    let max = c.max_minor.load(SeqCst) as u32;
    let live = c.clone();
    let lossy = Lossy { c: c.clone(), blocks: Mutex::default() };
    PluginBuilder::new(name, "1")
        .minors(0, max)
        .host_link(&c.link)
        .mechanism(MechanismBuilder::new("lossy", MECHANISM_ID, CPU1, lossy).build())
        .live_objects(move || live.live.load(SeqCst))
        .build()
}

/// An instance: `instance!(module, "name")` defines `module::entry`.
#[macro_export]
macro_rules! lossy_instance {
    ($m:ident, $name:literal) => {
        mod $m {
            pub const NAME: &str = $name;
            fn init() -> memplug_sdk::ExportedPlugin {
                super::common::lossy::build($name)
            }
            memplug_sdk::declare_entry!(pub entry, init);
        }
    };
}
